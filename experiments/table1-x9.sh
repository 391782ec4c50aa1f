#!/usr/bin/env bash
# Table 1 on the testbed whose τc/(τp·L) is the paper's (experiments/testbeds/cpu_emulated_regime_x9.yaml: 9 × the
# RIPE RTTs) at load 0.1, so that the trace's burst (about 8 × its mean rate) stays below capacity as on the paper's
# testbed; 40 requests per method, all five methods in about an hour. Profiles the 9 servers first (three groups
# of 3, quick grid, ~8 min) if results/profile/cpu-emulated-regime-x9.json is missing. Extra arguments go to
# experiments/table1.sh (e.g. --resume, --methods paper,proposed). Needs root and scripts/prepare_model.sh.
# This is the unbatched reference: its servers run PETALS' one-session-at-a-time pool (--max-batch-sessions 1, and
# the profile --unbatched), as every run before batching; experiments/table1-x9-batched.sh is the batched one.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
TB=experiments/testbeds/cpu_emulated_regime_x9.yaml
PROFILE=results/profile/cpu-emulated-regime-x9.json
if [ ! -f "$PROFILE" ]; then
  parts="$(mktemp -d)"
  "$PY" -m petals_chain.launch.profile_testbed "$TB" --servers s0,s3,s4 --quick --unbatched --capacity-s 60 --out "$parts" --stem g0
  "$PY" -m petals_chain.launch.profile_testbed "$TB" --servers s1,s5,s6 --quick --unbatched --no-capacity --out "$parts" --stem g1
  "$PY" -m petals_chain.launch.profile_testbed "$TB" --servers s2,s7,s8 --quick --unbatched --no-capacity --out "$parts" --stem g2
  "$PY" -m petals_chain.launch.profile_merge "$TB" "$parts/g0" "$parts/g1" "$parts/g2" --stem cpu-emulated-regime-x9
fi
exec experiments/table1.sh --testbed "$TB" --profile "$PROFILE" --load 0.1 --requests 40 --out results/table1-x9 \
  --max-batch-sessions 1 "$@"
