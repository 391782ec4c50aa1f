#!/usr/bin/env bash
# Fig. 5 of the paper, in simulation (JFFC vs JSQ / SA-JSQ / SED / JIQ and the Theorem 3.7 bounds):
# writes results/fig5.{csv,png} and its section of results/README.md.
#   bash experiments/fig5.sh [--quick] [--seed S] [--out DIR]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" fig5 "$@"
