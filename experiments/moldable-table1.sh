#!/usr/bin/env bash
# Moldable jobs, the paper's Table 1 (greedy(p*) at n = 4000, 24 cells).
#   experiments/moldable-table1.sh [--quick] [--seed S] [--workers W]
# Writes results/moldable_table1.{csv,png,json} and its section of results/README.md (docs/moldable.md).
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" moldable-table1 "$@"
