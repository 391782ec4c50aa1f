#!/usr/bin/env bash
# Mell Fig. 11 in simulation: writes results/mell_fig11.{csv,png,json} and its section of results/README.md.
#   experiments/mell-fig11.sh [--quick] [--seed S]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export MPLBACKEND=Agg
exec "${PYTHON:-$ROOT/.venv/bin/python}" -m petals_chain.experiments mell-fig11 "$@"
