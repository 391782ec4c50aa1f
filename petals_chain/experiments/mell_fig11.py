"""Mell Fig. 11: GPUs needed (eq. 3, peak over time) by Mell, BF, WF and LB under Poisson and Azure workloads."""

from __future__ import annotations

from petals_chain.experiments.common import Summary
from petals_chain.experiments.mell_common import (MAIN, PREEMPT, SETTINGS, WORKLOADS, bar_panels, cell, command,
                                                  grid_rows, reduction, scale)

REPLOT = True  # `--replot` redraws mell_fig11.png from results/mell_fig11.csv


def run(args) -> Summary:
    """Simulate the grid and compare peak GPU counts cell by cell."""
    rows = grid_rows(args, "mell_fig11")
    sc = scale(args.quick)
    bar_panels(rows, "peak_gpus", MAIN + PREEMPT, "GPUs needed (peak)",
               f"Mell Fig. 11: GPUs needed ({sc.requests} requests, {sc.runs} runs per cell; -p: baseline "
               "preempts instead of reserving)", args.out / "mell_fig11.png")
    lines, wins = [], {b: 0 for b in MAIN[1:] + PREEMPT}
    red = {b: [] for b in MAIN[1:] + PREEMPT}
    for s in SETTINGS:
        for w in WORKLOADS:
            m, h = cell(rows, s, w, "Mell", "peak_gpus")
            parts = []
            for b in MAIN[1:] + PREEMPT:
                r = reduction(rows, s, w, "Mell", b)
                red[b].append(r)
                wins[b] += r > 0
                parts.append(f"{b} {r:+.1f} %")
            lines.append(f"{s} {w}: Mell {m:.1f} ± {h:.1f} GPUs; fewer than " + ", ".join(parts))
    n = len(SETTINGS) * len(WORKLOADS)
    lines.append("Mell below the baseline in " + ", ".join(f"{b} {wins[b]}/{n}" for b in wins) + " cells")
    lines.append("reduction range (peak GPUs): " + ", ".join(f"{b} {min(v):.1f} to {max(v):.1f} %"
                                                             for b, v in red.items()))
    mean_red = {b: [reduction(rows, s, w, "Mell", b, "mean_gpus") for s in SETTINGS for w in WORKLOADS]
                for b in MAIN[1:] + PREEMPT}
    lines.append("reduction range (time-average GPUs over the arrival window): "
                 + ", ".join(f"{b} {min(v):.1f} to {max(v):.1f} %" for b, v in mean_red.items()))
    lines.append("BF/WF/LB reserve each request's final KV at admission (they neither migrate nor preempt); "
                 "BF-p/WF-p/LB-p preempt and recompute on overflow instead (preemptions in the CSV)")
    return Summary("mell_fig11", "Mell: GPUs needed vs BF, WF, LB", command("mell-fig11", args), lines,
                   ["up to 31 % fewer GPUs (abstract), 9–31 % overall", "up to 15 % fewer than LB, > 20 % fewer "
                    "than BF/WF; the gap grows with the rate and is largest for 7B on the 4090"],
                   {"reductions": red, "mean_reductions": mean_red})
