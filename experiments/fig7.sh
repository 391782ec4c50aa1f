#!/usr/bin/env bash
# Fig. 7 of the paper, in simulation (c* vs λ):
# writes results/fig7.{csv,png} and its section of results/README.md. Installs the venv first if it is missing.
#   bash experiments/fig7.sh [--quick] [--seed S] [--out DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || bash scripts/install.sh
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
export MPLBACKEND="${MPLBACKEND:-Agg}"
exec "$PY" -m petals_chain.experiments fig7 "$@"
