"""The Poisson job stream of the queueing model: arrival times and Exp(1) job sizes, drawn in a fixed order.

The simulator's :func:`petals_chain.sim.workloads.poisson_workload` wraps these arrays in a validated
``Workload``; the recomposition's mean estimate (:mod:`petals_chain.analysis.estimate`) feeds them to the JFFC
kernel directly. Both draw through this one function, so the same generator state gives both the same jobs.
"""

from __future__ import annotations

import numpy as np

__all__ = ["poisson_jobs"]


def poisson_jobs(arrival_rate_per_s: float, n_jobs: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(arrival times, sizes): Poisson arrivals of rate λ from time 0 and i.i.d. Exp(1) sizes, inter-arrival gaps
    drawn first, then sizes. The caller checks λ > 0 and ``n_jobs`` >= 1."""
    gaps = rng.exponential(1.0 / arrival_rate_per_s, n_jobs)
    sizes = rng.exponential(1.0, n_jobs)
    return np.cumsum(gaps), sizes
