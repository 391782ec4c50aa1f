"""Fig. 6: mean response time against c — simulated JFFC over GBP-CR(c) + GCA, the surrogate
c·K(c)/λ, and the Theorem 3.7 lower and upper bounds; which c each criterion picks."""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from petals_chain.compose.tuning import compose_for_c
from petals_chain.experiments.common import Summary, mean_ci, plt, write_csv
from petals_chain.experiments.paper import DEFAULT, draw_cluster, model, run_seeds
from petals_chain.model import InfeasibleError
from petals_chain.sim.engine import simulate
from petals_chain.sim.workloads import poisson_workload


def c_curve(servers, arrival_rate: float, c_values, n_jobs: int, rng: np.random.Generator) -> list[dict]:
    """One cluster: for each c, the bounds, the surrogate and the simulated JFFC mean response time."""
    m = model()
    workload = poisson_workload(arrival_rate, n_jobs, rng)  # same arrivals for every c: common random numbers
    rows = []
    for c in c_values:
        try:
            comp = compose_for_c(servers, m, c, arrival_rate, DEFAULT.target_load)
        except InfeasibleError:
            continue
        row = {"c": c, "surrogate_s": c * comp.meta["gbp_chains"] / arrival_rate, "lower_s": comp.meta["lower_s"],
               "upper_s": comp.meta["upper_s"], "sim_s": float("nan")}
        if np.isfinite(row["lower_s"]):  # stable: simulate it
            res = simulate([ch.rate_per_s for ch in comp.chains], [ch.capacity for ch in comp.chains], workload,
                           warmup_jobs=n_jobs // 10)
            row["sim_s"] = res.mean_response_s
        rows.append(row)
    return rows


def run(args) -> Summary:
    """Average the curves over independent clusters and mark each criterion's c*."""
    runs, n_jobs, c_hi = (3, 4000, 30) if args.quick else (20, 20000, 60)
    rows = []
    for r, rng in enumerate(tqdm(run_seeds(args.seed, runs), desc="fig6 clusters", unit="run")):
        servers = draw_cluster(DEFAULT.J, DEFAULT.eta, rng)
        for row in c_curve(servers, DEFAULT.arrival_rate, range(1, c_hi + 1), n_jobs, rng):
            rows.append({"run": r} | row)
    write_csv(args.out / "fig6.csv", rows)
    cs = sorted({row["c"] for row in rows})
    agg = {}
    for key in ("sim_s", "surrogate_s", "lower_s", "upper_s"):
        agg[key] = [mean_ci([row[key] for row in rows if row["c"] == c and np.isfinite(row[key])]) for c in cs]
    picks = {key: cs[int(np.nanargmin([m for m, _ in agg[key]]))] for key in agg}
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(7, 4.2))
    labels = {"sim_s": "simulated (JFFC)", "surrogate_s": "surrogate c·K(c)/λ", "lower_s": "Thm 3.7 lower bound",
              "upper_s": "Thm 3.7 upper bound"}
    for key, label in labels.items():
        mean = np.array([m for m, _ in agg[key]])
        ci = np.array([h for _, h in agg[key]])
        line, = ax.plot(cs, mean, marker="o", ms=3, label=f"{label} (min at c={picks[key]})")
        if key == "sim_s":
            ax.fill_between(cs, mean - ci, mean + ci, alpha=0.2, color=line.get_color())
        ax.axvline(picks[key], color=line.get_color(), ls=":", lw=1)
    ax.set_xlabel("reserved concurrency c (jobs per server)")
    ax.set_yscale("log")
    ax.set_ylabel("mean response time (s, log scale)")
    ax.set_title(f"BLOOM-176B, J={DEFAULT.J}, η={DEFAULT.eta}, λ={DEFAULT.arrival_rate}/s ({runs} clusters)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "fig6.png")
    pyplot.close(fig)
    sim = dict(zip(cs, (m for m, _ in agg["sim_s"])))
    lines = [f"c picked: lower bound {picks['lower_s']}, upper bound {picks['upper_s']}, surrogate "
             f"{picks['surrogate_s']}, simulation {picks['sim_s']}"]
    lines.append("simulated mean response at those c: " + ", ".join(
        f"{k.removesuffix('_s')} {sim[picks[k]]:.2f} s" for k in ("lower_s", "upper_s", "surrogate_s", "sim_s")))
    return Summary("fig6", "mean response time vs c", f"python -m petals_chain.experiments fig6"
                   f"{' --quick' if args.quick else ''} --seed {args.seed}", lines,
                   ["the lower bound picks the c that minimises the simulated mean; the surrogate reserves too "
                    "little cache, the upper bound too much"], {"picks": picks})
