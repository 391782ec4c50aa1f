"""Mell Fig. 3: per-token latency against the number of requests batched on one GPU, from our GPU measurement.

Mell's packing rests on its Fig. 3: on a GPU, a decode step of 2 to 16 requests takes about as long as one, so
packing requests onto fewer GPUs costs them no latency. We have no 13B model on a GPU, but
``results/gpu-batched/batched.csv`` (issue 22, one H200, 8 LLaMA-2-7B-shaped bf16 blocks) times one decode step of
b sessions, which is each session's per-token latency on that span, for three servers: one session's step after
another (what PETALS' pool does), our batching server's step (sessions' caches in one arena), and the bare batched
forward. Nothing is simulated: this redraws that file as Mell's figure.
"""

from __future__ import annotations

from pathlib import Path

from petals_chain.experiments.common import REPO, Summary, figure, read_csv, save_figure

SOURCE = REPO / "results" / "gpu-batched" / "batched.csv"
SERVERS = (("serial_ms", "one session at a time (PETALS' pool)", "tab:grey"),
           ("arena_ms", "batched step (arena)", "tab:blue"),
           ("bare_ms", "bare batched forward", "tab:green"))
REPLOT = True  # nothing to simulate: every run redraws from the committed GPU measurement


def saved_rows(path: Path = SOURCE) -> list[dict]:
    """The GPU measurement's rows: context (a label), b and the step times in ms."""
    rows = []
    for r in read_csv(path):
        ctx = r["context"]  # tokens per session, or "mixed" (read_csv parses numbers)
        rows.append({"context": ctx if isinstance(ctx, str) else str(int(ctx)), "b": int(r["b"]),
                     **{key: float(r[key]) for key, _, _ in SERVERS}})
    return rows


def growth(rows: list[dict], context: str, key: str, lo: int = 2, hi: int = 16) -> float:
    """How many times longer a step of ``hi`` sessions takes than one of ``lo`` (ValueError if either is missing)."""
    by_b = {r["b"]: r[key] for r in rows if r["context"] == context}
    if lo not in by_b or hi not in by_b:
        raise ValueError(f"context {context}: no step of {lo} or {hi} sessions in the GPU measurement")
    return by_b[hi] / by_b[lo]


def fig3_figure(rows: list[dict]):
    """Per-token latency (ms) against sessions per step, one panel per context, the three servers on each."""
    contexts = list(dict.fromkeys(r["context"] for r in rows))
    fig, axes = figure(1, len(contexts), figsize=(4.2 * len(contexts), 3.8), sharey=True)
    for ax, ctx in zip(axes[0], contexts):
        cell = sorted((r for r in rows if r["context"] == ctx), key=lambda r: r["b"])
        bs = [r["b"] for r in cell]
        for key, label, colour in SERVERS:
            ax.plot(bs, [r[key] for r in cell], marker="o", ms=3, color=colour, label=label if ctx == contexts[0]
                    else None)
        ax.axvspan(2, 16, color="tab:orange", alpha=0.08)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sessions in one decode step (b)")
        ax.set_title("mixed contexts 64–2048" if ctx == "mixed" else f"context {ctx} tokens")
    axes[0][0].set_ylabel("per-token latency (ms, one decode step)")
    fig.suptitle("Mell Fig. 3 from our H200 measurement: 8 LLaMA-2-7B-shaped blocks, bf16 "
                 "(shaded: b = 2–16, the paper's flat range)")
    fig.legend(loc="outside lower center", ncol=3, frameon=False)
    return fig


def run(args) -> Summary:
    """Redraw the GPU measurement as Mell's Fig. 3 and say how much each server's step grows from 2 to 16."""
    rows = saved_rows()
    save_figure(fig3_figure(rows), args.out / "mell_fig3.png")
    lines = []
    for ctx in dict.fromkeys(r["context"] for r in rows):
        parts = [f"{label} ×{growth(rows, ctx, key):.2f}" for key, label, _ in SERVERS]
        lines.append(f"context {ctx}: per-token latency from b = 2 to 16: " + ", ".join(parts))
    lines.append("source: results/gpu-batched/batched.csv (one H200, CUDA-event medians of 10 calls, one run)")
    return Summary("mell_fig3", "Mell: per-token latency against batch size (GPU)",
                   "python -m petals_chain.experiments mell-fig3", lines,
                   ["13B per-token latency flat from batch 2 to 16"], {})
