"""Memory sizing on one GPU: does k blocks + a static KV cache for c sessions take s_m·k + s_c·k·c?

For each (k blocks, c sessions) this allocates k LLaMA-2-7B-shaped blocks and, per block, a static
K/V cache of c sessions × T tokens (T = 2048 by default), then runs a prefill of l_in tokens for all c
sessions and one decode step, and records what PyTorch and the driver report:

* ``static_allocated``: torch.cuda.memory_allocated() with weights and caches in place (what the
  sizing formula s_m·k + s_c·slots describes, slots = k·c block-jobs), counted above the cuBLAS workspace
  (allocated at the first matrix product, recorded as ``cublas_workspace_bytes``);
* ``peak_prefill`` / ``peak_decode``: torch.cuda.max_memory_allocated() during a prefill of l_in tokens
  and during one decode step (activations and library workspaces on top);
* ``reserved_peak``: the caching allocator's peak reservation;
* ``device_used``: memory.used of the GPU as the driver reports it (torch.cuda.mem_get_info), which adds the
  CUDA context and anything outside PyTorch's allocator; ``device_used_before_torch`` is nvidia-smi's
  reading before this process touched the GPU.

Writes ``memory_raw.json`` and ``memory.csv`` into --out. ``--quick`` runs tiny shapes (CPU: only the
static part can be checked there, by counting tensor bytes).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from llama_block import LLAMA2_7B, TINY, Block, dtype_of, kv_cache, rope_tables, run_blocks

S_M_REPO_GB = 0.405  # the repo's LLaMA-2-7B block_gb (fp16 weights of one block)


def smi_used_mib() -> float | None:
    """nvidia-smi's memory.used of GPU 0 in MiB (None without nvidia-smi)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                             capture_output=True, text=True, timeout=60)
        return float(out.stdout.strip().splitlines()[0]) if out.returncode == 0 else None
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="tiny shapes and grid (CPU is fine)")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None)
    ap.add_argument("--tokens", type=int, default=2048, help="cache length T per session (default 2048)")
    ap.add_argument("--ks", default="1,4,8,16,32", help="block counts k")
    ap.add_argument("--cs", default="1,4,16", help="session counts c")
    ap.add_argument("--lins", default="512,2047", help="prefill lengths (≤ T−1: one decode step follows)")
    args = ap.parse_args(argv)
    before = smi_used_mib()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.type == "cuda"
    dtype = dtype_of(args.dtype or ("bf16" if cuda else "fp32"))
    shape = TINY if args.quick else LLAMA2_7B
    ks = [1, 2] if args.quick else [int(x) for x in args.ks.split(",")]
    cs = [1, 2] if args.quick else [int(x) for x in args.cs.split(",")]
    tokens = 64 if args.quick else args.tokens
    lins = [16, 63] if args.quick else [int(x) for x in args.lins.split(",")]
    esize = torch.empty((), dtype=dtype).element_size()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    raw: dict = {"dtype": str(dtype).removeprefix("torch."), "tokens_per_session": tokens, "device_type": device.type,
                 "device_used_before_torch_mib": before, "rows": []}
    if cuda:
        torch.cuda.init()
        torch.zeros(1, device=device)
        free, total = torch.cuda.mem_get_info()
        raw.update(total_bytes=total, device_used_after_context_bytes=total - free,
                   name=torch.cuda.get_device_name(device))
    probe = Block(shape, dtype, "cpu" if cuda else device, seed=0)
    s_m = probe.nbytes
    del probe
    s_c = shape.cache_bytes(tokens, esize)
    raw.update(s_m_bytes=s_m, s_c_bytes=s_c, s_m_repo_bytes=S_M_REPO_GB * 1e9)
    print(f"s_m = {s_m} B ({s_m / 1e9:.4f} GB; repo {S_M_REPO_GB} GB), s_c = {s_c} B for {tokens} tokens "
          f"({s_c / 2**20:.1f} MiB)", flush=True)
    cos, sin = rope_tables(shape, tokens, dtype, device)
    before = torch.cuda.memory_allocated() if cuda else 0
    F.linear(torch.ones(8, 8, device=device, dtype=dtype), torch.ones(8, 8, device=device, dtype=dtype))
    base = torch.cuda.memory_allocated() if cuda else 0  # the cuBLAS workspace is allocated at the first product
    raw["cublas_workspace_bytes"] = base - before

    def attention():  # FlashAttention as in measure_tau.py (a fresh context manager for each use)
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]) if cuda else nullcontext()

    for k in ks:
        for c in cs:
            t0 = time.perf_counter()
            if cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            blocks = [Block(shape, dtype, device, seed=i) for i in range(k)]
            caches = [kv_cache(shape, c, tokens, dtype, device) for _ in range(k)]
            if cuda:  # drop the fp32 temporaries of the random initialisation (not part of a server's footprint)
                torch.cuda.empty_cache()
            counted = sum(b.nbytes for b in blocks) + sum(t.numel() * t.element_size() for kv in caches for t in kv)
            row = {"k": k, "c": c, "slots": k * c, "predicted_bytes": k * s_m + k * c * s_c,
                   "predicted_repo_s_m_bytes": k * S_M_REPO_GB * 1e9 + k * c * s_c, "tensor_bytes": counted}
            if cuda:
                torch.cuda.synchronize()
                row["static_allocated"] = torch.cuda.memory_allocated() - base
                row["static_reserved"] = torch.cuda.memory_reserved()
                free, total = torch.cuda.mem_get_info()
                row["device_used_static"] = total - free
            with torch.inference_mode(), attention():
                for lin in lins:
                    if cuda:
                        torch.cuda.reset_peak_memory_stats()
                    x = torch.randn(c, lin, shape.hidden, device=device, dtype=dtype)
                    run_blocks(blocks, caches, x, 0, cos, sin)
                    if cuda:
                        torch.cuda.synchronize()
                        row[f"peak_prefill_{lin}"] = torch.cuda.max_memory_allocated() - base
                        torch.cuda.reset_peak_memory_stats()
                    x = torch.randn(c, 1, shape.hidden, device=device, dtype=dtype)
                    run_blocks(blocks, caches, x, lin, cos, sin)
                    if cuda:
                        torch.cuda.synchronize()
                        row[f"peak_decode_{lin}"] = torch.cuda.max_memory_allocated() - base
                    del x
            if cuda:
                row["reserved_peak"] = torch.cuda.max_memory_reserved()
                free, total = torch.cuda.mem_get_info()
                row["device_used_after"] = total - free
                row["smi_used_after_mib"] = smi_used_mib()
            row["seconds"] = time.perf_counter() - t0
            raw["rows"].append(row)
            pred = row["predicted_bytes"]
            got = row.get("static_allocated", counted)
            print(f"k={k:2d} c={c:2d}: predicted {pred / 2**30:7.3f} GiB, allocated {got / 2**30:7.3f} GiB "
                  f"({(got - pred) / pred:+.4%}); peaks " + ", ".join(
                      f"{key.removeprefix('peak_')} +{(row[key] - got) / 2**30:.3f}" for key in row
                      if key.startswith("peak_")) + " GiB; device used "
                  f"{row.get('device_used_after', 0) / 2**30:.2f} GiB", flush=True)
            del blocks, caches
            (out / "memory_raw.json").write_text(json.dumps(raw, indent=1))
    keys = sorted({key for r in raw["rows"] for key in r}, key=lambda s: (s not in ("k", "c", "slots"), s))
    with open(out / "memory.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(raw["rows"])
    (out / "memory_raw.json").write_text(json.dumps(raw, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
