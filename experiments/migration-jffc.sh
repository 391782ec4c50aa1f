#!/usr/bin/env bash
# JFFC with live session migration on a loopback swarm (SmolLM2-135M; a fast server and one at a tenth of the
# speed): mean response time against plain JFFC on the same arrivals and against the Theorem 3.7 lower bound for
# the measured chains; writes results/migration-jffc.{csv,png,json} and its section of results/README.md.
#   bash experiments/migration-jffc.sh [--quick] [--seed S] [--out DIR]
exec bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" migration-jffc "$@"
