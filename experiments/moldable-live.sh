#!/usr/bin/env bash
# Moldable jobs on a live swarm: each session's speculative width by greedy(p*) vs fixed k = 1 and fixed k = 8
# (SmolLM2-135M on two loopback servers, emulated RTT).   experiments/moldable-live.sh [--quick] [--seed S]
# Writes results/moldable_live.{csv,png,json}, moldable_live_{speedup,sessions}.csv and its results/README.md section.
exec nice -n 10 bash "$(dirname "${BASH_SOURCE[0]}")/run.sh" moldable-live "$@"
