"""The batched step of petals_chain's server on a GPU: decode steps of b sessions over LLaMA-2-7B-shaped blocks.

Runs ``petals_chain.server.batched_step.BatchedSpanStep`` (the arithmetic the batching server runs, torch only)
over m random bf16 blocks built from ``llama_block.py``'s weights, each session with its own cache tensors in
PETALS' layout (what the server's memory cache gives every session), and times one decode step of b sessions:

* ``serial``: the b sessions one after another, one call each: a server that runs one session's step at a time
  (PETALS' pool), with our kernel, so only the batching differs;
* ``per_session``: one call for all b, token-wise work packed, attention per session in place (the default on
  a CPU);
* ``gathered``: one call, attention over the caches copied into one padded batch (one masked matmul pair);
* ``arena``: gathered, with every session's caches rows 0 ... b-1 of one arena tensor per block (what an arena
  memory cache would hand out): the new keys are written by one indexed operation and attention runs over the
  arena's rows in place, nothing copied;
* ``arena_holes``: the same with the sessions on every other row (0, 2, 4, ...): attention over the range in place,
  the idle rows computed and dropped (the worst case before the step falls back to one indexed copy);
* ``bare``: one session of batch b over one contiguous cache (the limit: one attention matmul, no gathering).

Contexts: every session at 128, every session at 1024, and "mixed" (lengths spread evenly over 64 ... 2048).
CUDA-event medians after warm-ups. For each call also the peak memory it allocated beyond weights and caches
(``torch.cuda.max_memory_allocated``) against ``BatchedSpanStep.working_bytes``. Writes ``batched_raw.json`` and
``batched.csv`` into --out and prints a table. ``--quick`` runs tiny shapes on a CPU (wall clock).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: petals_chain
sys.path.insert(0, str(Path(__file__).resolve().parent))

from llama_block import LLAMA2_7B, TINY, Block, Shape, dtype_of  # noqa: E402

from petals_chain.server.batched_step import BatchedSpanStep, SessionStep  # noqa: E402


class _RMSNorm(nn.Module):
    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight, self.eps = weight, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _linear(weight: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    layer.weight = nn.Parameter(weight, requires_grad=False)
    return layer


class _Rotary(nn.Module):
    """cos/sin ``[1, 1, L, head_dim]`` as transformers' LlamaRotaryEmbedding returns them (base 10000)."""

    def __init__(self, head_dim: int, max_tokens: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
        ang = torch.outer(torch.arange(max_tokens, device=device, dtype=torch.float32), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.cos, self.sin = ang.cos().to(dtype)[None, None], ang.sin().to(dtype)[None, None]

    def forward(self, x: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cos[:, :, :seq_len], self.sin[:, :, :seq_len]


class _Attention(nn.Module):
    def __init__(self, block: Block, rotary: _Rotary) -> None:
        super().__init__()
        s = block.shape
        self.q_proj, self.k_proj = _linear(block.wq), _linear(block.wk)
        self.v_proj, self.o_proj = _linear(block.wv), _linear(block.wo)
        self.num_heads, self.num_key_value_heads, self.head_dim, self.hidden_size = (
            s.heads, s.kv_heads, s.head_dim, s.hidden)
        self.rotary_emb = rotary


class _MLP(nn.Module):
    def __init__(self, block: Block) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = _linear(block.wg), _linear(block.wu), _linear(block.wd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    """``llama_block.Block``'s weights with the module layout of a transformers LLaMA decoder layer."""

    def __init__(self, block: Block, rotary: _Rotary) -> None:
        super().__init__()
        self.input_layernorm = _RMSNorm(block.n1, block.shape.eps)
        self.self_attn = _Attention(block, rotary)
        self.post_attention_layernorm = _RMSNorm(block.n2, block.shape.eps)
        self.mlp = _MLP(block)


def session_caches(shape: Shape, n_blocks: int, batch: int, max_length: int, dtype, device) -> list[tuple]:
    """One session's caches in PETALS' layout: keys [batch, kv, head_dim, L], values [batch, kv, L, head_dim]."""
    return [(torch.randn(batch, shape.kv_heads, shape.head_dim, max_length, dtype=dtype, device=device) * 0.1,
             torch.randn(batch, shape.kv_heads, max_length, shape.head_dim, dtype=dtype, device=device) * 0.1)
            for _ in range(n_blocks)]


def timer(device: torch.device):
    """``time_it(fn, repeat)``: median seconds of ``fn()`` (CUDA events on a GPU, wall clock on a CPU)."""
    def time_it(fn, repeat: int) -> float:
        times = []
        for _ in range(repeat):
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)
    return time_it


def peak_bytes(fn, device: torch.device) -> int | None:
    """Bytes ``fn()`` allocated at its peak beyond what was allocated before (None on a CPU)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak


def plot(rows: list[dict], info: dict, path: Path) -> None:
    """Aggregate tokens/s against b, one panel per context, the four ways on log-log axes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contexts = list(dict.fromkeys(r["context"] for r in rows))
    fig, axes = plt.subplots(1, len(contexts), figsize=(4.2 * len(contexts), 3.8), sharey=True)
    for ax, ctx in zip(axes if len(contexts) > 1 else [axes], contexts):
        sel = [r for r in rows if r["context"] == ctx]
        bs = [r["b"] for r in sel]
        for name, style in (("bare", "k--"), ("arena", "C2D-"), ("arena_holes", "C4v:"), ("gathered", "C0o-"),
                            ("per_session", "C1s-"), ("serial", "C3^-")):
            if f"{name}_tps" not in sel[0]:
                continue
            ax.plot(bs, [r[f"{name}_tps"] for r in sel], style, label=name.replace("_", " "), ms=4)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(bs, [str(b) for b in bs])
        ax.set_xlabel("sessions in the decode step (b)")
        ax.set_title("context " + ("64…2048" if ctx == "mixed" else ctx) + " tokens")
        ax.grid(True, which="both", alpha=0.3)
    (axes[0] if len(contexts) > 1 else axes).set_ylabel("aggregate tokens/s")
    (axes[0] if len(contexts) > 1 else axes).legend(fontsize=8)
    fig.suptitle(f"one decode step of b sessions, {info['blocks']} LLaMA-2-7B-shaped blocks, {info['dtype']},"
                 f" {info['device']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--sessions", default="1,2,4,8,16,32,64")
    p.add_argument("--contexts", default="128,1024,mixed")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--quick", action="store_true", help="tiny shapes, few sessions, runs on a CPU")
    p.add_argument("--replot", action="store_true", help="only redraw batched.png from --out's batched_raw.json")
    args = p.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.replot:
        raw = json.loads((out_dir / "batched_raw.json").read_text())
        plot(raw["rows"], raw["info"], out_dir / "batched.png")
        return 0
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    shape = TINY if args.quick else LLAMA2_7B
    dtype = torch.float32 if device.type == "cpu" else dtype_of(args.dtype)
    sessions = [int(b) for b in args.sessions.split(",")] if not args.quick else [1, 2, 4]
    contexts = args.contexts.split(",")
    max_length = 2049
    n_blocks = args.blocks if not args.quick else 2
    torch.manual_seed(0)
    rotary = _Rotary(shape.head_dim, max_length + 1, dtype, device)
    layers = [LlamaLayer(Block(shape, dtype, device, seed=i), rotary) for i in range(n_blocks)]
    steps = {mode: BatchedSpanStep(layers, attention=mode) for mode in ("per_session", "gathered")}
    time_it = timer(device)
    b_max = max(sessions)
    caches = [session_caches(shape, n_blocks, 1, max_length, dtype, device) for _ in range(b_max)]
    arenas = session_caches(shape, n_blocks, b_max, max_length, dtype, device)  # session i on row i
    holes = session_caches(shape, n_blocks, 2 * b_max, max_length, dtype, device)  # session i on row 2i
    for i in range(b_max):  # the same contents as the separate caches
        for (ak, av), (hk, hv), (k1, v1) in zip(arenas, holes, caches[i]):
            ak[i:i + 1].copy_(k1)
            av[i:i + 1].copy_(v1)
            hk[2 * i:2 * i + 1].copy_(k1)
            hv[2 * i:2 * i + 1].copy_(v1)
    arena_caches = [[(ak[i:i + 1], av[i:i + 1]) for ak, av in arenas] for i in range(b_max)]
    holes_caches = [[(hk[2 * i:2 * i + 1], hv[2 * i:2 * i + 1]) for hk, hv in holes] for i in range(b_max)]
    info = {"device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "dtype": str(dtype), "blocks": n_blocks, "shape": vars(shape),
            "max_length": max_length, "repeat": args.repeat, "python": platform.python_version()}
    print(json.dumps(info))
    rows = []
    for ctx_name in contexts:
        for b in sessions:
            if ctx_name == "mixed":
                lengths = [64] if b == 1 else [round(64 + i * (2047 - 64) / (b - 1)) for i in range(b)]
            else:
                lengths = [int(ctx_name)] * b
            hidden = [torch.randn(1, 1, shape.hidden, dtype=dtype, device=device) for _ in range(b)]
            one = [[SessionStep(hidden[i], caches[i], lengths[i])] for i in range(b)]
            together = [SessionStep(hidden[i], caches[i], lengths[i]) for i in range(b)]
            in_arena = [SessionStep(hidden[i], arena_caches[i], lengths[i]) for i in range(b)]
            in_holes = [SessionStep(hidden[i], holes_caches[i], lengths[i]) for i in range(b)]
            bare_caches = session_caches(shape, n_blocks, b, max_length, dtype, device)
            bare = [SessionStep(torch.cat(hidden), bare_caches, max(lengths))]
            runs = {
                "serial": lambda one=one: [steps["per_session"](o) for o in one],
                "per_session": lambda t=together: steps["per_session"](t),
                "gathered": lambda t=together: steps["gathered"](t),
                "arena": lambda t=in_arena: steps["gathered"](t),
                "arena_holes": lambda t=in_holes: steps["gathered"](t),
                "bare": lambda s=bare: steps["per_session"](s),
            }
            row = {"context": ctx_name, "b": b, "mean_context": sum(lengths) / b}
            # the same step three ways (each writes the same keys and values at the same positions): outputs agree
            reference = torch.cat([o[0] for o in runs["serial"]()]).float()
            row["output_max_abs"] = reference.abs().max().item()
            for name in ("per_session", "gathered", "arena", "arena_holes"):
                got = torch.cat(runs[name]()).float()
                row[f"{name}_max_abs_diff"] = (got - reference).abs().max().item()
            for name, fn in runs.items():
                for _ in range(3):
                    fn()
                seconds = time_it(fn, args.repeat)
                row[f"{name}_ms"] = seconds * 1e3
                row[f"{name}_tps"] = b / seconds
            row["per_session_peak"] = peak_bytes(runs["per_session"], device)
            row["per_session_bound"] = steps["per_session"].working_bytes(together)
            row["gathered_peak"] = peak_bytes(runs["gathered"], device)
            row["gathered_bound"] = steps["gathered"].working_bytes(together)
            row["arena_peak"] = peak_bytes(runs["arena"], device)
            rows.append(row)
            print(f"ctx {ctx_name:>5} b {b:3d}: " + " ".join(
                f"{k} {row[f'{k}_ms']:7.2f} ms ({row[f'{k}_tps']:8.1f} tok/s)" for k in runs)
                + f" | peak/bound per_session {row['per_session_peak'] or 0:.3g}/{row['per_session_bound']:.3g}"
                  f" gathered {row['gathered_peak'] or 0:.3g}/{row['gathered_bound']:.3g}"
                  f" arena {row['arena_peak'] or 0:.3g}"
                  f" | max |Δ| vs serial {row['per_session_max_abs_diff']:.2g} {row['gathered_max_abs_diff']:.2g}"
                  f" {row['arena_max_abs_diff']:.2g} {row['arena_holes_max_abs_diff']:.2g}"
                  f" (outputs up to {row['output_max_abs']:.3g})",
                flush=True)
            del bare_caches, bare, runs
            (out_dir / "batched_raw.json").write_text(json.dumps({"info": info, "rows": rows}, indent=1))
    with open(out_dir / "batched.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    try:
        plot(rows, info, out_dir / "batched.png")
    except ImportError:
        print("no matplotlib: no plot (redraw with --replot)")
    print("\nratios (aggregate tokens/s): per_session/serial, gathered/serial, arena/serial, arena/bare,"
          " arena_holes/bare")
    for r in rows:
        print(f"ctx {r['context']:>5} b {r['b']:3d}: {r['per_session_tps'] / r['serial_tps']:6.2f}"
              f" {r['gathered_tps'] / r['serial_tps']:6.2f} {r['arena_tps'] / r['serial_tps']:6.2f}"
              f" {r['arena_tps'] / r['bare_tps']:6.2f} {r['arena_holes_tps'] / r['bare_tps']:6.2f}")
    return 0 if all(math.isfinite(r["bare_ms"]) for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
