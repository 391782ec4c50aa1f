#!/usr/bin/env bash
# Fig. 4 of the paper, in simulation (GCA vs c·K(c), ⌈λ/(ρ̄μ₁)⌉ and the optimal ILP):
# writes results/fig4.{csv,png} and its section of results/README.md. Installs the venv first if it is missing.
#   bash experiments/fig4.sh [--quick] [--seed S] [--out DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || bash scripts/install.sh
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
export MPLBACKEND="${MPLBACKEND:-Agg}"
exec "$PY" -m petals_chain.experiments fig4 "$@"
