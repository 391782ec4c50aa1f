#!/usr/bin/env bash
# Fig. 3 of the paper, in simulation (GBP-CR vs random placements):
# writes results/fig3.{csv,png} and its section of results/README.md. Installs the venv first if it is missing.
#   bash experiments/fig3.sh [--quick] [--seed S] [--out DIR]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || bash scripts/install.sh
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
export MPLBACKEND="${MPLBACKEND:-Agg}"
exec "$PY" -m petals_chain.experiments fig3 "$@"
