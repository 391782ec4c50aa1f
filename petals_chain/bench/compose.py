"""`python -m petals_chain.bench compose`: time GBP-CR, GCA, the full c sweep and the default composition for J = 100 …
10000, the default both as it searches now (pruned) and as it first searched (every candidate bounded, every
estimated one simulated: ``joint_compose(search='exhaustive')``), with the ratio and whether both chose the same."""

from __future__ import annotations

import argparse
import math
import time

import numpy as np

from petals_chain.bench.timing import best_of
from petals_chain.compose.capacity import max_concurrency
from petals_chain.compose.gbp_cr import gbp_cr
from petals_chain.compose.gca import gca
from petals_chain.compose.joint import joint_compose
from petals_chain.compose.tuning import tune_c
from petals_chain.bench.cluster import BLOOM, bench_servers

def run(argv: list[str] | None = None) -> int:
    """Print one row per J: GBP-CR and GCA at c=7, the full sweep c = 1..c_max with bounds, and the default
    composition's time new (pruned search) and old (exhaustive), their ratio and whether they chose the same."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.bench compose", description=__doc__)
    p.add_argument("--sizes", type=int, nargs="+", default=[100, 300, 1000, 10000])
    p.add_argument("--eta", type=float, default=0.2)
    p.add_argument("--rate-per-server", type=float, default=0.01,
                   help="λ = this × J (the paper's default is 0.2/s for J=20)")
    p.add_argument("--c", type=int, default=7, help="c for the single GBP-CR/GCA timings")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--default-max-j", type=int, default=10000,
                   help="time the default composition (c and chains chosen together) only up to this J")
    p.add_argument("--old-max-j", type=int, default=1000,
                   help="time the default's exhaustive search (as it first searched) only up to this J")
    p.add_argument("--churn", type=int, default=0, metavar="EVENTS",
                   help="instead: EVENTS joins and leaves through the orchestrator's code (bench/compose_churn.py)")
    p.add_argument("--churn-j", type=int, default=1000, help="servers in the churn scenario's swarm")
    p.add_argument("--mean-uptime-s", type=float, default=3600.0,
                   help="a volunteer server's mean time in the swarm, for the churn scenario's event rate")
    args = p.parse_args(argv)
    if args.churn < 0 or args.churn_j < 2 or not args.mean_uptime_s > 0:
        print("error: --churn must be >= 0, --churn-j >= 2 and --mean-uptime-s > 0")
        return 2
    if args.churn:
        from petals_chain.bench.compose_churn import churn

        return churn(args)
    rng = np.random.default_rng(args.seed)
    warm = bench_servers(20, args.eta, rng)
    gca(warm, BLOOM, gbp_cr(warm, BLOOM, args.c, 0.2))  # compile the numba kernels outside the timings
    joint_compose(warm, BLOOM, 0.2)
    print(f"L={BLOOM.num_blocks}, eta={args.eta}, lambda={args.rate_per_server}*J, c={args.c} for single runs; "
          "default: new = pruned search, old = exhaustive (search='exhaustive')")
    print(f"{'J':>6} {'c_max':>6} {'GBP-CR ms':>10} {'GCA ms':>9} {'chains':>7} {'sweep s':>8} {'c*':>4} "
          f"{'lower s':>8} {'new s':>7} {'old s':>7} {'old/new':>8} {'same':>5} {'estimated':>10} {'choice':>22}")
    for J in args.sizes:
        servers = bench_servers(J, args.eta, rng)
        lam = args.rate_per_server * J
        placement = gbp_cr(servers, BLOOM, args.c, lam)
        t_gbp = best_of(lambda s=servers, lam=lam: gbp_cr(s, BLOOM, args.c, lam), 3)
        chains = gca(servers, BLOOM, placement)
        t_gca = best_of(lambda s=servers, p=placement: gca(s, BLOOM, p), 3)
        t0 = time.perf_counter()
        tuning = tune_c(servers, BLOOM, lam)
        t_sweep = time.perf_counter() - t0
        point = next(pt for pt in tuning.curve if pt.c == tuning.c)
        t_new = t_old = math.nan
        new = old = None
        if J <= args.default_max_j:
            t0 = time.perf_counter()
            new = joint_compose(servers, BLOOM, lam).meta["joint"]
            t_new = time.perf_counter() - t0
        if J <= args.old_max_j:
            t0 = time.perf_counter()
            old = joint_compose(servers, BLOOM, lam, search="exhaustive").meta["joint"]
            t_old = time.perf_counter() - t0
        same = "-" if new is None or old is None else ("yes" if new == old else "NO")
        shown = new or old
        choice = "-" if shown is None else (f"c={shown.c} {shown.variant} k={shown.kept_chains} "
                                            f"e={shown.whole_model_chains}")
        print(f"{J:>6} {max_concurrency(servers, BLOOM):>6} {t_gbp * 1e3:>10.2f} {t_gca * 1e3:>9.2f} "
              f"{len(chains):>7} {t_sweep:>8.2f} {tuning.c:>4} {point.lower_s:>8.2f} {_s(t_new):>7} {_s(t_old):>7} "
              f"{_s(t_old / t_new, 1):>8} {same:>5} {shown.estimated_candidates if shown else '-':>10} {choice:>22}",
              flush=True)
        if same == "NO":
            print(f"       differ: new {new}\n               old {old}", flush=True)
    return 0


def _s(x: float, digits: int = 2) -> str:
    """x with ``digits`` decimals, '-' where it was not measured."""
    return "-" if math.isnan(x) else f"{x:.{digits}f}"
