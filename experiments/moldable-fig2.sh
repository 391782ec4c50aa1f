#!/usr/bin/env bash
# Moldable jobs, the paper's Fig. 2 (P_b and E[D] against n, greedy(p*) vs greedy).
#   experiments/moldable-fig2.sh [--quick] [--seed S] [--workers W]
# Writes results/moldable_fig2.{csv,png,json} and its section of results/README.md (docs/moldable.md).
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" moldable-fig2 "$@"
