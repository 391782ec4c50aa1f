#!/usr/bin/env bash
# Moldable jobs, the paper's Table 1 (greedy(p*) at n = 4000, 24 cells).
#   experiments/moldable-table1.sh [--quick] [--seed S] [--workers W]
# Writes results/moldable_table1.{csv,png,json} and its section of results/README.md (docs/moldable.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export MPLBACKEND=Agg PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-$ROOT/.venv/bin/python}" -m petals_chain.experiments moldable-table1 "$@"
