"""Mell Fig. 13: operation batching's effect on migrations (Mell with and without batching, same arrivals).

Without batching, a slot's operations run in request order (the paper's Algorithm 1) and every move is
executed; with batching, departures, updates and allocations run in that order, the refills they cause wait
for the slot's end (an arrival may have made them useless) and each request makes only its net move. Savings
are given as requests moved and as scheduler moves (a multi-item counts once). :func:`batching_sweep` varies
the slot length and the arrival rate (``python -m petals_chain.bench mell --batching-sweep N``).
"""

from __future__ import annotations

from petals_chain.experiments.common import Summary
from petals_chain.experiments.mell_common import (SETTINGS, WORKLOADS, bar_panels, cell, command, grid_rows,
                                                  has_column)

REPLOT = True  # `--replot` redraws mell_fig13.png from results/mell_fig13.csv


def run(args) -> Summary:
    """Simulate Mell both ways on every cell and compare migrations and GPUs."""
    rows = grid_rows(args, "mell_fig13", ("Mell", "Mell-nobatch"))
    bar_panels(rows, "migrations_per_s", ("Mell-nobatch", "Mell"), "migrations / s",
               "Mell Fig. 13: operation batching", args.out / "mell_fig13.png")
    items = has_column(rows, "item_migrations")
    lines, cuts, item_cuts = [], [], []
    for s in SETTINGS:
        for w in WORKLOADS:
            a, _ = cell(rows, s, w, "Mell", "migrations")
            b, _ = cell(rows, s, w, "Mell-nobatch", "migrations")
            ga, _ = cell(rows, s, w, "Mell", "peak_gpus")
            gb, _ = cell(rows, s, w, "Mell-nobatch", "peak_gpus")
            cut = _cut(b, a)
            cuts.append(cut)
            line = f"{s} {w}: batching cuts requests moved by {cut:.1f} % ({b:.0f} → {a:.0f})"
            if items:
                ia, _ = cell(rows, s, w, "Mell", "item_migrations")
                ib, _ = cell(rows, s, w, "Mell-nobatch", "item_migrations")
                oi, _ = cell(rows, s, w, "Mell-nobatch", "max_item_moves_per_op")
                item_cuts.append(_cut(ib, ia))
                line += (f", scheduler moves by {item_cuts[-1]:.1f} % ({ib:.0f} → {ia:.0f}); without batching at most "
                         f"{oi:.0f} scheduler moves in one operation")
            lines.append(line + f"; peak GPUs {gb:.1f} → {ga:.1f}")
    lines.append(f"cut range {min(cuts):.1f} to {max(cuts):.1f} % (requests moved)"
                 + (f", {min(item_cuts):.1f} to {max(item_cuts):.1f} % (scheduler moves)" if items else
                    "; scheduler moves n/a (older CSV)"))
    return Summary("mell_fig13", "Mell: operation batching", command("mell-fig13", args), lines,
                   ["batching cuts migrations by up to 30 % (Poisson) and 25 % (Azure)"],
                   {"cuts": cuts, "item_cuts": item_cuts})


def _cut(before: float, after: float) -> float:
    """Per cent fewer moves after than before (NaN when there were none)."""
    return 100 * (before - after) / before if before else float("nan")


SWEEP_SLOT_TOKENS = (1, 10, 50, 200)  # decode steps per slot
SWEEP_GAPS_S = (0.5, 1.1)  # Poisson mean gaps (the paper's frequent and infrequent rates)


def batching_sweep(requests: int, seed: int, setting: str = "7b-4090", slot_tokens=SWEEP_SLOT_TOKENS,
                   gaps_s=SWEEP_GAPS_S) -> list[dict]:
    """Mell with and without batching on the same Poisson arrivals for each slot length and mean gap: moves of
    both kinds, arrivals per slot and the saving (a longer slot or a higher rate puts more operations in one
    slot, so more for batching to prune)."""
    import dataclasses

    import numpy as np

    from petals_chain.experiments.mell_common import config, make_policy
    from petals_chain.mell.sim import simulate
    from petals_chain.mell.workloads import build_workload, poisson_arrivals, sharegpt_lengths

    if requests < 1:
        raise ValueError(f"requests must be >= 1, got {requests}")
    base = config(setting)
    rows = []
    for gap in gaps_s:
        rng = np.random.default_rng(seed)
        wl = build_workload(poisson_arrivals(gap, requests, rng), sharegpt_lengths(), base.capacity_tokens, rng)
        for k in slot_tokens:
            cfg = dataclasses.replace(base, tokens_per_slot=int(k))
            res = {p: simulate(make_policy(p, cfg.capacity_tokens), wl, cfg) for p in ("Mell", "Mell-nobatch")}
            a, b = res["Mell"], res["Mell-nobatch"]
            rows.append({"setting": setting, "gap_s": gap, "slot_tokens": int(k),
                         "arrivals_per_slot": cfg.slot_s / gap,
                         "moves_nobatch": b.migrations, "moves_batch": a.migrations,
                         "saving_pct": _cut(b.migrations, a.migrations),
                         "item_moves_nobatch": b.item_migrations, "item_moves_batch": a.item_migrations,
                         "item_saving_pct": _cut(b.item_migrations, a.item_migrations),
                         "peak_gpus_nobatch": b.peak_gpus, "peak_gpus_batch": a.peak_gpus})
    return rows
