#!/usr/bin/env bash
# Mell Fig. 14 in simulation: writes results/mell_fig14.{csv,png,json} and its section of results/README.md.
#   experiments/mell-fig14.sh [--quick] [--seed S]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" mell-fig14 "$@"
