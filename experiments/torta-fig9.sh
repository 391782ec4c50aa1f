#!/usr/bin/env bash
# TORTA Fig 9: pass --quick for the minutes-long version, --seed S to change the seed.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python -m petals_chain.experiments torta-fig9 "$@"
