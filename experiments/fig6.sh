#!/usr/bin/env bash
# Fig. 6 of the paper, in simulation (mean response time vs c):
# writes results/fig6.{csv,png} and its section of results/README.md.
#   bash experiments/fig6.sh [--quick] [--seed S] [--out DIR]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" fig6 "$@"
