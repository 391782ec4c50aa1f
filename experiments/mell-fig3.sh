#!/usr/bin/env bash
# Mell's Fig. 3 redrawn from the committed H200 measurement (results/gpu-batched/batched.csv; nothing simulated):
# writes results/mell_fig3.{png,json} and its section of results/README.md.
#   experiments/mell-fig3.sh
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" mell-fig3 "$@"
