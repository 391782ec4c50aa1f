"""Prints how long the analysis functions take (run: ``python -m petals_chain.analysis.benchmark``).

The c-tuning sweep calls ``theorem37_bounds`` thousands of times, so its per-call
time is the figure that matters; the exact solvers are timed for scale.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.analysis.ctmc import ctmc_mean_response, exact_k2_mean_response


def _per_call_s(fn: Callable[[], object], min_total_s: float = 0.5) -> float:
    """Best per-call time of ``fn`` (seconds) over 20 short batches (the machine is shared and throttled,
    so the minimum, as ``timeit`` advises, is the figure that reflects the code)."""
    fn()
    calls = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if time.perf_counter() - t0 >= min_total_s / 20:
            break
        calls *= 2
    samples = []
    for _ in range(20):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls)
    return min(samples)


def main(seed: int = 0, load: float = 0.7) -> None:
    """Time theorem37_bounds (K=100 with C=300 and C=30000 slots), the K=2 recursion, and the sparse CTMC."""
    rng = np.random.default_rng(seed)
    for k, c in [(100, 3), (100, 300), (1000, 1)]:
        rates = rng.uniform(0.1, 2.0, size=k)
        caps = np.full(k, c)
        lam = load * float(rates @ caps)
        t = _per_call_s(lambda: theorem37_bounds(rates, caps, lam))
        print(f"theorem37_bounds  K={k:5d} C={k * c:6d} load={load}: {t * 1e3:8.3f} ms/call")
    for c in (10, 100, 300):
        t = _per_call_s(lambda: exact_k2_mean_response([1.0, 0.6], [c, c], load * 1.6 * c), 0.2)
        print(f"exact_k2          c1=c2={c:4d} load={load}: {t * 1e3:8.3f} ms/call")
    for k, c in [(2, 30), (4, 6)]:
        rates = rng.uniform(0.1, 2.0, size=k)
        caps = np.full(k, c)
        t = _per_call_s(lambda: ctmc_mean_response(rates, caps, load * float(rates @ caps)), 0.2)
        print(f"ctmc (sparse)     K={k} c={c:3d} load={load}: {t * 1e3:8.3f} ms/call")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load", type=float, default=0.7)
    args = parser.parse_args()
    main(args.seed, args.load)
