#!/usr/bin/env bash
# The PPO policy torta-live's TORTA-PPO uses: trained (seeded, small trunk) on the live demo's three regions and
# arrivals from other seeds (petals_chain/torta/live_demo.py); writes results/torta-train-live3.{csv,png} and
# results/checkpoints/live3-ep120.pt (not committed: this script reproduces it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || bash scripts/install.sh
export MPLBACKEND="${MPLBACKEND:-Agg}"
exec "$PY" -m petals_chain.experiments.torta_train --topology live3 --episodes 120 --seed 1 "$@"
