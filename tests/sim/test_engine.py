"""The simulator: fast path == general engine, Little's law, M/M/c, Theorem 3.7, and JFFC vs the baselines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.dispatch import POLICY_NAMES, JFFCMigration, Start, make_policy
from petals_chain.sim.engine import SimResult, SimulationError, run_general, simulate
from petals_chain.kernels.jit import HAVE_NUMBA
from petals_chain.sim.montecarlo import PoissonPolicyRun, confidence_interval, run_replications
from petals_chain.sim.workloads import TokenServiceModel, Trace, Workload, poisson_workload, trace_workload

RATES = [2.0, 1.0, 1.0, 0.5, 0.3]
CAPS = [2, 3, 1, 4, 2]
NU = sum(r * c for r, c in zip(RATES, CAPS))
needs_numba = pytest.mark.skipif(not HAVE_NUMBA, reason="numba is not installed")


def assert_little(result: SimResult, window_rtol: float | None = None) -> None:
    """Little's law: exact over the whole run, and within ``window_rtol`` over the warm-up-free window."""
    assert result.littles_law_gap < 1e-9
    if window_rtol is not None:
        assert result.littles_law_window_gap < window_rtol


def erlang_c_mean_response_s(mu: float, c: int, lam: float) -> float:
    """Exact mean response time of M/M/c (Erlang C): P(wait) / (cμ - λ) + 1/μ."""
    a = lam / mu
    tail = a**c / math.factorial(c) * c / (c - a)
    p_wait = tail / (sum(a**k / math.factorial(k) for k in range(c)) + tail)
    return p_wait / (c * mu - lam) + 1.0 / mu


@needs_numba
@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_fast_path_reproduces_the_general_engine_exactly(policy: str) -> None:
    wl = poisson_workload(0.9 * NU, 4000, np.random.default_rng(1))
    fast = simulate(RATES, CAPS, wl, policy, rng=np.random.default_rng(7), warmup_jobs=400, engine="fast")
    slow = simulate(RATES, CAPS, wl, policy, rng=np.random.default_rng(7), warmup_jobs=400, engine="general")
    assert (fast.engine, slow.engine) == ("fast", "general")
    for field in fast.records.dtype.names:
        np.testing.assert_array_equal(fast.records[field], slow.records[field], err_msg=field)
    assert fast.area_window == slow.area_window
    assert_little(fast)
    assert_little(slow)
    if policy == "JFFC-migration":
        assert fast.records["migrations"].sum() > 0


@needs_numba
@pytest.mark.parametrize("policy", ["JFFC", "SED"])
def test_fast_path_matches_with_per_chain_token_service_times(policy: str) -> None:
    rng = np.random.default_rng(3)
    n = 3000
    trace = Trace(np.cumsum(rng.exponential(0.4, n)), rng.integers(10, 4000, n), rng.integers(1, 60, n))
    model = TokenServiceModel(np.linspace(0.2, 0.6, 5), np.full(5, 2e-4), np.linspace(0.01, 0.05, 5))
    wl = trace_workload(trace, service_model=model)
    fast = simulate(RATES, CAPS, wl, policy, rng=np.random.default_rng(2), engine="fast")
    slow = simulate(RATES, CAPS, wl, policy, rng=np.random.default_rng(2), engine="general")
    np.testing.assert_array_equal(fast.records["end_s"], slow.records["end_s"])
    ch = fast.records["chain"]
    np.testing.assert_allclose(fast.records["service_s"], wl.service_s[np.arange(n), ch], rtol=1e-9)
    assert_little(fast)


def test_records_are_consistent_and_warmup_is_dropped() -> None:
    wl = poisson_workload(0.7 * NU, 2000, np.random.default_rng(5))
    res = simulate(RATES, CAPS, wl, "JFFC", warmup_jobs=500)
    r = res.records
    assert r.size == 1500 and r["job"][0] == 500
    np.testing.assert_allclose(r["response_s"], r["waiting_s"] + r["service_s"], rtol=1e-12, atol=1e-12)
    assert np.all(r["waiting_s"] >= 0) and np.all(r["service_s"] > 0)
    # without migration a job's service time is its size over its chain's rate
    np.testing.assert_allclose(r["service_s"], wl.size[500:] / np.asarray(RATES)[r["chain"]], rtol=1e-9)
    assert_little(res, window_rtol=0.05)


def test_equal_times_process_the_departure_first() -> None:
    # job 0 ends at t = 1.0 exactly when job 1 arrives: job 1 must not wait
    wl = Workload(np.array([0.0, 1.0]), np.array([1.0, 1.0]))
    res = simulate([1.0], [1], wl, "JFFC", engine="general")
    assert res.records["waiting_s"].tolist() == [0.0, 0.0]


class OverbookingJFFC:
    """A deliberately wrong policy (starts every arrival on chain 0): the engine must refuse it."""

    name = "overbooking"

    def on_arrival(self, job: int, now: float) -> list[Start]:
        return [Start(job, 0)]

    def on_departure(self, job: int, chain: int, now: float) -> list[Start]:
        return []

    def queue_length(self) -> int:
        return 0

    def occupancy(self) -> list[int]:
        return []


def test_engine_refuses_a_policy_that_overfills_a_chain() -> None:
    wl = Workload(np.array([0.0, 0.1]), np.array([1.0, 1.0]))
    with pytest.raises(SimulationError, match="chain 0, which is full"):
        run_general(OverbookingJFFC(), [1.0], [1], wl)


def test_bad_simulate_arguments_are_named() -> None:
    wl = poisson_workload(1.0, 10, np.random.default_rng(0))
    with pytest.raises(ValueError, match="warmup_jobs"):
        simulate([1.0], [1], wl, warmup_jobs=10)
    with pytest.raises(ValueError, match="engine"):
        simulate([1.0], [1], wl, engine="turbo")
    bad = Workload(wl.arrival_s, wl.size, np.ones((10, 3)))
    with pytest.raises(ValueError, match="3 columns for 1 chains"):
        simulate([1.0], [1], bad)
    with pytest.raises(ValueError, match="not sorted at job 1"):
        Workload(np.array([1.0, 0.5]), np.array([1.0, 1.0]))


def _replicated_means(policy: str, rates: list[float], caps: list[int], lam: float, n_jobs: int,
                      reps: int, seed: int) -> np.ndarray:
    """Mean response per replication (same seed → same workloads for every policy: common random numbers)."""
    task = PoissonPolicyRun(tuple(rates), tuple(caps), policy, lam, n_jobs, warmup_fraction=0.1)
    rows = run_replications(task, reps, seed, workers=1, progress=False)
    for row in rows:
        assert row["littles_law_gap"] < 1e-9
        assert row["littles_law_window_gap"] < 0.05
    return np.array([row["mean_response_s"] for row in rows])


def test_jffc_on_one_chain_is_erlang_c() -> None:
    mu, c, lam = 1.0, 3, 2.1
    means = _replicated_means("JFFC", [mu], [c], lam, 60_000, 8, seed=11)
    ci = confidence_interval(means)
    exact = erlang_c_mean_response_s(mu, c, lam)
    assert ci.half_width < 0.03 * exact  # the check below is not vacuous
    assert abs(ci.mean - exact) < 2 * ci.half_width, (ci, exact)


def test_migration_attains_the_lower_bound_and_jffc_lies_between_the_bounds() -> None:
    rates, caps = [3.0, 1.0, 0.4], [2, 2, 3]
    lam = 0.8 * sum(r * c for r, c in zip(rates, caps))
    bounds = theorem37_bounds(rates, caps, lam)
    mig = confidence_interval(_replicated_means("JFFC-migration", rates, caps, lam, 60_000, 8, seed=5))
    jffc = confidence_interval(_replicated_means("JFFC", rates, caps, lam, 60_000, 8, seed=5))
    assert abs(mig.mean - bounds.lower_s) < 2 * mig.half_width + 1e-3 * bounds.lower_s, (mig, bounds)
    assert bounds.lower_s - 2 * jffc.half_width < jffc.mean < bounds.upper_s + 2 * jffc.half_width
    assert jffc.mean > mig.mean  # heterogeneous chains: JFFC really does leave jobs on slow chains


@pytest.mark.parametrize("other", ["JSQ", "SA-JSQ", "SED", "JIQ"])
def test_jffc_is_no_worse_than_the_per_chain_baselines(other: str) -> None:
    lam = 0.8 * NU
    jffc = _replicated_means("JFFC", RATES, CAPS, lam, 30_000, 6, seed=21)
    base = _replicated_means(other, RATES, CAPS, lam, 30_000, 6, seed=21)
    diff = confidence_interval(base - jffc)  # paired: same arrivals and sizes
    assert diff.ci_high > 0 and diff.mean > -diff.half_width, (other, diff)


def test_migration_is_no_worse_than_jffc_job_by_job_on_average() -> None:
    lam = 0.85 * NU
    jffc = _replicated_means("JFFC", RATES, CAPS, lam, 30_000, 6, seed=8)
    mig = _replicated_means("JFFC-migration", RATES, CAPS, lam, 30_000, 6, seed=8)
    diff = confidence_interval(jffc - mig)
    assert diff.mean > -diff.half_width, diff


def test_policy_objects_can_be_driven_directly() -> None:
    wl = poisson_workload(0.5 * NU, 500, np.random.default_rng(0))
    res = run_general(JFFCMigration(RATES, CAPS), RATES, CAPS, wl)
    assert res.policy == "JFFC-migration" and res.engine == "general"
    assert_little(res)
    res2 = run_general(make_policy("JIQ", RATES, CAPS, np.random.default_rng(1)), RATES, CAPS, wl)
    assert res2.records.size == 500
