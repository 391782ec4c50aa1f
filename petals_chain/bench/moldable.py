"""``python -m petals_chain.bench moldable``: arrivals/s of the moldable loss-system simulator at n = 4000, and
the time of Theorem 1 and of the multi-class water-fill (10³ classes), each against HiGHS in the same run."""

from __future__ import annotations

import argparse

import numpy as np

from petals_chain.bench.timing import best_of
from petals_chain.moldable.optimal import JobClass, lp_allocation, lp_classes, optimal_allocation, water_fill
from petals_chain.moldable.sim import MoldableRun, regime_load
from petals_chain.moldable.speedup import SpeedUp, amdahl

SUB = (1.0, 1.8, 2.5, 3.0, 3.4)


def run(argv: list[str] | None = None) -> int:
    """Print the figures; returns 0."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.bench moldable", description=__doc__)
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--arrivals", type=float, default=5e6, help="arrivals of the timed run (default 5e6)")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    MoldableRun(100, 0.8, SUB, "greedy-p", "exp", 1000)(0)  # compile (or load the numba cache) outside the timing
    print(f"simulator, n = {args.n}, {args.arrivals:.0e} arrivals per run, one core:")
    for label, load, dist in (("sub-linear, mean field, exp", 0.8, "exp"),
                              ("sub-linear, Halfin-Whitt, pareto", regime_load(args.n, 0.5, 0.1), "pareto")):
        task = MoldableRun(args.n, load, SUB, "greedy-p", dist, int(args.arrivals))
        t = best_of(lambda: task(args.seed), 1)
        print(f"  {label:34s} {t:6.2f} s  = {args.arrivals / t / 1e6:5.2f} M arrivals/s")
    rng = np.random.default_rng(args.seed)
    sp = SpeedUp(SUB)
    t_closed = best_of(lambda: optimal_allocation(sp, 0.8), 200)
    t_lp = best_of(lambda: lp_allocation(sp, 0.8), 20)
    print(f"Theorem 1 (d = 5): {t_closed * 1e6:8.1f} µs; HiGHS on the same LP {t_lp * 1e6:8.1f} µs "
          f"(closed form {t_lp / t_closed:.0f}× faster)")
    classes = [JobClass(amdahl(int(rng.integers(2, 17)), float(rng.uniform(0.5, 0.99))),
                        float(w), 1.0) for w in rng.dirichlet(np.ones(args.classes)) * 0.9]
    t_wf = best_of(lambda: water_fill(classes), 3)
    t_q = best_of(lambda: lp_classes(classes), 1)
    gap = abs(water_fill(classes).execution_time - lp_classes(classes))
    print(f"water-fill, {args.classes} classes (Amdahl, d ≤ 16): {t_wf * 1e3:8.1f} ms; HiGHS on (Q) "
          f"{t_q * 1e3:8.1f} ms ({t_q / t_wf:.1f}× the water-fill); |ΔD*| = {gap:.1e}")
    return 0
