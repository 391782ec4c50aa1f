#!/usr/bin/env bash
# Mell Fig. 15 in simulation: writes results/mell_fig15.{csv,png,json} and its section of results/README.md.
#   experiments/mell-fig15.sh [--quick] [--seed S]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" mell-fig15 "$@"
