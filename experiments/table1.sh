#!/usr/bin/env bash
# Table 1 live on the CPU-emulated testbed in the paper's regime: PETALS vs BPRR vs JFFC only vs the paper's
# composition (at its design rate, c = 35) vs proposed, replaying the Azure code trace.
#   experiments/table1.sh [--quick] [--requests N] [--load 0.25] [--methods petals,proposed] [--testbed T] [--profile F]
#   experiments/table1.sh --regime        # the regime report only: each ratio next to the paper's (no root needed)
#   python -m petals_chain.experiments.table1 --replot [--out DIR] [--stem S]   # redraw the PNGs from saved outputs
# Needs root (network namespaces) and the SmolLM2 checkpoint (scripts/prepare_model.sh). Uses the fitted profile
# results/profile/cpu-emulated-regime.json (testbed experiments/testbeds/cpu_emulated_regime.yaml); if it is missing,
# profiles the testbed first
# (python -m petals_chain.launch.profile_testbed, ~8 min). Writes results/table1.{csv,md,png}; --quick takes ~15 min here.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg PYTHONWARNINGS=ignore
testbed="experiments/testbeds/cpu_emulated_regime.yaml"
profile="results/profile/cpu-emulated-regime.json"
prev=""
for a in "$@"; do
  case "$prev" in --testbed) testbed="$a" ;; --profile) profile="$a" ;; esac
  case "$a" in --testbed=*) testbed="${a#*=}" ;; --profile=*) profile="${a#*=}" ;; esac
  prev="$a"
done
# Inputs first (trace, testbed, model): a clear error before anything is started or profiled.
"$PY" -c 'import sys; from petals_chain.experiments.table1 import check_inputs; sys.exit(check_inputs(sys.argv[1:]))' "$@"
regime=""; for a in "$@"; do [ "$a" = "--regime" ] && regime=1; done
if [ ! -f "$profile" ] && [ -z "$regime" ]; then
  echo "[table1] no profile at $profile: profiling the testbed first"
  quick=""; for a in "$@"; do [ "$a" = "--quick" ] && quick="--quick"; done
  "$PY" -m petals_chain.launch.profile_testbed "$testbed" $quick --out "$(dirname "$profile")" \
    --stem "$(basename "$profile" .json)"
fi
exec "$PY" -m petals_chain.experiments.table1 "$@"
