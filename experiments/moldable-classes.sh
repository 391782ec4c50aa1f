#!/usr/bin/env bash
# Moldable jobs of two classes (the paper's §6 water-filling split): P_b and E[D] against n for greedy(p*_j) in
# hard reserves, greedy(p*_j) over a shared pool, and greedy.
#   experiments/moldable-classes.sh [--quick] [--seed S] [--workers W]
# Writes results/moldable_classes.{csv,png,json} and its section of results/README.md (docs/moldable.md).
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" moldable-classes "$@"
