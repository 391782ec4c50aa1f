#!/usr/bin/env bash
# Run one simulated experiment by name, as every experiments/NAME.sh does: installs the venv first if it is missing,
# then `python -m petals_chain.experiments NAME [--quick] [--seed S] [--out DIR] [--data-dir DIR]`, which writes
# results/NAME.{csv,png,json} and its section of results/README.md.
#   bash experiments/run.sh NAME [options]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || bash scripts/install.sh
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TRANSFORMERS_OFFLINE="${TRANSFORMERS_OFFLINE:-1}"
export MPLBACKEND="${MPLBACKEND:-Agg}"
exec "$PY" -m petals_chain.experiments "$@"
