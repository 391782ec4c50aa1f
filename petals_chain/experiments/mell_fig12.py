"""Mell Fig. 12: migration frequency, counted two ways: requests moved (a multi-item move counts every request
it carries) and scheduler moves (a multi-item counts once, Theorem 3's unit); also without our end-of-slot sweep,
which the paper does not have (docs/mell.md, "Moves")."""

from __future__ import annotations

from petals_chain.experiments.common import Summary
from petals_chain.experiments.mell_common import (SETTINGS, WORKLOADS, bar_panels, cell, command, grid_rows,
                                                  has_column)

REPLOT = True  # `--replot` redraws mell_fig12.png from results/mell_fig12.csv


def run(args) -> Summary:
    """Migrations per second of Mell, LB (and LB preempting), BF/WF (zero) from the shared grid."""
    rows = grid_rows(args, "mell_fig12")
    pols = ("Mell", "LB", "LB-p", "BF", "WF")
    bar_panels(rows, "migrations_per_s", pols, "requests moved / s", "Mell Fig. 12: migration frequency",
               args.out / "mell_fig12.png")
    items = has_column(rows, "item_migrations_per_s")
    if items:
        bar_panels(rows, "item_migrations_per_s", pols, "scheduler moves / s",
                   "Mell Fig. 12: migration frequency (scheduler moves)", args.out / "mell_fig12_items.png")
    lines, below, below_items = [], 0, 0
    for s in SETTINGS:
        for w in WORKLOADS:
            m, _ = cell(rows, s, w, "Mell", "migrations_per_s")
            lb, _ = cell(rows, s, w, "LB", "migrations_per_s")
            lbp, _ = cell(rows, s, w, "LB-p", "migrations_per_s")
            mo, _ = cell(rows, s, w, "Mell", "max_moves_per_op")
            below += m < lbp
            line = f"{s} {w}: Mell {m:.2f}/s, LB {lb:.2f}/s, LB-p {lbp:.2f}/s requests moved"
            if items:
                mi, _ = cell(rows, s, w, "Mell", "item_migrations_per_s")
                mp, _ = cell(rows, s, w, "Mell", "paper_migrations_per_s")
                ioi, _ = cell(rows, s, w, "Mell", "max_item_moves_per_op")
                below_items += mi < lbp
                line += (f"; Mell {mi:.2f}/s scheduler moves, {mp:.2f}/s requests without the sweep; most in one "
                         f"operation {mo:.0f} requests, {ioi:.0f} scheduler moves")
            else:
                line += f"; Mell's most requests moved by one operation {mo:.0f} (scheduler moves: n/a, older CSV)"
            lines.append(line)
    n = len(SETTINGS) * len(WORKLOADS)
    lines.append(f"Mell moves fewer requests per second than LB-p in {below}/{n} cells (paper: in all)")
    mell = [x for x in rows if x["policy"] == "Mell"]
    lines.append(f"most requests moved by one operation, over every run: {max(x['max_moves_per_op'] for x in mell)}")
    if items:
        lines.append(f"Mell makes fewer scheduler moves per second than LB-p moves requests in {below_items}/{n} cells")
        lines.append("most scheduler moves in one operation, over every run: "
                     f"{max(x['max_item_moves_per_op'] for x in mell)} (Theorem 3's bound: 10; batched, so the "
                     "refills deferred to the slot's end count apart: Fig 13's unbatched runs give whole operations)")
    return Summary("mell_fig12", "Mell: migration frequency", command("mell-fig12", args), lines,
                   ["Mell's migrations/s below LB's everywhere; BF and WF never migrate",
                    "at most 10 migrations per operation (Theorem 3)"], {})
