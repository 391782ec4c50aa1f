#!/usr/bin/env bash
# Fig. 11 of the paper (the Azure code trace vs Poisson arrivals and exponential service; needs $PETALS_CHAIN_DATA or --data-dir):
# writes results/fig11.{csv,png} and its section of results/README.md.
#   bash experiments/fig11.sh [--quick] [--seed S] [--out DIR]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" fig11 "$@"
