#!/usr/bin/env bash
# Fig. 7 of the paper, in simulation (c* vs λ):
# writes results/fig7.{csv,png} and its section of results/README.md.
#   bash experiments/fig7.sh [--quick] [--seed S] [--out DIR]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" fig7 "$@"
