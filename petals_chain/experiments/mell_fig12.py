"""Mell Fig. 12: migration frequency (migrations per second; a multi-item move counts every request)."""

from __future__ import annotations

from petals_chain.experiments.common import Summary
from petals_chain.experiments.mell_common import SETTINGS, WORKLOADS, bar_panels, cell, command, grid_rows

REPLOT = True  # `--replot` redraws mell_fig12.png from results/mell_fig12.csv


def run(args) -> Summary:
    """Migrations per second of Mell, LB (and LB preempting), BF/WF (zero) from the shared grid."""
    rows = grid_rows(args, "mell_fig12")
    pols = ("Mell", "LB", "LB-p", "BF", "WF")
    bar_panels(rows, "migrations_per_s", pols, "migrations / s", "Mell Fig. 12: migration frequency",
               args.out / "mell_fig12.png")
    lines, below = [], 0
    for s in SETTINGS:
        for w in WORKLOADS:
            m, _ = cell(rows, s, w, "Mell", "migrations_per_s")
            lb, _ = cell(rows, s, w, "LB", "migrations_per_s")
            lbp, _ = cell(rows, s, w, "LB-p", "migrations_per_s")
            mo, _ = cell(rows, s, w, "Mell", "max_moves_per_op")
            below += m < lbp
            lines.append(f"{s} {w}: Mell {m:.2f}/s, LB {lb:.2f}/s, LB-p {lbp:.2f}/s; "
                         f"Mell's most moves in one operation {mo:.0f}")
    n = len(SETTINGS) * len(WORKLOADS)
    lines.append(f"Mell migrates less often than LB-p in {below}/{n} cells (paper: in all)")
    lines.append("most requests moved by one operation, over every run: "
                 f"{max(x['max_moves_per_op'] for x in rows if x['policy'] == 'Mell')} (paper's bound: 10)")
    return Summary("mell_fig12", "Mell: migration frequency", command("mell-fig12", args), lines,
                   ["Mell's migrations/s below LB's everywhere; BF and WF never migrate"], {})
