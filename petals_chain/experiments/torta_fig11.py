"""TORTA Fig 11: response time broken into waiting, inference and network per method and topology."""

from __future__ import annotations

import math

from petals_chain.experiments.common import Summary, plt, write_csv
from petals_chain.experiments.torta_common import ORDER, PAPER_NAME, TOPOLOGIES, axis_top, comparison_rows, stat
from petals_chain.experiments.torta_fig8 import summary_rows

PARTS = (("mean_wait_s", "waiting"), ("mean_service_s", "inference"), ("mean_network_s", "network"))

REPLOT = True  # `--replot` redraws torta-fig11.png from the saved results/torta-runs[-quick].csv


def run(args) -> Summary:
    """Stacked bars of the three parts; waiting time TORTA vs the baselines."""
    rows = comparison_rows(args)
    write_csv(args.out / "torta-fig11.csv", summary_rows(rows, [k for k, _ in PARTS]))
    pyplot = plt()
    fig, axes = pyplot.subplots(1, len(TOPOLOGIES), figsize=(16, 4), sharey=True)
    totals = {t: [sum(stat(rows, t, m, key)[0] for key, _ in PARTS) for m in ORDER] for t in TOPOLOGIES}
    top = axis_top([v for vs in totals.values() for v in vs])  # a collapsed method would flatten the others
    for ax, t in zip(axes, TOPOLOGIES):
        bottom = [0.0] * len(ORDER)
        for key, label in PARTS:
            v = [stat(rows, t, m, key)[0] for m in ORDER]
            ax.bar(ORDER, v, bottom=bottom, label=label)
            bottom = [a + b for a, b in zip(bottom, v)]
        for j, total in enumerate(totals[t]):  # a bar cut at the axis' top says its total where it is cut
            if total > top:
                ax.annotate(f"{total:.0f} s", (j, top), xytext=(-3, -4), textcoords="offset points", rotation=90,
                            ha="right", va="top", fontsize=8)
        ax.set_title(PAPER_NAME[t])
        ax.tick_params(axis="x", rotation=90)  # rotated 45°, the labels' boxes overlapped their neighbours
    if top < math.inf:
        axes[0].set_ylim(0, top)
    axes[0].set_ylabel("time (s)")
    axes[0].legend()
    fig.suptitle("TORTA Fig 11: response-time breakdown")
    fig.tight_layout()
    fig.savefig(args.out / "torta-fig11.png")
    pyplot.close(fig)
    lines = []
    for t in TOPOLOGIES:
        w = {m: stat(rows, t, m, "mean_wait_s") for m in ORDER}
        base = min(w[m][0] for m in ("SkyLB", "SDIB", "RR"))
        lines.append(f"{PAPER_NAME[t]} waiting: " + "; ".join(f"{m} {w[m][0]:.2f} ± {w[m][1]:.2f} s" for m in ORDER)
                     + f". TORTA vs best baseline {w['TORTA'][0] / base - 1:+.0%}; inference "
                     + f"{stat(rows, t, 'TORTA', 'mean_service_s')[0]:.1f} s")
    paper = ["waiting 0.3–1.1 s (TORTA) vs 1.2–2.4 s for the baselines (−50…−75 %); inference means 16–20 s"]
    cmd = f"python -m petals_chain.experiments torta-fig11{' --quick' if args.quick else ''} --seed {args.seed}"
    return Summary("torta-fig11", "TORTA response-time breakdown", cmd, lines, paper)
