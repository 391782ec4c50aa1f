#!/usr/bin/env bash
# Fig. 8 of the paper, in simulation (proposed vs PETALS vs BPRR vs JFFC only over J × η):
# writes results/fig8.{csv,png} and its section of results/README.md.
#   bash experiments/fig8.sh [--quick] [--seed S] [--out DIR]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" fig8 "$@"
