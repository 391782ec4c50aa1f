"""Fig. 7: the c* each criterion picks as the arrival rate grows, and the c that simulation finds best."""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from petals_chain.experiments.common import Summary, plt, write_csv
from petals_chain.experiments.fig6_c_curve import c_curve
from petals_chain.experiments.paper import DEFAULT, draw_cluster, run_seeds

CRITERIA = {"lower_s": "Thm 3.7 lower bound", "upper_s": "Thm 3.7 upper bound", "surrogate_s": "surrogate c·K(c)",
            "sim_s": "simulation"}


def run(args) -> Summary:
    """For each λ, sweep c on the same clusters and record each criterion's argmin (averaged over clusters)."""
    runs, n_jobs, c_hi = (2, 3000, 30) if args.quick else (10, 20000, 60)
    lambdas = [0.1, 0.2, 0.4, 0.6, 0.8] if args.quick else [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    rows = []
    rngs = run_seeds(args.seed, runs)
    clusters = [draw_cluster(DEFAULT.J, DEFAULT.eta, rng) for rng in rngs]
    for lam in tqdm(lambdas, desc="fig7 arrival rates", unit="λ"):
        curves = [c_curve(servers, lam, range(1, c_hi + 1), n_jobs, rng) for servers, rng in zip(clusters, rngs)]
        cs = sorted({row["c"] for curve in curves for row in curve})
        row = {"arrival_rate": lam}
        for key in CRITERIA:
            means = []
            for c in cs:
                vals = [r[key] for curve in curves for r in curve if r["c"] == c]
                means.append(np.mean(vals) if vals and all(np.isfinite(vals)) and len(vals) == runs else np.inf)
            row[key.removesuffix("_s")] = cs[int(np.argmin(means))] if np.isfinite(min(means)) else -1
        rows.append(row)
    write_csv(args.out / "fig7.csv", rows)
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6.5, 4))
    for key, label in CRITERIA.items():
        k = key.removesuffix("_s")
        ax.plot([r["arrival_rate"] for r in rows], [r[k] for r in rows], marker="o", label=label,
                ls="--" if k == "sim" else "-")
    ax.set_xlabel("arrival rate λ (requests/s)")
    ax.set_ylabel("chosen c* (jobs per server)")
    ax.set_title(f"c* vs load: BLOOM-176B, J={DEFAULT.J}, η={DEFAULT.eta} ({runs} clusters)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "fig7.png")
    pyplot.close(fig)
    lines = ["λ → c* (lower / upper / surrogate / simulation): " + "; ".join(
        f"{r['arrival_rate']}: {r['lower']}/{r['upper']}/{r['surrogate']}/{r['sim']}" for r in rows)]
    agree = sum(abs(r["lower"] - r["sim"]) <= 2 for r in rows)
    lines.append(f"lower-bound c* within 2 of the simulated best at {agree}/{len(rows)} arrival rates")
    return Summary("fig7", "c* vs arrival rate", f"python -m petals_chain.experiments fig7"
                   f"{' --quick' if args.quick else ''} --seed {args.seed}", lines,
                   ["the lower bound's c* grows monotonically with λ and tracks the simulation; the upper bound is "
                    "too aggressive and the surrogate too conservative"], {"rows": rows})
