#!/usr/bin/env bash
# Consolidation by Mell on a live loopback swarm (SmolLM2-135M, three whole-model servers): server-seconds used
# against worst fit on the same arrivals, every output identical; writes results/mell-consolidate.{csv,png,json}
# and its section of results/README.md.
#   bash experiments/mell-consolidate.sh [--quick] [--seed S] [--out DIR]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" mell-consolidate "$@"
