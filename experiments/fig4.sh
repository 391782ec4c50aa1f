#!/usr/bin/env bash
# Fig. 4 of the paper, in simulation (GCA vs c·K(c), ⌈λ/(ρ̄μ₁)⌉ and the optimal ILP):
# writes results/fig4.{csv,png} and its section of results/README.md.
#   bash experiments/fig4.sh [--quick] [--seed S] [--out DIR]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" fig4 "$@"
