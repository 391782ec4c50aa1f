"""The simulated JFFC mean matches the exact CTMC (K = 2 recursion and sparse solve) within Monte Carlo error."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.analysis.ctmc import ctmc_mean_response, exact_k2_mean_response
from petals_chain.sim.engine import simulate
from petals_chain.sim.workloads import poisson_workload


def _batch_means(rates, caps, lam, seed, n_jobs=400_000, batches=20):
    """Mean response and a 99 % half-width from batch means over one long run."""
    res = simulate(rates, caps, poisson_workload(lam, n_jobs, np.random.default_rng(seed)), "JFFC",
                   warmup_jobs=n_jobs // 20)
    parts = np.array_split(res.records["response_s"], batches)
    means = np.array([p.mean() for p in parts])
    return means.mean(), 2.86 * means.std(ddof=1) / np.sqrt(batches)


@pytest.mark.parametrize(
    ("rates", "caps", "load"),
    [((2.0, 0.5), (3, 3), 0.8), ((1.0, 0.7), (2, 4), 0.6), ((3.0, 1.0, 0.4), (2, 2, 3), 0.85)],
)
def test_simulated_jffc_matches_exact_ctmc(rates, caps, load):
    lam = load * sum(r * c for r, c in zip(rates, caps))
    exact = ctmc_mean_response(rates, caps, lam)
    if len(rates) == 2:
        assert exact_k2_mean_response(rates, caps, lam) == pytest.approx(exact, rel=1e-9)
    sim, half = _batch_means(rates, caps, lam, seed=len(rates) * 100 + caps[0])
    assert abs(sim - exact) <= max(half, 0.01 * exact), (sim, half, exact)
    b = theorem37_bounds(rates, caps, lam)
    assert b.lower_s <= exact <= b.upper_s
    assert b.lower_s < exact  # heterogeneous chains: the lower bound is strict
