#!/usr/bin/env bash
# Mell Fig. 6 in simulation: writes results/mell_fig6.{csv,png,json} and its section of results/README.md.
#   experiments/mell-fig6.sh [--quick] [--seed S]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" mell-fig6 "$@"
