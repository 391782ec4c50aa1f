"""The estimated JFFC mean that decides between candidate compositions: exact where cheap, else simulated."""

from __future__ import annotations

import math

import numpy as np
import pytest

from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.analysis.ctmc import ctmc_mean_response, erlang_c_mean_response, exact_k2_mean_response
from petals_chain.analysis.estimate import jffc_mean_estimate
from petals_chain.model import SpecError


def test_equal_rates_are_lumped_into_erlang_c():
    est = jffc_mean_estimate([0.5, 0.5, 0.5], [2, 1, 3], 2.0)
    assert est.how == "erlang-c"
    assert est.mean_s == pytest.approx(erlang_c_mean_response(0.5, 6, 2.0), rel=1e-12)


def test_two_rates_are_exact():
    rates, caps, lam = [1.0, 0.4, 1.0], [2, 3, 1], 2.2
    est = jffc_mean_estimate(rates, caps, lam)
    assert est.how == "exact-k2"
    assert est.mean_s == pytest.approx(exact_k2_mean_response([1.0, 0.4], [3, 3], lam), rel=1e-12)
    assert est.mean_s == pytest.approx(ctmc_mean_response(rates, caps, lam), rel=1e-8)


@pytest.mark.parametrize("seed", range(4))
def test_simulated_estimate_is_near_the_exact_ctmc_and_within_the_bounds(seed):
    rng = np.random.default_rng(seed)
    rates = sorted(rng.uniform(0.05, 0.2, 3), reverse=True)
    caps = [int(c) for c in rng.integers(1, 4, 3)]
    lam = float(rng.uniform(0.3, 0.6)) * float(np.dot(rates, caps))  # noise grows with the load: ~3 % at 0.76
    est = jffc_mean_estimate(rates, caps, lam)
    assert est.how == "simulation"
    exact = ctmc_mean_response(rates, caps, lam)
    assert est.mean_s == pytest.approx(exact, rel=0.05)  # one seed: its noise (a few % with single slots)
    over_seeds = np.mean([jffc_mean_estimate(rates, caps, lam, seed=s).mean_s for s in range(1, 9)])
    assert over_seeds == pytest.approx(exact, rel=0.01)  # and no bias
    b = theorem37_bounds(rates, caps, lam)
    assert b.lower_s * 0.98 <= est.mean_s <= b.upper_s * 1.02
    assert jffc_mean_estimate(rates, caps, lam) == est  # one seeded workload: the same answer every time


def test_unstable_and_bad_input():
    assert jffc_mean_estimate([1.0, 0.5, 0.2], [1, 1, 1], 1.7).mean_s == math.inf
    with pytest.raises(SpecError, match="n_jobs"):
        jffc_mean_estimate([1.0, 0.5, 0.2], [1, 1, 1], 0.5, n_jobs=10)
    with pytest.raises(SpecError, match="arrival_rate"):
        jffc_mean_estimate([1.0], [1], 0.0)
    with pytest.raises(SpecError, match="capacities"):
        jffc_mean_estimate([1.0], [0], 0.5)


@pytest.mark.parametrize("engine", ["auto", "general"])
def test_simulated_estimate_is_the_simulators_jffc_run(engine):
    """The estimate runs the chain kernel directly; it gives, to the last bit, what the simulator's JFFC gives on
    the same seeded Poisson jobs (numba kernel or Python policy objects): waiting + 1/μ of the chain, after warm-up."""
    from petals_chain.analysis.estimate import WARMUP_FRACTION
    from petals_chain.sim.engine import simulate
    from petals_chain.sim.workloads import Workload, poisson_workload

    rates, caps, lam, n_jobs, seed = (1.5, 1.0, 0.6), (1, 2, 2), 3.1, 3000, 11
    est = jffc_mean_estimate(rates, caps, lam, n_jobs=n_jobs, seed=seed)
    unit = poisson_workload(1.0, n_jobs, np.random.default_rng(seed))
    res = simulate(rates, caps, Workload(unit.arrival_s / lam, unit.size), "JFFC",
                   warmup_jobs=int(WARMUP_FRACTION * n_jobs), engine=engine)
    rec = res.records
    assert est.how == "simulation"
    assert est.mean_s == float(np.mean(rec["waiting_s"] + 1.0 / np.asarray(rates)[rec["chain"]]))
