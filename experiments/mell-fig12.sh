#!/usr/bin/env bash
# Mell Fig. 12 in simulation: writes results/mell_fig12.{csv,png,json} and its section of results/README.md.
#   experiments/mell-fig12.sh [--quick] [--seed S]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" mell-fig12 "$@"
