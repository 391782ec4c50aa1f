"""Fig. 5: JFFC vs JSQ, SA-JSQ, SED and JIQ over load on fixed GBP-CR + GCA chains (a); JFFC against the
Theorem 3.7 bounds (b); and the share of JFFC's response time that is service time (c)."""

from __future__ import annotations

import numpy as np
from tqdm import tqdm

from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.compose.tuning import compose_for_c
from petals_chain.experiments.common import Summary, mean_ci, plt, write_csv
from petals_chain.experiments.paper import DEFAULT, draw_cluster, model, run_seeds
from petals_chain.sim.engine import simulate
from petals_chain.sim.workloads import poisson_workload

POLICIES = ("JFFC", "JSQ", "SA-JSQ", "SED", "JIQ")
DESIGN_RATE = 0.8  # λ the chains are composed for: enough to make GBP-CR build several chains


def run(args) -> Summary:
    """Simulate every policy on the same arrivals for each load ρ = λ/ν, averaged over clusters."""
    runs, n_jobs = (3, 20_000) if args.quick else (20, 200_000)
    loads = [0.2, 0.5, 0.7, 0.9] if args.quick else [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95]
    rows = []
    for r, rng in enumerate(tqdm(run_seeds(args.seed, runs), desc="fig5 clusters", unit="run")):
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
    write_csv(args.out / "fig5.csv", rows)

    def agg(pol: str, key: str) -> list[tuple[float, float]]:
        return [mean_ci([x[key] for x in rows if x["policy"] == pol and x["load"] == rho]) for rho in loads]

    pyplot = plt()
    fig, axes = pyplot.subplots(1, 3, figsize=(14, 4))
    for pol in POLICIES:
        m = agg(pol, "mean_response_s")
        axes[0].errorbar(loads, [a for a, _ in m], yerr=[h for _, h in m], marker="o", capsize=3, label=pol)
    axes[0].set_title("(a) dispatch policies on GBP-CR + GCA chains")
    jffc = agg("JFFC", "mean_response_s")
    axes[1].errorbar(loads, [a for a, _ in jffc], yerr=[h for _, h in jffc], marker="o", capsize=3,
                     label="JFFC (simulated)")
    for key, label in (("lower_s", "Thm 3.7 lower bound"), ("upper_s", "Thm 3.7 upper bound")):
        axes[1].plot(loads, [a for a, _ in agg("JFFC", key)], ls="--", marker="x", label=label)
    axes[1].set_title("(b) JFFC vs Theorem 3.7 bounds")
    for ax in axes[:2]:
        ax.set_xlabel("load ρ = λ / ν")
        ax.set_ylabel("mean response time (s)")
        ax.legend()
    share = [np.mean([x["mean_service_s"] / x["mean_response_s"] for x in rows
                      if x["policy"] == "JFFC" and x["load"] == rho]) for rho in loads]
    axes[2].plot(loads, [100 * s for s in share], marker="o")
    axes[2].axhline(85, color="grey", ls=":", label="85 %")
    axes[2].set_xlabel("load ρ = λ / ν")
    axes[2].set_ylabel("service time / response time (%)")
    axes[2].set_title("(c) JFFC: share of response that is service")
    axes[2].legend()
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
