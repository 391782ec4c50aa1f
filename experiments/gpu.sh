#!/usr/bin/env bash
# Validate the τp model, the memory sizing and the MIG detection on this machine's GPU (issue 14).
# Needs python3 with torch (CUDA), numpy and matplotlib; numpy and pyyaml for the MIG check. No petals, no network.
# Read-only towards the GPU's settings: MIG is only listed, never enabled or changed.
#
# usage: experiments/gpu.sh [OUTDIR] [--smoke|--quick]
#   OUTDIR   default results/gpu
#   --smoke  real shapes, small grid (about a minute on an H100); --quick: tiny shapes, runs on a CPU
# Full run: about 6 minutes on one H100 (timings ~4.5 min, memory ~40 s, MIG and plots seconds).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../results/gpu}
mode=${2:-}
py=${PYTHON:-python3}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
grid=full
mem_args=()
case "$mode" in
    --smoke) grid=smoke; mem_args=(--ks 1,8 --cs 1,4) ;;
    --quick) grid=quick; mem_args=(--quick) ;;
    "") ;;
    *) echo "unknown option $mode" >&2; exit 2 ;;
esac
bash "$here/gpu/mig_readonly.sh" "$out"
"$py" "$here/gpu/memory_sizing.py" --out "$out" "${mem_args[@]}" 2>&1 | tee "$out/memory.log"
sampler=""
if command -v nvidia-smi >/dev/null; then  # clocks, power and temperature once a second while the timings run
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,memory.used \
        --format=csv -l 1 >"$out/clocks.csv" 2>&1 &
    sampler=$!
fi
"$py" "$here/gpu/measure_tau.py" --out "$out" --grid "$grid" ${TAU_BUDGET_S:+--budget-s "$TAU_BUDGET_S"} 2>&1 \
    | tee "$out/tau.log"
if [ -n "$sampler" ]; then kill "$sampler" 2>/dev/null || true; fi
"$py" "$here/gpu/fit_and_plot.py" --dir "$out" 2>&1 | tee "$out/fit.log"
