#!/usr/bin/env bash
# Mell Fig. 11 in simulation: writes results/mell_fig11.{csv,png,json} and its section of results/README.md.
#   experiments/mell-fig11.sh [--quick] [--seed S]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" mell-fig11 "$@"
