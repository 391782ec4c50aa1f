#!/usr/bin/env bash
# Table 1 live on the CPU-emulated testbed: PETALS vs BPRR vs JFFC only vs proposed, replaying the Azure code trace.
#   experiments/table1.sh [--quick] [--requests N] [--load 0.7] [--methods petals,proposed] [--profile F] ...
# Needs root (network namespaces) and the SmolLM2 checkpoint (scripts/prepare_model.sh). Uses the fitted profile
# results/profile/cpu-emulated.json; if it is missing, profiles the testbed first
# (python -m petals_chain.launch.profile, ~8 min). Writes results/table1.{csv,md,png}; --quick takes ~15 min here.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg PYTHONWARNINGS=ignore
testbed="experiments/testbeds/cpu_emulated.yaml"
profile="results/profile/cpu-emulated.json"
prev=""
for a in "$@"; do
  case "$prev" in --testbed) testbed="$a" ;; --profile) profile="$a" ;; esac
  case "$a" in --testbed=*) testbed="${a#*=}" ;; --profile=*) profile="${a#*=}" ;; esac
  prev="$a"
done
# Inputs first (trace, testbed, model): a clear error before anything is started or profiled.
"$PY" -c 'import sys; from petals_chain.experiments.table1 import check_inputs; sys.exit(check_inputs(sys.argv[1:]))' "$@"
if [ ! -f "$profile" ]; then
  echo "[table1] no profile at $profile: profiling the testbed first"
  quick=""; for a in "$@"; do [ "$a" = "--quick" ] && quick="--quick"; done
  "$PY" -m petals_chain.launch.profile "$testbed" $quick --out "$(dirname "$profile")" \
    --stem "$(basename "$profile" .json)"
fi
exec "$PY" -m petals_chain.experiments.table1 "$@"
