#!/usr/bin/env bash
# Table 1 in the paper's own regime (issue 40): nine servers that keep an A100 MIG slice's time (3g.40gb / 2g.20gb,
# LLaMA-2-7B, petals_chain.device_profile) replay the first 1000 rows of the Azure code trace at native timestamps
# with full token counts; every duration dilated by k (the testbed file's, or --time-dilation K). Seven
# configurations (PETALS, BPRR, JFFC only, paper, proposed on batching servers; paper and proposed on one-at-a-time
# servers), --replays rounds interleaved, resumable: rerun to go on. --budget-min M stops before a replay that would
# start after M minutes. --preflight prints slots vs offered concurrency and tau_p(b) per server; --report aggregates
# results/table1-emulated/ (table, figure, paired intervals). Needs root and scripts/prepare_model.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg PYTHONWARNINGS=ignore
"$PY" -m petals_chain.checkpoint.tiny_llama "$ROOT/.cache/models/tiny-llama-32x16" >/dev/null  # idempotent
exec "$PY" -m petals_chain.experiments.table1_emulated "$@"
