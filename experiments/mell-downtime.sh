#!/usr/bin/env bash
# Mell live: downtime of moving a SmolLM2 session between chains, KV transfer vs token replay, on loopback and
# under a tc tbf cap (root); writes results/mell_downtime.{csv,png,json} and its section of results/README.md.
#   experiments/mell-downtime.sh [--quick] [--seed S]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" mell-downtime "$@"
