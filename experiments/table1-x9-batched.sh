#!/usr/bin/env bash
# Table 1 in the paper's regime (experiments/table1-x9.sh's testbed, load and trace) on servers that batch their
# sessions' steps (the default since issue 22), at least 100 requests per method, resumable: rerun with --resume to
# go on where a session stopped. Profiles the 9 batching servers first, with the batch probe that measures
# tau_p(b) inside each server (three groups of 3, quick grid), if results/profile/cpu-emulated-regime-x9-batched.json
# is missing. The unbatched run stays in results/table1-x9 (experiments/table1-x9.sh --max-batch-sessions 1
# reproduces it). Extra arguments go to experiments/table1.sh. Needs root and scripts/prepare_model.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
TB=experiments/testbeds/cpu_emulated_regime_x9.yaml
PROFILE=results/profile/cpu-emulated-regime-x9-batched.json
if [ ! -f "$PROFILE" ]; then
  parts="results/profile/x9-batched-parts"
  mkdir -p "$parts"
  [ -f "$parts/g0.json" ] || "$PY" -m petals_chain.launch.profile_testbed "$TB" --servers s0,s3,s4 --quick \
    --capacity-s 60 --out "$parts" --stem g0
  [ -f "$parts/g1.json" ] || "$PY" -m petals_chain.launch.profile_testbed "$TB" --servers s1,s5,s6 --quick \
    --no-capacity --out "$parts" --stem g1
  [ -f "$parts/g2.json" ] || "$PY" -m petals_chain.launch.profile_testbed "$TB" --servers s2,s7,s8 --quick \
    --no-capacity --out "$parts" --stem g2
  "$PY" -m petals_chain.launch.profile_merge "$TB" "$parts/g0" "$parts/g1" "$parts/g2" \
    --stem cpu-emulated-regime-x9-batched
fi
exec experiments/table1.sh --testbed "$TB" --profile "$PROFILE" --load 0.1 --requests 100 \
  --out results/table1-x9-batched "$@"
