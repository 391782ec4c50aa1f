#!/usr/bin/env bash
# Fig. 9 of the paper, from the emulated testbed's committed profile (results/profile/cpu-emulated-regime-full*):
# writes results/fig9.{csv,png} and its section of results/README.md.
#   bash experiments/fig9.sh [--quick] [--seed S] [--out DIR]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" fig9 "$@"
