"""Fig. 6: mean response time against c — simulated JFFC over GBP-CR(c) + GCA, the surrogate
c·K(c)/λ, and the Theorem 3.7 lower and upper bounds; which c each criterion picks."""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from petals_chain.compose.tuning import compose_for_c
from petals_chain.experiments.common import Summary, mean_ci, plt, read_csv, replotting, write_csv
from petals_chain.experiments.paper import DEFAULT, draw_cluster, model, run_seeds
from petals_chain.model import InfeasibleError
from petals_chain.sim.engine import simulate
from petals_chain.sim.workloads import poisson_workload

REPLOT = True  # `--replot` redraws fig6.png from results/fig6.csv


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
    if replotting(args):
        rows = read_csv(args.out / "fig6.csv")
        runs = len({row["run"] for row in rows})
        for row in rows:
            row["c"] = int(row["c"])
    else:
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
    fig, (ax, zoom) = pyplot.subplots(1, 2, figsize=(13, 5.6), gridspec_kw={"width_ratios": [3, 2]},
                                      layout="constrained")
    labels = {"surrogate_s": "surrogate c·K(c)/λ", "lower_s": "Thm 3.7 lower bound",
              "upper_s": "Thm 3.7 upper bound", "sim_s": "simulated JFFC, 95 % CI"}
    styles = {"surrogate_s": dict(color="C1", ls="-", marker="s", ms=3, lw=1.2),
              "lower_s": dict(color="C2", ls="--", lw=1.3, zorder=6),
              "upper_s": dict(color="C3", ls="--", lw=1.3, zorder=6),
              "sim_s": dict(color="black", ls="-", marker="o", ms=4, lw=2.2, zorder=5)}
    for key in ("surrogate_s", "lower_s", "upper_s", "sim_s"):  # simulation thick below the thin dashed bounds
        mean = np.array([m for m, _ in agg[key]])
        ci = np.array([h for _, h in agg[key]])
        for a in (ax, zoom):
            a.plot(cs, mean, label=labels[key] if a is ax else None, **styles[key])
            if key == "sim_s":
                a.fill_between(cs, mean - ci, mean + ci, alpha=0.25, color="grey", zorder=4)
            a.axvline(picks[key], color=styles[key]["color"], ls=":", lw=1.2,
                      label=f"c* by the {labels[key].split(',')[0]}: {picks[key]}" if a is ax else None)
    near = [c for c in cs if c <= max(picks.values()) + 4]
    lo = min(min(m for m, _ in agg[k][: len(near)]) for k in ("lower_s", "sim_s"))
    hi = max(max(m for m, _ in agg[k][: len(near)]) for k in ("upper_s", "sim_s"))
    zoom.set_xlim(near[0] - 0.5, near[-1] + 0.5)
    zoom.set_ylim(lo * 0.95, hi * 1.05)
    zoom.set_title(f"zoom: c ≤ {near[-1]} (linear axis)")
    zoom.set_xlabel("reserved concurrency c (jobs per server)")
    zoom.set_ylabel("mean response time (s)")
    ax.set_xlabel("reserved concurrency c (jobs per server)")
    ax.set_yscale("log")
    ax.set_ylabel("mean response time (s, log scale)")
    ax.set_title("all c (log axis)")
    fig.suptitle(f"Fig. 6: BLOOM-176B, J={DEFAULT.J}, η={DEFAULT.eta}, λ={DEFAULT.arrival_rate}/s ({runs} clusters)")
    fig.legend(fontsize=9, loc="outside lower center", ncol=4, frameon=False)  # inside, it covered the surrogate
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
