"""Mell Fig. 13: operation batching's effect on migrations (Mell with and without batching, same arrivals).

Without batching, a slot's operations run in request order (the paper's Algorithm 1) and every move is
executed; with batching, departures, updates and allocations run in that order and each request makes only
its net move.
"""

from __future__ import annotations

from petals_chain.experiments.common import Summary
from petals_chain.experiments.mell_common import SETTINGS, WORKLOADS, bar_panels, cell, command, grid_rows

REPLOT = True  # `--replot` redraws mell_fig13.png from results/mell_fig13.csv


def run(args) -> Summary:
    """Simulate Mell both ways on every cell and compare migrations and GPUs."""
    rows = grid_rows(args, "mell_fig13", ("Mell", "Mell-nobatch"))
    bar_panels(rows, "migrations_per_s", ("Mell-nobatch", "Mell"), "migrations / s",
               "Mell Fig. 13: operation batching", args.out / "mell_fig13.png")
    lines, cuts = [], []
    for s in SETTINGS:
        for w in WORKLOADS:
            a, _ = cell(rows, s, w, "Mell", "migrations")
            b, _ = cell(rows, s, w, "Mell-nobatch", "migrations")
            ga, _ = cell(rows, s, w, "Mell", "peak_gpus")
            gb, _ = cell(rows, s, w, "Mell-nobatch", "peak_gpus")
            cut = 100 * (b - a) / b if b else float("nan")
            cuts.append(cut)
            lines.append(f"{s} {w}: batching cuts migrations by {cut:.1f} % ({b:.0f} → {a:.0f}); "
                         f"peak GPUs {gb:.1f} → {ga:.1f}")
    lines.append(f"cut range {min(cuts):.1f} to {max(cuts):.1f} %")
    return Summary("mell_fig13", "Mell: operation batching", command("mell-fig13", args), lines,
                   ["batching cuts migrations by up to 30 % (Poisson) and 25 % (Azure)"], {"cuts": cuts})
