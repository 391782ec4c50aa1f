"""TORTA Fig 12: mean response time against the prediction accuracy PA (12) of the forecast TORTA is given, on
every topology."""

from __future__ import annotations

import math

import numpy as np

from petals_chain.experiments.common import Summary, mean_ci, read_csv, replotting, save_figure, write_csv
from petals_chain.experiments.torta_common import (PAPER_NAME, PAS, TOPOLOGIES, main_rows, select_rows, settings,
                                                   shared_evaluation, shared_evaluations)

BASELINES = ("SkyLB", "SDIB", "RR")
REPLOT = True  # `--replot` redraws torta-fig12.png and its section from results/torta-fig12.csv
COLOURS = {"SkyLB": "C1", "SDIB": "C2", "RR": "C3"}


def run(args) -> Summary:
    """TORTA with a noisy oracle forecast of accuracy PA ∈ [0.1, 0.9] vs the baselines, same arrivals, per
    topology (the main comparison's seeds)."""
    rs = settings(args)
    if replotting(args):
        rows = read_csv(args.out / "torta-fig12.csv")
    else:
        rows = []
        shared_evaluations(TOPOLOGIES, args, rs)  # every topology's seeds in one pool or on Ray at once
        for topo in TOPOLOGIES:  # the shared evaluation: the main comparison's training and baselines
            shared = shared_evaluation(topo, args, rs)[0]
            rows += select_rows(shared, ("TORTA",), oracle=True) + main_rows(shared, rs, BASELINES)
        write_csv(args.out / "torta-fig12.csv", rows)
    save_figure(_figure(rows), args.out / "torta-fig12.png")
    lines = []
    for topo in TOPOLOGIES:
        torta, base = _series(rows, topo)
        best = min(mu for mu, _ in base.values())
        below = [mu < best for mu, _ in torta]
        cross = next((pa for k, pa in enumerate(PAS) if all(below[k:])), None)  # below from this PA upwards
        mono = bool(np.all(np.diff([m for m, _ in torta]) <= 0))
        seeds = len({r["seed"] for r in rows if r["topology"] == topo})
        lines.append(f"{PAPER_NAME[topo]} ({seeds} seeds): TORTA by PA " + "; ".join(
            f"{pa}: {m:.2f} ± {h:.2f} s" for pa, (m, h) in zip(PAS, torta)) + "; baselines " + "; ".join(
            f"{m} {mu:.2f} ± {h:.2f} s" for m, (mu, h) in base.items())
            + f"; non-increasing in PA: {mono}; TORTA below every baseline's mean at every PA from {cross} up")
    paper = ["response ≈ 20.5 s at PA 0.1 → ≈ 17.5 s at 0.9; beats all baselines from PA 0.5 (text also says 0.4)"]
    cmd = f"python -m petals_chain.experiments torta-fig12{' --quick' if args.quick else ''} --seed {args.seed}"
    return Summary("torta-fig12", "TORTA response time vs prediction accuracy", cmd, lines, paper)


def _series(rows: list[dict], topo: str) -> tuple[list[tuple[float, float]], dict[str, tuple[float, float]]]:
    """TORTA's mean ± 95 % half-width per PA, and each baseline's, on one topology."""
    mine = [r for r in rows if r["topology"] == topo]
    torta = [mean_ci([float(r["mean_response_s"]) for r in mine if r["method"] == "TORTA"
                      and not math.isnan(float(r["accuracy"])) and math.isclose(float(r["accuracy"]), pa)])
             for pa in PAS]
    base = {m: mean_ci([float(r["mean_response_s"]) for r in mine if r["method"] == m]) for m in BASELINES}
    return torta, base


def _figure(rows: list[dict]):
    """One panel per topology: TORTA against PA with 95 % whiskers, each baseline's mean as a dashed line."""
    from petals_chain.experiments.common import figure

    fig, axes = figure(2, 2, figsize=(10, 7), sharex=True)
    for ax, topo in zip([a for row in axes for a in row], TOPOLOGIES):
        torta, base = _series(rows, topo)
        ax.errorbar(PAS, [m for m, _ in torta], yerr=[0 if math.isnan(h) else h for _, h in torta], marker="o",
                    capsize=3, label="TORTA", color="C0")
        for m, (mu, _) in base.items():
            ax.axhline(mu, ls="--", label=m, color=COLOURS[m])
        ax.set_title(PAPER_NAME[topo])
        ax.set_xlabel("prediction accuracy PA")
        ax.set_ylabel("mean response time (s)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, frameon=False)
    fig.suptitle("TORTA Fig 12: response time against prediction accuracy (95 % CI over seeds)")
    return fig
