#!/usr/bin/env bash
# Install if needed, then compose chains for a cluster file (default: the paper's BLOOM-176B cluster).
# Usage: bash scripts/compose.sh [CLUSTER.yaml] [--c N | --tune lower|upper|surrogate] [--json]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh >&2
cluster="${1:-experiments/clusters/paper_default.yaml}"
shift || true
exec .venv/bin/python -m petals_chain compose "$cluster" "$@"
