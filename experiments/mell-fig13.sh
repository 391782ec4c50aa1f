#!/usr/bin/env bash
# Mell Fig. 13 in simulation: writes results/mell_fig13.{csv,png,json} and its section of results/README.md.
#   experiments/mell-fig13.sh [--quick] [--seed S]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" mell-fig13 "$@"
