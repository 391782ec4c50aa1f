#!/usr/bin/env bash
# The live demo: installs if needed, prepares SmolLM2-135M-Instruct, starts an orchestrated PETALS swarm on loopback
# (orchestrator + DHT + 4 servers with different memory budgets), sends a burst of concurrent prompts through
# JFFC-leased chains, prints each answer with its waiting/service time and chain plus the composition, writes
# runs/demo-<UTC time>/{demo_requests.csv,demo_summary.json,demo_timeline.png,logs/} (git-ignored, so the tree
# stays clean), and stops every process group it started.
# Usage: bash scripts/demo.sh [--quick] [--servers s1=600MB,s2=350MB,...] [--prompts N] [--max-new-tokens N]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/install.sh
MODEL_DIR="$(bash scripts/prepare_model.sh)"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg PYTHONWARNINGS=ignore
# The Python launcher owns the swarm: each process in its own session (setsid), torn down by process group in a
# finally block, also on Ctrl-C. exec keeps Ctrl-C going straight to it.
exec "$ROOT/.venv/bin/python" -m petals_chain.loopback.demo --model-dir "$MODEL_DIR" "$@"
