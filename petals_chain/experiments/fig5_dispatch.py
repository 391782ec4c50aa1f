"""Fig. 5: JFFC vs JSQ, SA-JSQ, SED and JIQ over load on fixed GBP-CR + GCA chains (a); JFFC against the
Theorem 3.7 bounds (b); and the share of JFFC's response time that is service time (c)."""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.compose.tuning import compose_for_c
from petals_chain.experiments.common import Summary, mean_ci, plt, read_csv, replotting, write_csv
from petals_chain.experiments.paper import DEFAULT, draw_cluster, model, run_seeds
from petals_chain.sim.engine import simulate
from petals_chain.sim.workloads import poisson_workload

POLICIES = ("JFFC", "JSQ", "SA-JSQ", "SED", "JIQ")
DESIGN_RATE = 0.8  # λ the chains are composed for: enough to make GBP-CR build several chains
REPLOT = True  # `--replot` redraws fig5.png from results/fig5.csv


def run(args) -> Summary:
    """Simulate every policy on the same arrivals for each load ρ = λ/ν, averaged over clusters."""
    runs, n_jobs = (3, 20_000) if args.quick else (20, 200_000)
    loads = [0.2, 0.5, 0.7, 0.9] if args.quick else [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    if replotting(args):
        rows = read_csv(args.out / "fig5.csv")
        loads, runs = sorted({x["load"] for x in rows}), len({x["run"] for x in rows})
    else:
        rows = _simulate(args.seed, runs, n_jobs, loads)
        write_csv(args.out / "fig5.csv", rows)
    return _report(args, rows, loads, runs, n_jobs)


def _simulate(seed: int, runs: int, n_jobs: int, loads: list[float]) -> list[dict]:
    """Per (cluster, load, policy): mean response, waiting and service time, and the Theorem 3.7 bounds."""
    rows = []
    for r, rng in enumerate(tqdm(run_seeds(seed, runs), desc="fig5 clusters", unit="run")):
        servers = draw_cluster(DEFAULT.J, DEFAULT.eta, rng)
        comp = compose_for_c(servers, model(), DEFAULT.c, DESIGN_RATE, DEFAULT.target_load)
        rates = [ch.rate_per_s for ch in comp.chains]
        caps = [ch.capacity for ch in comp.chains]
        for rho in loads:
            lam = rho * comp.total_rate_per_s
            workload = poisson_workload(lam, n_jobs, rng)
            b = theorem37_bounds(rates, caps, lam)
            for pol in POLICIES:
                res = simulate(rates, caps, workload, pol, rng=rng, warmup_jobs=n_jobs // 10)
                rows.append({"run": r, "load": rho, "policy": pol, "chains": len(rates), "capacity": sum(caps),
                             "mean_response_s": res.mean_response_s, "mean_waiting_s": res.mean_waiting_s,
                             "mean_service_s": res.mean_service_s, "lower_s": b.lower_s, "upper_s": b.upper_s})
    return rows


def _report(args, rows: list[dict], loads: list[float], runs: int, n_jobs: int) -> Summary:
    """Draw the four panels and summarise: the policies (log axis), each relative to JFFC, the bounds, the share."""

    def agg(pol: str, key: str) -> list[tuple[float, float]]:
        return [mean_ci([x[key] for x in rows if x["policy"] == pol and x["load"] == rho]) for rho in loads]

    pyplot = plt()
    fig, grid = pyplot.subplots(2, 2, figsize=(12, 8.5))
    axes = grid.ravel()
    for pol in POLICIES:
        m = agg(pol, "mean_response_s")
        axes[0].errorbar(loads, [a for a, _ in m], yerr=[h for _, h in m], marker="o", capsize=3, label=pol)
    axes[0].set_yscale("log")
    axes[0].set_title("(a) dispatch policies on GBP-CR + GCA chains (log scale)")
    jffc = agg("JFFC", "mean_response_s")
    for pol in POLICIES[1:4]:  # JIQ is off this scale (up to 100x JFFC): panel (a) shows it
        ratio = [100 * (o / j - 1) for (j, _), (o, _) in zip(jffc, agg(pol, "mean_response_s"))]
        axes[1].plot(loads, ratio, marker="o", label=pol, color=f"C{POLICIES.index(pol)}")
    axes[1].axhline(0, color="C0", lw=2, label="JFFC")
    axes[1].set_title("(b) mean response above JFFC's (JIQ: see (a))")
    axes[1].set_ylabel("mean response time vs JFFC (%)")
    axes[2].errorbar(loads, [a for a, _ in jffc], yerr=[h for _, h in jffc], marker="o", capsize=3,
                     label="JFFC (simulated)")
    for key, label in (("lower_s", "Thm 3.7 lower bound"), ("upper_s", "Thm 3.7 upper bound")):
        axes[2].plot(loads, [a for a, _ in agg("JFFC", key)], ls="--", marker="x", label=label)
    axes[2].set_title("(c) JFFC vs Theorem 3.7 bounds")
    for ax in (axes[0], axes[2]):
        ax.set_ylabel("mean response time (s)")
    for ax in axes:
        ax.set_xlabel("load ρ = λ / ν")
    share = [np.mean([x["mean_service_s"] / x["mean_response_s"] for x in rows
                      if x["policy"] == "JFFC" and x["load"] == rho]) for rho in loads]
    axes[3].plot(loads, [100 * s for s in share], marker="o", label="JFFC")
    axes[3].axhline(85, color="grey", ls=":", label="85 % (the paper's claim below ρ = 0.7)")
    axes[3].set_ylabel("service time / response time (%)")
    axes[3].set_title("(d) JFFC: share of response that is service")
    for ax in axes:
        ax.legend(fontsize=8)
    fig.suptitle(f"BLOOM-176B, J={DEFAULT.J}, η={DEFAULT.eta}, c={DEFAULT.c} ({runs} clusters, {n_jobs} jobs each)")
    fig.tight_layout()
    fig.savefig(args.out / "fig5.png")
    pyplot.close(fig)
    worst = {}
    for pol in POLICIES[1:]:
        other = agg(pol, "mean_response_s")
        worst[pol] = max(100 * (o - j) / o for (j, _), (o, _) in zip(jffc, other))
    inside = sum(lo - h <= j <= up + h for (j, h), (lo, _), (up, _) in
                 zip(jffc, agg("JFFC", "lower_s"), agg("JFFC", "upper_s")))
    lines = ["largest reduction of mean response by JFFC vs " + ", ".join(f"{p} {v:.1f} %" for p, v in worst.items()),
             f"JFFC between the Theorem 3.7 bounds (within its 95 % CI) at {inside}/{len(loads)} loads",
             "service share of JFFC response: "
             + ", ".join(f"ρ={rho}: {100 * s:.1f} %" for rho, s in zip(loads, share))]
    return Summary("fig5", "load balancing: JFFC vs other policies and the bounds",
                   f"python -m petals_chain.experiments fig5{' --quick' if args.quick else ''} --seed {args.seed}",
                   lines, ["JFFC is best; it keeps > 85 % of its response time as service time below load 0.7"],
                   {"share": share, "loads": loads})
