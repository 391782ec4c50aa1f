#!/usr/bin/env bash
# Validate the τp model, the memory sizing and the MIG detection on this machine's GPU (issue 14).
# Needs python3 with torch (CUDA), numpy and matplotlib; numpy and pyyaml for the MIG check. No petals, no network.
# Read-only towards the GPU's settings: MIG is only listed, never enabled or changed.
#
# usage: experiments/gpu.sh [OUTDIR] [--smoke|--quick]
#   OUTDIR   default results/gpu
#   --smoke  real shapes, small grid (about a minute on an H100); --quick: tiny shapes, runs on a CPU
# Full run: about 4 minutes on one H100 (memory ~40 s, timings ~3.5 min, eager vs CUDA graph ~30 s, MIG and
# plots seconds). Set TAU_BUDGET_S to cap the timings (seconds; what is done by then is kept).
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
if [ "$grid" = full ]; then  # 32 blocks eager vs replayed from CUDA graphs (launch overhead), without the sampler
    "$py" "$here/gpu/measure_tau.py" --out "$out/graphs" --grid graphs 2>&1 | tee "$out/graphs.log"
    cp "$out/graphs/tau_raw.json" "$out/tau_graphs_raw.json"
    rm -r "$out/graphs"
fi
"$py" "$here/gpu/fit_and_plot.py" --dir "$out" 2>&1 | tee "$out/fit.log"
