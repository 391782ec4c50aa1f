"""TORTA Fig 10: load balance LB = 1/(1 + CV of server utilisation) per topology.

The headline is (11) per slot over the servers on in it, averaged over slots; beside it the per-server reading
(each server's mean utilisation over the slots it was on). docs/torta.md, "Simulator".
"""

from __future__ import annotations

from petals_chain.experiments.common import Summary, write_csv
from petals_chain.experiments.torta_common import (PAPER, PAPER_NAME, TOPOLOGIES, bar_plot, comparison_rows,
                                                   ratio_lines, stat)
from petals_chain.experiments.torta_fig8 import summary_rows

REPLOT = True  # `--replot` redraws torta-fig10.png from the saved results/torta-runs[-quick].csv


def run(args) -> Summary:
    """Load balance bars with 95 % CIs and ratios to SkyLB."""
    rows = comparison_rows(args)
    write_csv(args.out / "torta-fig10.csv", summary_rows(rows, ["load_balance", "load_balance_horizon"]))
    bar_plot(rows, [("load_balance", "load balance 1/(1 + CV), per slot"),
                    ("load_balance_horizon", "1/(1 + CV) of per-server utilisation over the run")],
             args.out / "torta-fig10.png", "TORTA Fig 10: load balance (95 % CI)")
    lines = ratio_lines(rows, "load_balance", "LB", fmt=".3f")
    above = [PAPER_NAME[t] for t in TOPOLOGIES
             if stat(rows, t, "TORTA", "load_balance")[0] > stat(rows, t, "SkyLB", "load_balance")[0]]
    lines.append(f"TORTA's per-slot LB above SkyLB's on: {', '.join(above) or 'none'}")
    lines += ratio_lines(rows, "load_balance_horizon", "LB per server over the run", fmt=".3f")
    paper = [f"{PAPER_NAME[t]}: " + "/".join(str(v) for v in PAPER["load_balance"][t]) for t in TOPOLOGIES]
    paper.append("vs SkyLB: +4.4/+4.1/+3.6/+4.2 % (Abilene/Cost2/Gabriel/Polska)")
    cmd = f"python -m petals_chain.experiments torta-fig10{' --quick' if args.quick else ''} --seed {args.seed}"
    return Summary("torta-fig10", "TORTA load balance", cmd, lines, paper)
