"""``python -m petals_chain.bench sim``: simulated jobs per second for JFFC, ours vs the same model in SimPy.

Chains: K = 20 and K = 200 with rates drawn uniformly in [0.2, 2] /s (seeded)
and capacity 5 each; Poisson arrivals at load 0.8 with Exp(1) sizes. Times
the numba fast path, the general (pure Python) engine and a SimPy model of
JFFC on the same arrivals, and checks that the three agree on the responses.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from petals_chain.bench.timing import best_time
from petals_chain.sim.engine import simulate
from petals_chain.kernels.jit import HAVE_NUMBA
from petals_chain.sim.workloads import Workload, poisson_workload


def bench_chains(num_chains: int, capacity: int, rng: np.random.Generator) -> tuple[list[float], list[int]]:
    """Mixed chain rates μ_k ~ U[0.2, 2] /s and one capacity for all."""
    return rng.uniform(0.2, 2.0, num_chains).tolist(), [capacity] * num_chains


def simpy_jffc(rates: Sequence[float], capacities: Sequence[int], workload: Workload) -> np.ndarray:
    """JFFC written in SimPy: slots in a PriorityStore keyed by speed rank, FIFO getters = the central queue.

    Returns the response time of every job. A job takes the best free slot (the
    fastest chain) or waits in SimPy's FIFO get queue; a finished job puts its
    slot back, which goes straight to the head of the queue.
    """
    import simpy

    env = simpy.Environment()
    slots = simpy.PriorityStore(env)
    order = sorted(range(len(rates)), key=lambda k: (-rates[k], k))
    for rank, k in enumerate(order):
        for _ in range(capacities[k]):
            slots.put(simpy.PriorityItem(rank, k))
    arrival = workload.arrival_s.tolist()
    size = workload.size.tolist()
    response = np.empty(workload.n_jobs)

    def job(i: int):  # noqa: ANN202 - SimPy process generator
        slot = yield slots.get()
        yield env.timeout(size[i] / rates[slot.item])
        slots.put(slot)
        response[i] = env.now - arrival[i]

    def source():  # noqa: ANN202 - SimPy process generator
        for i, t in enumerate(arrival):
            yield env.timeout(t - env.now)
            env.process(job(i))

    env.process(source())
    env.run()
    return response


def _head(workload: Workload, n: int) -> Workload:
    """The first ``n`` jobs of a workload."""
    return Workload(workload.arrival_s[:n], workload.size[:n])


def run(argv: list[str] | None = None) -> int:
    """Print jobs/s for each engine and K, the fast/SimPy ratio, and optionally write JSON."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.bench sim", description=__doc__)
    p.add_argument("--chains", type=int, nargs="+", default=[20, 200])
    p.add_argument("--capacity", type=int, default=5)
    p.add_argument("--load", type=float, default=0.8)
    p.add_argument("--jobs", type=int, default=1_000_000, help="jobs for the fast engine")
    p.add_argument("--slow-jobs", type=int, default=100_000, help="jobs for SimPy and the general engine")
    p.add_argument("--repeat", type=int, default=3, help="best of this many runs, every engine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = p.parse_args(argv)
    if not HAVE_NUMBA:
        print("warning: numba is not installed; 'fast' falls back to the general engine")
    rng = np.random.default_rng(args.seed)
    rows = []
    print(f"JFFC, capacity {args.capacity} per chain, load {args.load}, Exp(1) sizes; best of {args.repeat}")
    print(f"{'K':>5} {'engine':>8} {'jobs':>9} {'seconds':>8} {'jobs/s':>11} {'mean resp s':>12}")
    for num_chains in args.chains:
        rates, caps = bench_chains(num_chains, args.capacity, rng)
        lam = args.load * float(np.dot(rates, caps))
        wl = poisson_workload(lam, max(args.jobs, args.slow_jobs), rng)
        small = _head(wl, args.slow_jobs)
        simulate(rates, caps, _head(wl, 1000), "JFFC", engine="fast")  # JIT compile / cache load, untimed
        runs = {
            "fast": (args.jobs, lambda: simulate(rates, caps, _head(wl, args.jobs), "JFFC", engine="fast")),
            "general": (args.slow_jobs, lambda: simulate(rates, caps, small, "JFFC", engine="general")),
            "simpy": (args.slow_jobs, lambda: simpy_jffc(rates, caps, small)),
        }
        figures = {}
        for engine, (n, fn) in runs.items():
            seconds, value = best_time(fn, args.repeat)
            mean = float(np.mean(value)) if engine == "simpy" else value.mean_response_s
            figures[engine] = {"jobs": n, "seconds": seconds, "jobs_per_s": n / seconds}
            print(f"{num_chains:>5} {engine:>8} {n:>9} {seconds:>8.3f} {n / seconds:>11,.0f} {mean:>12.4f}")
        check = simulate(rates, caps, small, "JFFC")
        gap = float(np.max(np.abs(check.records["response_s"] - simpy_jffc(rates, caps, small))))
        ratio = figures["fast"]["jobs_per_s"] / figures["simpy"]["jobs_per_s"]
        print(f"{num_chains:>5} fast/SimPy = {ratio:.1f}x; fast/general = "
              f"{figures['fast']['jobs_per_s'] / figures['general']['jobs_per_s']:.1f}x; "
              f"max |response(ours) - response(SimPy)| on the same {args.slow_jobs} jobs = {gap:.2e} s")
        rows.append({"chains": num_chains, "capacity": args.capacity, "load": args.load, "arrival_rate_per_s": lam,
                     **{f"{e}_{k}": v for e, f in figures.items() for k, v in f.items()},
                     "fast_over_simpy": ratio, "max_response_gap_s": gap})
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"command": "python -m petals_chain.bench sim", "args": vars(args) | {
            "out": str(args.out)}, "rows": rows}, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0
