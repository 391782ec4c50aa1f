"""Mell Fig. 15: GPUs in use over time, Poisson workload at the high rate, every policy on the same arrivals."""

from __future__ import annotations

import numpy as np

from petals_chain.experiments.common import Summary, plt, write_csv
from petals_chain.experiments.mell_common import MAIN, PREEMPT, SETTINGS, command, shared_grid


def run(args) -> Summary:
    """Time series of run 0 of the shared grid's Poisson-high cell, for each setting."""
    _, raw = shared_grid(args)
    rows, lines = [], []
    pyplot = plt()
    fig, axes = pyplot.subplots(1, len(SETTINGS), figsize=(6.5 * len(SETTINGS), 4), squeeze=False)
    for ax, s in zip(axes[0], SETTINGS):
        series = {p: raw[(s, "poisson-high", 0, p)] for p in MAIN + PREEMPT}
        n = max(r.gpus.size for r in series.values())
        for p, r in series.items():
            g = np.pad(r.gpus, (0, n - r.gpus.size))
            ax.plot(np.arange(n) * r.slot_s, g, lw=1, label=p, ls="-" if p in MAIN else ":")
            rows += [{"setting": s, "policy": p, "time_s": round(k * r.slot_s, 3), "gpus": int(v)}
                     for k, v in enumerate(g) if k % 4 == 0]
        a, b = series["Mell"].window
        lowest = {p: float(np.mean(series["Mell"].gpus[a:b] <= r.gpus[a:b])) for p, r in series.items() if p != "Mell"}
        lines.append(f"{s}: share of the arrival window in which Mell uses no more GPUs than "
                     + ", ".join(f"{p} {100 * v:.0f} %" for p, v in lowest.items()))
        ax.set_xlabel("time (s)")
        ax.set_ylabel("GPUs in use")
        ax.set_title(f"{s}, Poisson high rate")
        ax.legend(ncol=2)
    fig.tight_layout()
    fig.savefig(args.out / "mell_fig15.png")
    pyplot.close(fig)
    write_csv(args.out / "mell_fig15.csv", rows)
    return Summary("mell_fig15", "Mell: GPUs over time", command("mell-fig15", args), lines,
                   ["similar start, large fluctuations; Mell lowest throughout"], {})
