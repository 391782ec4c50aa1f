#!/usr/bin/env bash
# Record what nvidia-smi prints about the GPUs and MIG, READ-ONLY, then run the launcher's MIG detection and plan
# (experiments/gpu/mig_check.py) against it. Nothing here changes the GPU: no -mig, -cgi/-cci, -dgi/-dci, -r,
# -pm, -pl, -ac, -lgc or -c; only listing and query commands.
#
# usage: experiments/gpu/mig_readonly.sh OUTDIR
# writes OUTDIR/nvidia_smi/<name>.out, <name>.err, <name>.rc for each command, OUTDIR/nvidia_smi/commands.tsv
# (name, exit status, exact command) and OUTDIR/mig_check.json / mig_check.log.
set -u
out=${1:?usage: mig_readonly.sh OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
mkdir -p "$out/nvidia_smi"
index="$out/nvidia_smi/commands.tsv"
: >"$index"

record() {  # record NAME ARGS...: run nvidia-smi ARGS, keep stdout, stderr and the exit status
    local name=$1
    shift
    nvidia-smi "$@" >"$out/nvidia_smi/$name.out" 2>"$out/nvidia_smi/$name.err"
    local rc=$?
    echo "$rc" >"$out/nvidia_smi/$name.rc"
    printf '%s\t%s\tnvidia-smi %s\n' "$name" "$rc" "$*" >>"$index"
    printf '%-22s exit %-3s nvidia-smi %s\n' "$name" "$rc" "$*"
}

if ! command -v nvidia-smi >/dev/null; then
    echo "nvidia-smi not found on PATH" | tee "$out/nvidia_smi/absent.txt"
else
    record version --version
    record plain
    record L -L
    record query_gpu "--query-gpu=index,uuid,name,memory.total,mig.mode.current" --format=csv,noheader
    record query_gpu_header "--query-gpu=index,uuid,name,memory.total,mig.mode.current" --format=csv
    record query_more "--query-gpu=index,name,pci.bus_id,driver_version,vbios_version,memory.total,memory.used,mig.mode.current,mig.mode.pending,clocks.max.sm,clocks.max.memory,power.limit,persistence_mode,compute_mode" --format=csv
    record query_mode "--query-gpu=index,mig.mode.current,mig.mode.pending" --format=csv,noheader
    record query_virt "--query-gpu=index,virtualization_mode,addressing_mode" --format=csv
    record q -q
    record lgip mig -lgip
    record lgip_i0 mig -i 0 -lgip
    record lgipp mig -lgipp
    record lgipp_i0 mig -i 0 -lgipp
    record lgi mig -lgi
    record lgi_i0 mig -i 0 -lgi
    record lci mig -lci
    record lci_i0 mig -i 0 -lci
    record lcip mig -lcip
    record mig_help mig -h
    record help_query_gpu --help-query-gpu
fi

cd "$repo" || exit 1
"${PYTHON:-python3}" "$here/mig_check.py" --raw "$out/nvidia_smi" --json "$out/mig_check.json" 2>&1 | tee "$out/mig_check.log"
exit 0
