#!/usr/bin/env bash
# Fig. 3 of the paper, in simulation (GBP-CR vs random placements):
# writes results/fig3.{csv,png} and its section of results/README.md.
#   bash experiments/fig3.sh [--quick] [--seed S] [--out DIR]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" fig3 "$@"
