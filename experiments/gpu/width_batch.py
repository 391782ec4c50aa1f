"""Speculative width against batch width on a GPU: one session verifying k tokens beside o decoding sessions.

A batching server runs every session's step in one pass, so a session that verifies k speculative tokens shares
the step with the o sessions that decode one token each: its k rows add to the step's cost for everyone, and
before the split plan (``BatchedSpanStep._packing_order``) a single such session also pushed the whole batch from
the gathered attention onto the per-session loop. This script times, over m LLaMA-2-7B-shaped bf16 blocks with
every session's caches rows of one arena per block (what the server's KV arena hands out on CUDA):

* ``mixed``: one step of the verifier (k tokens) and the o decoders, ``attention="gathered"`` (the CUDA default):
  the decoders attend gathered, the verifier per session (k = 1: all gathered);
* ``per_session``: the same step with every session on the per-session loop, which is what the step did for any
  k > 1 before the split plan (the same-run baseline);
* ``alone``: the verifier's k tokens alone (what the session would cost on an idle server);
* ``decoders``: the o decoders alone, gathered (the batch without the speculative session).

For every (context, o, k): CUDA-event medians of ``--repeat`` calls after warm-ups, in ``--passes`` passes over
the whole grid (the spread between passes is the run-to-run noise). Writes ``width_batch_raw.json`` and
``width_batch.csv`` into --out and prints a table. ``--quick`` runs tiny shapes on a CPU (wall clock).
``--analyse ACCEPT_CSV`` (no GPU needed) pools the runs found under --out (one folder each) into
``width_batch.csv`` and ``width_batch.png``, and writes ``width_batch_profile.csv``: each width's tokens per step
(from a moldable speed-up profile's ``tokens_per_step`` column, the draft's acceptance) over the measured step
time, per o, relative to width 1: the s(k) profile a GPU server's compute gives greedy(p*) (the orchestrator's
``--speedup-profile`` reads it).
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: petals_chain
sys.path.insert(0, str(Path(__file__).resolve().parent))

from batched_step import LlamaLayer, _Rotary, peak_bytes, session_caches, timer  # noqa: E402
from llama_block import LLAMA2_7B, TINY, Block, dtype_of  # noqa: E402

from petals_chain.server.batched_step import BatchedSpanStep, SessionStep  # noqa: E402

VARIANTS = ("mixed", "per_session", "alone", "decoders")


def grid(args: argparse.Namespace) -> tuple[list[int], list[int], list[int]]:
    """(contexts, others, widths) of the sweep."""
    if args.quick:
        return [16], [0, 1, 3], [1, 2, 4]
    return ([int(c) for c in args.contexts.split(",")], [int(o) for o in args.others.split(",")],
            [int(k) for k in args.widths.split(",")])


def summarise(cells: dict[tuple[int, int, int], dict[str, list[float]]]) -> list[dict]:
    """One row per (context, o, k): each variant's median, min and max over the passes so far."""
    rows = []
    for (ctx, o, k), cell in cells.items():
        row = {"context": ctx, "others": o, "width": k, "passes": len(cell["mixed"])}
        for name in VARIANTS:
            times = cell.get(name)
            row[f"{name}_ms"] = statistics.median(times) if times else None
            row[f"{name}_ms_min"] = min(times) if times else None
            row[f"{name}_ms_max"] = max(times) if times else None
        row["max_abs_diff"] = cell["max_abs_diff"][0]
        row["output_max_abs"] = cell["output_max_abs"][0]
        row["mixed_peak_bytes"] = cell.get("mixed_peak_bytes", [None])[0]
        row["mixed_bound_bytes"] = cell.get("mixed_bound_bytes", [None])[0]
        rows.append(row)
    return rows


def measure(args: argparse.Namespace, out_dir: Path) -> dict:
    """Every variant's step time over the grid, ``--passes`` times; the raw dict, also written to the JSON file
    after every pass (a run cut short keeps its finished passes)."""
    device = torch.device("cuda" if torch.cuda.is_available() and not args.quick else "cpu")
    shape = TINY if args.quick else LLAMA2_7B
    dtype = torch.float32 if device.type == "cpu" else dtype_of(args.dtype)
    n_blocks = 2 if args.quick else args.blocks
    contexts, others, widths = grid(args)
    max_length = max(contexts) + max(widths) + 1
    torch.manual_seed(0)
    rotary = _Rotary(shape.head_dim, max_length + 1, dtype, device)
    layers = [LlamaLayer(Block(shape, dtype, device, seed=i), rotary) for i in range(n_blocks)]
    gathered = BatchedSpanStep(layers, attention="gathered")
    per_session = BatchedSpanStep(layers, attention="per_session")
    rows_needed = 1 + max(others)
    arenas = session_caches(shape, n_blocks, rows_needed, max_length, dtype, device)
    caches = [[(ak[i:i + 1], av[i:i + 1]) for ak, av in arenas] for i in range(rows_needed)]  # row 0: verifier
    time_it = timer(device)
    info = {"device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor() or "cpu",
            "torch": torch.__version__, "dtype": str(dtype), "blocks": n_blocks, "shape": vars(shape),
            "repeat": args.repeat, "passes": args.passes, "python": platform.python_version(),
            "kv": "arena (every session's caches rows of one tensor per block)"}
    print(json.dumps(info), flush=True)
    cells: dict[tuple[int, int, int], dict[str, list[float]]] = {}
    for p in range(args.passes):
        for ctx in contexts:
            for o in others:
                dec = [SessionStep(torch.randn(1, 1, shape.hidden, dtype=dtype, device=device), caches[1 + i], ctx)
                       for i in range(o)]
                for k in widths:
                    ver = SessionStep(torch.randn(1, k, shape.hidden, dtype=dtype, device=device), caches[0], ctx)
                    runs = {"mixed": lambda s=[ver, *dec]: gathered(s),
                            "per_session": lambda s=[ver, *dec]: per_session(s),
                            "alone": lambda s=[ver]: gathered(s)}
                    if o:
                        runs["decoders"] = lambda s=dec: gathered(s)
                    cell = cells.setdefault((ctx, o, k), {})
                    for name, fn in runs.items():
                        for _ in range(args.warmup):
                            fn()
                        cell.setdefault(name, []).append(time_it(fn, args.repeat) * 1e3)
                    if p == 0:  # the split step's outputs equal the all-per-session step's (bf16 rounding)
                        a, b = runs["mixed"](), runs["per_session"]()
                        cell["max_abs_diff"] = [max((x - y).abs().max().item() for x, y in zip(a, b))]
                        cell["output_max_abs"] = [max(x.abs().max().item() for x in b)]
                        # the split step's working memory against the bound the server budgets with
                        cell["mixed_peak_bytes"] = [peak_bytes(runs["mixed"], device)]
                        cell["mixed_bound_bytes"] = [gathered.working_bytes([ver, *dec])]
                    print(f"pass {p} ctx {ctx:5d} o {o:3d} k {k:3d}: " + " ".join(
                        f"{n} {cell[n][-1]:7.2f} ms" for n in runs), flush=True)
        raw = {"info": info, "rows": summarise(cells)}
        (out_dir / "width_batch_raw.json").write_text(json.dumps(raw, indent=1))
    return raw


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def report(rows: list[dict]) -> None:
    """The split plan against the old all-per-session step, and the verifier's cost beside o decoders."""
    print("\nctx    o   k | mixed ms  per_session ms  per_session/mixed | mixed/(mixed at k=1) | decoders ms")
    base = {(r["context"], r["others"]): r["mixed_ms"] for r in rows if r["width"] == 1}
    for r in rows:
        ratio = r["per_session_ms"] / r["mixed_ms"]
        growth = r["mixed_ms"] / base[(r["context"], r["others"])]
        dec = f"{r['decoders_ms']:.2f}" if r["decoders_ms"] is not None else "-"
        print(f"{r['context']:5d} {r['others']:3d} {r['width']:3d} | {r['mixed_ms']:8.2f} {r['per_session_ms']:15.2f}"
              f" {ratio:18.2f} | {growth:20.2f} | {dec}")


def pooled(out_dir: Path) -> tuple[dict, list[dict]]:
    """Every run's raw file under ``out_dir`` (``width_batch_raw.json`` there or one level down), pooled per
    (context, o, k): each variant's mean over the runs' medians, and the lowest and highest run median."""
    paths = sorted([*out_dir.glob("width_batch_raw.json"), *out_dir.glob("*/width_batch_raw.json")])
    if not paths:
        raise SystemExit(f"width_batch: no width_batch_raw.json in {out_dir} or its sub-folders")
    runs = [json.loads(p.read_text()) for p in paths]
    cells: dict[tuple[int, int, int], list[dict]] = {}
    for run in runs:
        for r in run["rows"]:
            cells.setdefault((r["context"], r["others"], r["width"]), []).append(r)
    rows = []
    for (ctx, o, k), rs in sorted(cells.items()):
        row = {"context": ctx, "others": o, "width": k, "runs": len(rs)}
        for name in VARIANTS:
            values = [r[f"{name}_ms"] for r in rs if r.get(f"{name}_ms") is not None]
            row[f"{name}_ms"] = statistics.fmean(values) if values else None
            row[f"{name}_ms_lo"] = min(values) if values else None
            row[f"{name}_ms_hi"] = max(values) if values else None
        row["max_abs_diff"] = max(r["max_abs_diff"] for r in rs)
        row["output_max_abs"] = max(r["output_max_abs"] for r in rs)
        for key in ("mixed_peak_bytes", "mixed_bound_bytes"):  # measured by the runs that record them
            values = [r[key] for r in rs if r.get(key) is not None]
            row[key] = max(values) if values else None
        rows.append(row)
    info = {**runs[0]["info"], "runs": [str(p.relative_to(out_dir)) for p in paths]}
    return info, rows


def profile(rows: list[dict], accept_csv: Path, context: int) -> list[dict]:
    """The s(k) profile of a GPU server's compute at ``context`` per o: tokens per step at width k (the draft's
    acceptance, read from ``accept_csv``'s rows with the fewest others) over the mixed step's time, relative to
    width 1; ``speedup_all_per_session`` is the same with the step before the split plan."""
    with open(accept_csv, newline="") as f:
        accept_rows = list(csv.DictReader(f))
    fewest = min(int(r.get("others") or 0) for r in accept_rows)
    per_step = {int(r["width"]): float(r["tokens_per_step"]) for r in accept_rows
                if int(r.get("others") or 0) == fewest}
    sel = [r for r in rows if r["context"] == context and r["width"] in per_step]
    out = []
    for o in sorted({r["others"] for r in sel}):
        cells = sorted((r for r in sel if r["others"] == o), key=lambda r: r["width"])
        base = next(r for r in cells if r["width"] == 1)["mixed_ms"]
        for r in cells:
            tps = per_step[r["width"]] / (r["mixed_ms"] / 1e3)
            out.append({"others": o, "width": r["width"], "tokens_per_step": per_step[r["width"]],
                        "step_ms": r["mixed_ms"], "tokens_per_s": tps, "speedup": tps * base / 1e3,
                        "speedup_all_per_session": per_step[r["width"]] / r["per_session_ms"] * base,
                        "context": context})
    return out


def plot(info: dict, rows: list[dict], prof: list[dict], path: Path) -> None:
    """Draw :func:`width_batch_figure` into ``path``."""
    import matplotlib.pyplot as plt

    fig = width_batch_figure(info, rows, prof)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def width_batch_figure(info: dict, rows: list[dict], prof: list[dict]):
    """(a) step time against o: decode only, with one k-token verifier (split plan and all per session);
    (b) the compute-only s(k) per o, beside the draft's tokens per step (the limit where the network dominates)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ctx = prof[0]["context"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    sel = [r for r in rows if r["context"] == ctx]
    os_ = sorted({r["others"] for r in sel if r["others"] > 0})
    k_show = 4

    def line(name: str, k: int) -> tuple[list[float], list[float], list[float]]:
        cells = [next(r for r in sel if r["others"] == o and r["width"] == k) for o in os_]
        return ([c[f"{name}_ms"] for c in cells], [c[f"{name}_ms"] - c[f"{name}_ms_lo"] for c in cells],
                [c[f"{name}_ms_hi"] - c[f"{name}_ms"] for c in cells])

    for (name, k), style, label in (
            (("decoders", 1), "k:", "o decoders alone"),
            (("mixed", 1), "C0o-", "o decoders + 1 decoding session"),
            (("mixed", k_show), "C2s-", f"o decoders + a k = {k_show} verifier (split plan)"),
            (("per_session", k_show), "C3^--", "the same, all per session (before)")):
        y, lo, hi = line(name, k)
        a.errorbar(os_, y, yerr=[lo, hi], fmt=style, ms=4, capsize=2, label=label)
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xticks(os_, [str(o) for o in os_])
    a.set_yticks([4, 5, 7, 10, 15, 20, 30, 50, 70, 100], ["4", "5", "7", "10", "15", "20", "30", "50", "70", "100"])
    a.minorticks_off()
    a.set_xlabel("other sessions decoding in the step (o)")
    a.set_ylabel("step time, ms (bars: the runs' range)")
    a.set_title(f"(a) one step over {info['blocks']} blocks, context {ctx}", fontsize=10)
    a.grid(True, which="both", alpha=0.3)
    a.legend(fontsize=8, loc="upper left")
    ks = sorted({p["width"] for p in prof})
    b.plot(ks, [next(p for p in prof if p["width"] == k)["tokens_per_step"] for k in ks], "k:",
           label="tokens per step (network-bound limit)")
    for i, o in enumerate(o for o in (0, 7, 31, 63) if any(p["others"] == o for p in prof)):
        b.plot(ks, [next(p for p in prof if p["others"] == o and p["width"] == k)["speedup"] for k in ks],
               f"C{i}o-", ms=4, label=f"compute only, beside o = {o}")
    b.axhline(1.0, color="grey", lw=0.8)
    b.set_xlabel("speculative width k")
    b.set_ylabel("s(k): tokens/s over width 1")
    b.set_title("(b) the speed-up the step's compute leaves", fontsize=10)
    b.grid(True, alpha=0.3)
    low = min(p["speedup"] for p in prof if p["others"] in (0, 7, 31, 63))
    b.set_ylim(low - 0.35, None)  # room under the lines for the legend
    b.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"speculative width against batch width, LLaMA-2-7B-shaped blocks, {info['dtype']},"
                 f" {info['device']} ({len(info['runs'])} runs)", fontsize=10)
    fig.tight_layout()
    return fig


def analyse(out_dir: Path, accept_csv: Path, context: int) -> None:
    """The pooled table (``width_batch.csv``), the s(k) profile (``width_batch_profile.csv``) and the figure."""
    info, rows = pooled(out_dir)
    write_csv(out_dir / "width_batch.csv", rows)
    report(rows)
    prof = profile(rows, accept_csv, context)
    write_csv(out_dir / "width_batch_profile.csv", prof)
    plot(info, rows, prof, out_dir / "width_batch.png")
    for ctx in sorted({r["context"] for r in rows}):
        for lo, hi in ((1, 1), (3, 7), (15, 15), (31, 31), (63, 63)):
            sel = [r for r in rows if r["context"] == ctx and lo <= r["others"] <= hi and r["width"] > 1]
            if not sel:
                continue
            before = [r["per_session_ms"] / r["mixed_ms"] for r in sel]
            cost = [r["mixed_ms"] - r["decoders_ms"] for r in sel if r["decoders_ms"] is not None]
            print(f"ctx {ctx} o {lo}-{hi}, k 2-16: all-per-session / split {min(before):.2f}-{max(before):.2f}"
                  f" (median {statistics.median(before):.2f}); the verifier adds {statistics.median(cost):.2f} ms"
                  f" (median; {min(cost):.2f}-{max(cost):.2f}) to the decoders' step")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--contexts", default="512,2048")
    p.add_argument("--others", default="0,1,3,7,15,31,63")
    p.add_argument("--widths", default="1,2,3,4,6,8,16")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--passes", type=int, default=3)
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--quick", action="store_true", help="tiny shapes, a small grid, runs on a CPU")
    p.add_argument("--analyse", metavar="ACCEPT_CSV",
                   help="no measuring: pool the runs under --out, write the table, the s(k) profile and the figure")
    p.add_argument("--profile-context", type=int, default=2048, help="the context of the s(k) profile (--analyse)")
    args = p.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.analyse:
        analyse(out_dir, Path(args.analyse), args.profile_context)
        return 0
    raw = measure(args, out_dir)
    write_csv(out_dir / "width_batch.csv", raw["rows"])
    report(raw["rows"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
