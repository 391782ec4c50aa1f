"""TORTA Fig 10: load balance LB = 1/(1 + CV of server utilisation) per topology."""

from __future__ import annotations

from petals_chain.experiments.common import Summary, write_csv
from petals_chain.experiments.torta_common import (PAPER, PAPER_NAME, TOPOLOGIES, bar_plot, comparison_rows,
                                                   ratio_lines)
from petals_chain.experiments.torta_fig8 import summary_rows


def run(args) -> Summary:
    """Load balance bars with 95 % CIs and ratios to SkyLB."""
    rows = comparison_rows(args)
    write_csv(args.out / "torta-fig10.csv", summary_rows(rows, ["load_balance"]))
    bar_plot(rows, [("load_balance", "load balance 1/(1 + CV)")], args.out / "torta-fig10.png",
             "TORTA Fig 10: load balance (95 % CI)")
    lines = ratio_lines(rows, "load_balance", "LB", fmt=".3f")
    paper = [f"{PAPER_NAME[t]}: " + "/".join(str(v) for v in PAPER["load_balance"][t]) for t in TOPOLOGIES]
    paper.append("vs SkyLB: +4.4/+4.1/+3.6/+4.2 % (Abilene/Cost2/Gabriel/Polska)")
    cmd = f"python -m petals_chain.experiments torta-fig10{' --quick' if args.quick else ''} --seed {args.seed}"
    return Summary("torta-fig10", "TORTA load balance", cmd, lines, paper)
