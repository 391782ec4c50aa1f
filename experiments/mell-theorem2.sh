#!/usr/bin/env bash
# Mell's Theorem 2 against the exact optimum: writes results/mell_theorem2.{csv,png,json} and its section of
# results/README.md.
#   experiments/mell-theorem2.sh [--quick] [--seed S]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" mell-theorem2 "$@"
