"""TORTA Fig 8: mean response time per topology, TORTA vs SkyLB, SDIB, round robin (and our two ablations)."""

from __future__ import annotations

from petals_chain.experiments.common import Summary, write_csv
from petals_chain.experiments.torta_common import (ORDER, PAPER, PAPER_NAME, TOPOLOGIES, bar_plot,
                                                   comparison_rows, ratio_lines, settings, stat)

REPLOT = True  # `--replot` redraws torta-fig8.png from the saved results/torta-runs[-quick].csv


def summary_rows(rows: list[dict], keys: list[str]) -> list[dict]:
    """Mean and CI half-width of ``keys`` per topology × method."""
    out = []
    for t in TOPOLOGIES:
        for m in ORDER:
            row = {"topology": t, "method": m}
            for k in keys:
                row[k], row[f"{k}_ci95"] = stat(rows, t, m, k)
            out.append(row)
    return out


def run(args) -> Summary:
    """Response time bars over seeds with 95 % CIs; ratios to SkyLB next to the paper's."""
    rows = comparison_rows(args)
    keys = ["mean_response_s", "p95_response_s"]
    write_csv(args.out / "torta-fig8.csv", summary_rows(rows, keys))
    bar_plot(rows, [("mean_response_s", "mean response time (s)")], args.out / "torta-fig8.png",
             "TORTA Fig 8: mean response time (95 % CI over seeds)")
    rs = settings(args)
    lines = [f"{rs.seeds} seeds × {rs.slots} slots of {rs.params.slot_s:.0f} s per topology; "
             f"PPO {rs.episodes} episodes; same arrivals for every method"]
    lines += ratio_lines(rows, "mean_response_s", "mean response (s)")
    wins = [PAPER_NAME[t] for t in TOPOLOGIES
            if stat(rows, t, "TORTA", "mean_response_s")[0] < stat(rows, t, "SkyLB", "mean_response_s")[0]
            < stat(rows, t, "RR", "mean_response_s")[0]]
    lines.append(f"TORTA < SkyLB < RR in mean response on: {', '.join(wins) or 'none'}")
    paper = [f"{PAPER_NAME[t]}: " + "/".join(f"{v}" for v in PAPER['mean_response_s'][t]) + " s (TORTA/SkyLB/SDIB/RR)"
             for t in TOPOLOGIES] + ["vs SkyLB: −12.4 % (Abilene), −10.5 % (Cost2), −12.4 % (Gabriel), −6.5 % (Polska)"]
    cmd = f"python -m petals_chain.experiments torta-fig8{' --quick' if args.quick else ''} --seed {args.seed}"
    return Summary("torta-fig8", "TORTA mean response time per topology", cmd, lines, paper)
