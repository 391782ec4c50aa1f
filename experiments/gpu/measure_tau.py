"""Measure τp on one GPU: prefill time vs input length and decode time per token vs output length.

A stack of LLaMA-2-7B-shaped blocks (llama_block.py, random bf16 weights) with a static KV cache for up
to c_max sessions is timed the way a PETALS server runs it (eager PyTorch, one forward per step):

* prefill: m blocks × c sessions × l_in tokens, from position 0 (median of repeats, CUDA events);
* decode: after a prefill of l_in tokens, l_out single-token steps through m blocks for c sessions
  batched together, each step timed by CUDA events (the time of every step is kept, so decode time
  vs output length and step time vs context length both come out of one run);
* the same decode step captured in a CUDA graph (launch overhead removed), for comparison;
* the two ceilings of the chip: an 8192³ bf16 matrix product and a large device-to-device copy;
* decode steps at context lengths never seen before, per attention (SDPA) backend: PyTorch's default choice
  pays a one-off cost per new (sessions, context length) shape, so the timings pin FlashAttention (--sdpa).

Writes ``tau_raw.json`` (everything, incrementally) and ``tau_prefill.csv`` / ``tau_decode.csv`` into --out.
``--grid quick`` is a tiny CPU-runnable version; ``--grid smoke`` the real shapes on a small grid.
Fit and plots: fit_and_plot.py. No petals, no transformers: torch and numpy only.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from llama_block import LLAMA2_7B, TINY, Block, dtype_of, kv_cache, rope_tables, run_blocks

GRIDS = {
    # blocks in the pool; m, c and l_in of the prefill grid; cache length; decode runs (l_in, [(c, m, steps)]);
    # CUDA-graph comparisons (c, m, context); whether to measure the chip's ceilings and probe the SDPA backends
    "quick": dict(shape=TINY, pool=4, ms=[1, 2, 4], cs=[1, 2], lins=[16, 32, 64], max_tokens=128,
                  decode=(16, [(1, 1, 24), (1, 2, 24), (1, 4, 24), (2, 1, 24), (2, 4, 24)]), graph=[],
                  ceilings=False, backends=False),
    "smoke": dict(shape=LLAMA2_7B, pool=8, ms=[1, 4, 8], cs=[1, 4], lins=[128, 1024], max_tokens=2048,
                  decode=(128, [(1, 1, 64), (1, 8, 64), (4, 8, 64)]), graph=[(1, 8, 256)], ceilings=True,
                  backends=True),
    "full": dict(shape=LLAMA2_7B, pool=32, ms=[1, 2, 4, 8, 16, 32], cs=[1, 2, 4, 8, 16],
                 lins=[128, 256, 512, 1024, 2048, 4096], max_tokens=4096,
                 decode=(128, [(1, 1, 2048), (1, 8, 2048), (1, 32, 2048), (1, 2, 512), (1, 4, 512), (1, 16, 512)]
                         + [(c, m, 1024) for c in (2, 4, 8, 16) for m in (1, 32)]),
                 graph=[(1, 1, 1024), (1, 8, 1024), (1, 32, 1024), (16, 32, 1024)], ceilings=True, backends=True),
    # eager vs CUDA graph for 32 blocks: decode steps at several contexts and sessions, prefills of several lengths
    # (graph entries (c, m, context) are decode steps; (c, m, 0, n) a prefill of n tokens)
    "graphs": dict(shape=LLAMA2_7B, pool=32, ms=[], cs=[], lins=[], max_tokens=4096, decode=(128, []),
                   graph=[(c, 32, ctx) for c in (1, 4, 16) for ctx in (128, 512, 1024, 2048, 4000)]
                   + [(1, 32, 0, n) for n in (128, 256, 512, 1024, 2048, 4096)] + [(4, 32, 0, 1024)],
                   ceilings=True, backends=False),
}
# Attention kernels: the timings use FlashAttention (one kernel for any context length). PyTorch's own choice was
# seen to cost ~40 ms per decode step whenever a (sessions, context length) shape is new; backend_probe records it.
BACKENDS = {"flash": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION],
            "efficient": [SDPBackend.EFFICIENT_ATTENTION], "cudnn": [SDPBackend.CUDNN_ATTENTION],
            "math": [SDPBackend.MATH], "default": None}


class Clock:
    """CUDA events on a GPU, perf_counter on a CPU."""

    def __init__(self, device: torch.device) -> None:
        """Time work on ``device``."""
        self.cuda = device.type == "cuda"

    def mark(self):
        """A point in the device's stream."""
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def between(self, a, b) -> float:
        """Seconds from mark a to mark b (after the device reached b)."""
        if self.cuda:
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        return b - a

    def sync(self) -> None:
        """Wait for the device."""
        if self.cuda:
            torch.cuda.synchronize()


def timed(clock: Clock, fn, *, warm: int, reps: int) -> list[float]:
    """Run fn warm times, then reps timed times; the seconds of each timed run."""
    for _ in range(warm):
        fn()
    clock.sync()
    out = []
    for _ in range(reps):
        a = clock.mark()
        fn()
        b = clock.mark()
        out.append(clock.between(a, b))
    return out


def self_check(shape, dtype, device) -> dict:
    """Prefill n tokens = prefill n−1 then decode the last one (same output, relative error); NaN never passes."""
    torch.manual_seed(0)
    n, t = 33, 64
    blocks = [Block(shape, dtype, device, seed=100 + i) for i in range(2)]
    caches = [kv_cache(shape, 2, t, dtype, device) for _ in blocks]
    cos, sin = rope_tables(shape, t, dtype, device)
    x = torch.randn(2, n, shape.hidden, device=device, dtype=dtype)
    with torch.inference_mode():
        full = run_blocks(blocks, caches, x, 0, cos, sin)[:, -1].float()
        run_blocks(blocks, caches, x[:, :-1], 0, cos, sin)
        step = run_blocks(blocks, caches, x[:, -1:], n - 1, cos, sin)[:, 0].float()
    err = float((step - full).norm() / full.norm())
    ok = bool(torch.isfinite(step).all()) and err < (1e-4 if dtype == torch.float32 else 3e-2)
    return {"relative_error": err, "ok": ok}


def ceilings(device, dtype) -> dict:
    """Measured ceilings: an 8192³ matrix product (TFLOP/s) and a device-to-device copy (bytes read + written)."""
    clock = Clock(device)
    n = 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    ts = timed(clock, functools.partial(torch.matmul, a, b), warm=3, reps=10)
    gemm = 2 * n ** 3 / statistics.median(ts)
    del a, b
    src = torch.randn(2 ** 30, device=device, dtype=torch.float32)  # 4 GiB
    dst = torch.empty_like(src)
    ts = timed(clock, functools.partial(dst.copy_, src), warm=2, reps=10)
    copy = 2 * src.numel() * 4 / statistics.median(ts)
    del src, dst
    torch.cuda.empty_cache()
    return {"gemm_8192_tflops": gemm / 1e12, "copy_read_plus_write_gb_per_s": copy / 1e9}


def gpu_info(device) -> dict:
    """What PyTorch says about the device and the software."""
    info = {"torch": torch.__version__, "python": platform.python_version(), "device_type": device.type}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update(name=p.name, total_memory_bytes=p.total_memory, multiprocessors=p.multi_processor_count,
                    capability=f"{p.major}.{p.minor}", cuda=torch.version.cuda,
                    l2_cache_bytes=getattr(p, "L2_cache_size", None))
    return info


def backend_context(name: str, device: torch.device):
    """sdpa_kernel(...) for a named backend set (nothing for 'default' or on a CPU)."""
    chosen = BACKENDS[name] if device.type == "cuda" else None
    return sdpa_kernel(chosen) if chosen else contextlib.nullcontext()


def graph_section(grid, device, clock, blocks, caches, xs, cos, sin, raw, over_budget, save) -> None:
    """One decode step of m blocks at a fixed context, eager and replayed from a CUDA graph."""
    for entry in grid["graph"] if device.type == "cuda" else []:
        c, m, ctx, n = (*entry, 1) if len(entry) == 3 else entry
        if over_budget(f"graph m={m} c={c} context={ctx} tokens={n}"):
            continue
        reps = 50 if n == 1 else 10
        try:
            x = xs[0, :c].clone() if n == 1 else torch.randn(c, n, xs.shape[-1], device=xs.device, dtype=xs.dtype)
            eager = timed(clock, lambda: run_blocks(blocks[:m], caches, x, ctx, cos, sin), warm=3, reps=reps)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    run_blocks(blocks[:m], caches, x, ctx, cos, sin)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                run_blocks(blocks[:m], caches, x, ctx, cos, sin)
            graph = timed(clock, g.replay, warm=3, reps=reps)
            raw["graph"].append({"m": m, "c": c, "context": ctx, "tokens": n,
                                 "eager_median_s": statistics.median(eager), "graph_median_s": statistics.median(graph),
                                 "eager_s": eager, "graph_s": graph})
            what = f"decode step ctx={ctx}" if n == 1 else f"prefill of {n} tokens"
            print(f"{what} c={c} m={m}: eager {statistics.median(eager) * 1e3:.3f} ms, "
                  f"CUDA graph {statistics.median(graph) * 1e3:.3f} ms", flush=True)
            del g
        except Exception as err:  # a graph capture problem must not lose the rest
            raw["graph"].append({"m": m, "c": c, "context": ctx, "error": repr(err)})
            print(f"graph m={m} c={c}: {err!r}", flush=True)
        save()


def backend_probe(device, clock, blocks, caches, xs, start, cos, sin, raw, save, c: int = 3, steps: int = 32) -> None:
    """Decode steps (1 block, c sessions) at context lengths no earlier step used, per SDPA backend, then again."""
    pos = start
    for name in ("default", "cudnn", "flash", "efficient", "math"):
        try:
            with backend_context(name, device):
                passes = []
                for _ in range(2):  # first pass: new lengths; second: the same lengths again
                    clock.sync()
                    marks = [clock.mark()]
                    for k in range(steps):
                        run_blocks(blocks[:1], caches, xs[k % 8, :c], pos + k, cos, sin)
                        marks.append(clock.mark())
                    clock.sync()
                    passes.append([clock.between(a, b) for a, b in zip(marks, marks[1:])])
            raw["backend_probe"].append({"backend": name, "c": c, "m": 1, "positions": [pos, pos + steps - 1],
                                         "new_lengths_median_s": statistics.median(passes[0]),
                                         "same_lengths_median_s": statistics.median(passes[1])})
            print(f"SDPA {name:9s}: new context lengths {statistics.median(passes[0]) * 1e3:8.3f} ms/step, "
                  f"same lengths again {statistics.median(passes[1]) * 1e3:7.3f} ms/step", flush=True)
        except Exception as err:
            raw["backend_probe"].append({"backend": name, "error": repr(err)})
            print(f"SDPA {name}: {err!r}", flush=True)
        pos += steps
    save()


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for tau_raw.json and the CSVs")
    ap.add_argument("--grid", choices=sorted(GRIDS), default="full")
    ap.add_argument("--quick", action="store_true", help="same as --grid quick (tiny shapes, CPU is fine)")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None,
                    help="default bf16 on a GPU, fp32 on a CPU")
    ap.add_argument("--sdpa", choices=sorted(BACKENDS), default="flash",
                    help="attention backend for the timings (default flash; 'default': PyTorch's own choice)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="stop starting new measurements after this many seconds (what is done is kept)")
    args = ap.parse_args(argv)
    grid = GRIDS["quick" if args.quick else args.grid]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype_of(args.dtype or ("bf16" if device.type == "cuda" else "fp32"))
    shape = grid["shape"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    clock = Clock(device)
    esize = torch.empty((), dtype=dtype).element_size()

    raw = {"grid": "quick" if args.quick else args.grid, "dtype": str(dtype).removeprefix("torch."),
           "shape": {"hidden": shape.hidden, "inter": shape.inter, "heads": shape.heads, "kv_heads": shape.kv_heads,
                     "params_per_block": shape.params_per_block,
                     "matmul_flops_per_token": shape.matmul_flops_per_token},
           "gpu": gpu_info(device), "sdpa": args.sdpa, "max_tokens": grid["max_tokens"], "prefill": [],
           "decode": [], "graph": [], "backend_probe": [], "skipped": []}

    def save() -> None:
        raw["elapsed_s"] = time.perf_counter() - t_start
        (out / "tau_raw.json").write_text(json.dumps(raw, indent=1))

    def over_budget(what: str) -> bool:
        if time.perf_counter() - t_start > args.budget_s:
            raw["skipped"].append(what)
            return True
        return False

    with backend_context(args.sdpa, device):
        raw["self_check"] = self_check(shape, dtype, device)
    print(f"self-check (prefill n == prefill n-1 + decode): {raw['self_check']}", flush=True)
    if not raw["self_check"]["ok"]:
        save()
        print("self-check failed: not timing a wrong block", file=sys.stderr)
        return 1
    if grid["ceilings"] and device.type == "cuda":
        raw["ceilings"] = ceilings(device, dtype)
        print(f"ceilings: {raw['ceilings']}", flush=True)

    lin0, decode_runs = grid["decode"]
    cmax = max(grid["cs"] + [c for c, _, _ in decode_runs] + [e[0] for e in grid["graph"]])
    tmax = grid["max_tokens"]
    blocks = [Block(shape, dtype, device, seed=i) for i in range(grid["pool"])]
    caches = [kv_cache(shape, cmax, tmax, dtype, device) for _ in blocks]
    cos, sin = rope_tables(shape, tmax, dtype, device)
    raw["block_bytes"] = blocks[0].nbytes
    raw["cache_bytes_per_block_session_token"] = shape.cache_bytes(1, esize)
    if device.type == "cuda":
        raw["memory_allocated_after_setup"] = torch.cuda.memory_allocated()
    print(f"{len(blocks)} blocks of {blocks[0].nbytes / 1e6:.1f} MB, cache for {cmax} sessions × {tmax} tokens, "
          f"SDPA backend {args.sdpa}, {time.perf_counter() - t_start:.1f} s", flush=True)
    gen = torch.Generator(device=device).manual_seed(1)
    xs = torch.randn(8, cmax, 1, shape.hidden, device=device, dtype=dtype, generator=gen)

    with torch.inference_mode():
        # ---- SDPA backends first (the only part run outside the chosen backend) ------------------------------
        if grid["backends"] and device.type == "cuda":
            backend_probe(device, clock, blocks, caches, xs, tmax // 2, cos, sin, raw, save)

    with torch.inference_mode(), backend_context(args.sdpa, device):
        # ---- prefill ---------------------------------------------------------------------------------------
        x_all = torch.randn(cmax, max(grid["lins"] or [64]), shape.hidden, device=device, dtype=dtype, generator=gen)
        run_blocks(blocks[:1], caches, x_all[:1, :64], 0, cos, sin)  # first-call warm-up (handles, kernels)
        for c in grid["cs"]:
            for lin in grid["lins"]:
                for m in grid["ms"]:
                    if over_budget(f"prefill m={m} c={c} l_in={lin}"):
                        continue
                    x = x_all[:c, :lin]
                    fn = lambda: run_blocks(blocks[:m], caches, x, 0, cos, sin)  # noqa: E731
                    est = timed(clock, fn, warm=1, reps=1)[0]
                    reps = 3 if est > 0.2 else 5 if est > 0.02 else 9
                    ts = timed(clock, fn, warm=0, reps=reps)
                    raw["prefill"].append({"m": m, "c": c, "l_in": lin, "median_s": statistics.median(ts),
                                           "times_s": ts})
                print(f"prefill c={c:2d} l_in={lin:5d}: " + " ".join(
                    f"m{r['m']}={r['median_s'] * 1e3:.2f}ms" for r in raw["prefill"]
                    if r["c"] == c and r["l_in"] == lin), flush=True)
                save()
        del x_all

        # ---- decode step in a CUDA graph vs eager, at a fixed context (launch overhead) ------------------------
        graph_section(grid, device, clock, blocks, caches, xs, cos, sin, raw, over_budget, save)

        # ---- decode: every step of l_out steps after a prefill of l_in ---------------------------------------
        for c, m, steps in decode_runs:
            if over_budget(f"decode m={m} c={c}"):
                continue
            xp = torch.randn(c, lin0, shape.hidden, device=device, dtype=dtype, generator=gen)
            run_blocks(blocks[:m], caches, xp, 0, cos, sin)
            for k in range(3):  # warm-up steps (overwritten by the timed run)
                run_blocks(blocks[:m], caches, xs[k % 8, :c], lin0 + k, cos, sin)
            clock.sync()
            marks = [clock.mark()]
            for k in range(steps):
                run_blocks(blocks[:m], caches, xs[k % 8, :c], lin0 + k, cos, sin)
                marks.append(clock.mark())
            clock.sync()
            st = [clock.between(a, b) for a, b in zip(marks, marks[1:])]
            raw["decode"].append({"m": m, "c": c, "l_in": lin0, "steps_s": st})
            print(f"decode c={c:2d} m={m:2d}: {steps} steps, median step {statistics.median(st) * 1e3:.3f} ms "
                  f"(first 64: {statistics.median(st[:64]) * 1e3:.3f}, last 64: "
                  f"{statistics.median(st[-64:]) * 1e3:.3f})", flush=True)
            save()

    with open(out / "tau_prefill.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["m", "c", "l_in", "median_s", "repeats"])
        for r in raw["prefill"]:
            w.writerow([r["m"], r["c"], r["l_in"], f"{r['median_s']:.6e}", len(r["times_s"])])
    with open(out / "tau_decode.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["m", "c", "l_in", "step", "context", "step_s"])
        for r in raw["decode"]:
            for k, s in enumerate(r["steps_s"]):
                w.writerow([r["m"], r["c"], r["l_in"], k, r["l_in"] + k, f"{s:.6e}"])
    save()
    print(f"done in {raw['elapsed_s']:.1f} s; skipped {len(raw['skipped'])}: {raw['skipped'][:5]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
