"""TORTA Fig 9: power cost and switching overhead per topology, TORTA vs the baselines."""

from __future__ import annotations

from petals_chain.experiments.common import Summary, mean_ci, write_csv
from petals_chain.experiments.torta_common import (PAPER, PAPER_NAME, TOPOLOGIES, bar_plot, comparison_rows,
                                                   ratio_lines, stat)
from petals_chain.experiments.torta_fig8 import summary_rows

REPLOT = True  # `--replot` redraws torta-fig9.png from the saved results/torta-runs[-quick].csv


PRICE_METHODS = ("TORTA", "OT-unbalanced")  # the paper's balanced plan, and the plan that may move mass by price


def paired_power_lines(rows: list[dict]) -> list[str]:
    """Per topology: the per-seed power difference of TORTA and of OT-unbalanced against SkyLB (% of SkyLB's, paired
    by seed, mean and 95 % half-width), and whether its interval lies below zero."""
    lines = []
    for topo in TOPOLOGIES:
        sky = {r["seed"]: float(r["power_cost"]) for r in rows if r["topology"] == topo and r["method"] == "SkyLB"}
        parts = []
        for m in PRICE_METHODS:
            mine = {r["seed"]: float(r["power_cost"]) for r in rows if r["topology"] == topo and r["method"] == m}
            diffs = [100 * (mine[s] / sky[s] - 1) for s in sorted(set(mine) & set(sky)) if sky[s]]
            mu, half = mean_ci(diffs)
            verdict = "below SkyLB" if mu + half < 0 else "above SkyLB" if mu - half > 0 else "not apart"
            parts.append(f"{m} {mu:+.1f} ± {half:.1f} % ({verdict}, n={len(diffs)})")
        lines.append(f"{PAPER_NAME[topo]} power vs SkyLB, paired by seed: " + "; ".join(parts))
    return lines


def run(args) -> Summary:
    """Power cost (€ at the seeded prices) and ‖Â_t − Â_{t−1}‖²_F per slot, with ratios to SkyLB."""
    rows = comparison_rows(args)
    write_csv(args.out / "torta-fig9.csv", summary_rows(rows, ["power_cost", "switching", "activations"]))
    bar_plot(rows, [("power_cost", "power cost (€, seeded prices)"), ("switching", "switching ‖ΔA‖²_F per slot")],
             args.out / "torta-fig9.png", "TORTA Fig 9: power cost and switching overhead (95 % CI)")
    lines = ratio_lines(rows, "power_cost", "power cost (€)") + ratio_lines(rows, "switching", "switching",
                                                                             fmt=".3f")
    ok = [PAPER_NAME[t] for t in TOPOLOGIES
          if stat(rows, t, "TORTA", "switching")[0] <= 0.7 * stat(rows, t, "SkyLB", "switching")[0]
          and stat(rows, t, "SkyLB", "switching")[0] > 0]
    lines.append(f"switching(TORTA) ≤ 0.7 × switching(SkyLB) on: {', '.join(ok) or 'none'}")
    lines += paired_power_lines(rows)
    paper = [f"{PAPER_NAME[t]}: power " + "/".join(str(v) for v in PAPER["power_cost"][t]) + " $K, overhead "
             + "/".join(str(v) for v in PAPER["switching"][t]) for t in TOPOLOGIES]
    paper.append("vs SkyLB: power −12.6/−15.9/−16.4/−7.2 %, overhead −72/−39/−61/−32 % (Abilene/Cost2/Gabriel/Polska)")
    cmd = f"python -m petals_chain.experiments torta-fig9{' --quick' if args.quick else ''} --seed {args.seed}"
    return Summary("torta-fig9", "TORTA power cost and switching overhead", cmd, lines, paper)
