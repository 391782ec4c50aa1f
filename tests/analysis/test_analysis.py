"""Tests for petals_chain.analysis: Theorem 3.7 bounds vs the exact JFFC CTMC, K=2 recursion, Erlang C."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from petals_chain.analysis.bounds import ResponseBounds, birth_death_mean_jobs, theorem37_bounds
from petals_chain.analysis.ctmc import (
    ctmc_mean_response,
    erlang_c_mean_response,
    exact_k2_mean_response,
    exact_k2_stationary,
)
from petals_chain.model import SpecError


def _random_system(rng: np.random.Generator, k_max: int, c_max: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Random chains (rates in [0.2, 5], capacities 1..c_max) and an arrival rate at load 0.05..0.95."""
    k = int(rng.integers(1, k_max + 1))
    rates = rng.uniform(0.2, 5.0, size=k)
    caps = rng.integers(1, c_max + 1, size=k)
    lam = float(rng.uniform(0.05, 0.95) * np.dot(rates, caps))
    return rates, caps, lam


def test_bounds_bracket_exact_ctmc_on_random_systems() -> None:
    """lower ≤ exact JFFC ≤ upper on 60 random small systems (K ≤ 4, c ≤ 3)."""
    rng = np.random.default_rng(20240601)
    strict = 0
    for _ in range(60):
        rates, caps, lam = _random_system(rng, k_max=4, c_max=3)
        exact = ctmc_mean_response(rates, caps, lam)
        b = theorem37_bounds(rates, caps, lam)
        assert b.lower_s <= exact * (1 + 1e-9), (rates, caps, lam)
        assert exact <= b.upper_s * (1 + 1e-9), (rates, caps, lam)
        strict += b.lower_s < exact * (1 - 1e-9)
    assert strict > 0  # heterogeneous systems do leave a gap


def test_k2_recursion_matches_numeric_ctmc() -> None:
    """The O(c1·c2) level recursion equals the sparse CTMC solve to 1e-9 relative."""
    rng = np.random.default_rng(7)
    for _ in range(40):
        rates = rng.uniform(0.2, 5.0, size=2)
        caps = rng.integers(1, 9, size=2)
        lam = float(rng.uniform(0.05, 0.97) * np.dot(rates, caps))
        exact = exact_k2_mean_response(rates, caps, lam)
        numeric = ctmc_mean_response(rates, caps, lam)
        assert exact == pytest.approx(numeric, rel=1e-9), (rates, caps, lam)


def test_k2_recursion_is_order_free_and_sums_to_one() -> None:
    """Chains given slow-first give the same answer; the stationary law sums to 1."""
    st = exact_k2_stationary([0.5, 2.0], [4, 3], 5.0)
    assert st.rates == (2.0, 0.5) and st.capacities == (3, 4)
    assert st.grid.shape == (4, 5)
    assert st.grid.sum() + st.queue_mass == pytest.approx(1.0, rel=1e-12)
    assert exact_k2_mean_response([0.5, 2.0], [4, 3], 5.0) == pytest.approx(
        exact_k2_mean_response([2.0, 0.5], [3, 4], 5.0), rel=1e-13
    )


def test_k2_fast_chain_marginal_is_erlang_loss_shaped() -> None:
    """Row sums over the slow chain satisfy P(z_f = n+1) / P(z_f = n) = λ / ((n+1) μ_f) (cut balance)."""
    lam, mu_f = 3.0, 1.5
    st = exact_k2_stationary([mu_f, 0.4], [5, 6], lam)
    rows = st.grid.sum(axis=1)
    n = np.arange(5)
    np.testing.assert_allclose(rows[1:] / rows[:-1], lam / ((n + 1) * mu_f), rtol=1e-10)


def test_appendix_a3_jobs_not_always_on_fastest_chain() -> None:
    """Stationary mass with the fast chain not full while the slow chain is busy is > 0, so lower < exact."""
    rates, caps, lam = [2.0, 0.5], [3, 3], 4.0
    st = exact_k2_stationary(rates, caps, lam)
    c_fast = st.capacities[0]
    off_fastest = float(st.grid[:c_fast, 1:].sum())
    assert off_fastest > 1e-3
    # The CTMC solve agrees and the Theorem 3.7 lower bound (jobs always on the fastest slots) is strict.
    exact = st.mean_jobs / lam
    assert exact == pytest.approx(ctmc_mean_response(rates, caps, lam), rel=1e-9)
    assert theorem37_bounds(rates, caps, lam).lower_s < exact * (1 - 1e-6)


@pytest.mark.parametrize(("rate", "servers", "load"), [(2.0, 1, 0.5), (2.0, 5, 0.7), (0.3, 12, 0.95), (1.0, 40, 0.2)])
def test_k1_bounds_and_ctmc_equal_erlang_c(rate: float, servers: int, load: float) -> None:
    """With one chain both bounds and the CTMC are the M/M/c queue."""
    lam = load * rate * servers
    ref = erlang_c_mean_response(rate, servers, lam)
    b = theorem37_bounds([rate], [servers], lam)
    assert b.lower_s == b.upper_s
    assert b.lower_s == pytest.approx(ref, rel=1e-12)
    assert ctmc_mean_response([rate], [servers], lam) == pytest.approx(ref, rel=1e-9)


def test_mm1_closed_form() -> None:
    """M/M/1: E[N] = ρ/(1-ρ) from the birth-death helper and 1/(μ-λ) from Erlang C."""
    assert birth_death_mean_jobs(3.0, np.array([4.0]), 4.0) == pytest.approx(3.0, rel=1e-14)
    assert erlang_c_mean_response(4.0, 1, 3.0) == pytest.approx(1.0, rel=1e-14)


def test_birth_death_helper_matches_direct_sum() -> None:
    """The log-space helper equals a plain truncated sum for an arbitrary death-rate sequence."""
    rng = np.random.default_rng(3)
    death = np.sort(rng.uniform(0.5, 3.0, size=7))
    total = float(death[-1]) + 0.5
    lam = 0.8 * total
    n_max = 4000
    d_full = np.concatenate([death, np.full(n_max - death.size, total)])
    phi = np.concatenate([[1.0], np.cumprod(lam / d_full)])
    direct = float(np.arange(n_max + 1) @ phi / phi.sum())
    assert birth_death_mean_jobs(lam, death, total) == pytest.approx(direct, rel=1e-12)


def test_homogeneous_rates_give_equal_bounds_equal_erlang_c() -> None:
    """Equal rates across chains: ν̄ = ν̲, so lower == upper == M/M/C with C = Σ c_k."""
    caps = [3, 1, 4, 2]
    lam = 0.8 * 1.7 * sum(caps)
    b = theorem37_bounds([1.7] * 4, caps, lam)
    assert b.lower_s == b.upper_s
    assert b.lower_s == pytest.approx(erlang_c_mean_response(1.7, sum(caps), lam), rel=1e-12)


def test_large_capacity_and_heavy_load_are_finite_without_warnings() -> None:
    """C = 5000 at ρ = 0.999 (one chain and many chains) is finite, warning-free, and correct for K=1."""
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        lam = 0.999 * 5000 * 1.3
        one = theorem37_bounds([1.3], [5000], lam)
        assert one.lower_s == pytest.approx(erlang_c_mean_response(1.3, 5000, lam), rel=1e-10)
        rng = np.random.default_rng(11)
        rates = rng.uniform(0.1, 10.0, size=250)
        caps = np.full(250, 20)
        many = theorem37_bounds(rates, caps, 0.999 * float(rates @ caps))
        assert math.isfinite(many.lower_s) and math.isfinite(many.upper_s)
        assert 0 < many.lower_s < many.upper_s
        # Very light load on a big system: response time tends to the fastest service time.
        light = theorem37_bounds(rates, caps, 1e-6)
        assert light.lower_s == pytest.approx(1 / rates.max(), rel=1e-4)


def test_bounds_monotone_in_arrival_rate_and_chain_order_is_irrelevant() -> None:
    """Lower bound and both mean occupancies (λ·T) grow with λ; permuting the chains changes nothing.

    The upper *response time* need not grow: at light load it tends to 1/μ_slowest
    and first falls as jobs spread onto faster slots, so only λ·upper is checked.
    """
    rates = np.array([0.4, 2.5, 1.1, 0.9])
    caps = np.array([2, 3, 5, 1])
    nu = float(rates @ caps)
    prev_lower, prev_n_low, prev_n_up = 0.0, 0.0, 0.0
    for lam in np.linspace(0.02, 0.99, 50) * nu:
        b = theorem37_bounds(rates, caps, lam)
        assert b.lower_s > prev_lower
        assert lam * b.lower_s > prev_n_low and lam * b.upper_s > prev_n_up
        assert b.lower_s <= b.upper_s
        prev_lower, prev_n_low, prev_n_up = b.lower_s, lam * b.lower_s, lam * b.upper_s
    assert theorem37_bounds(rates, caps, 1e-9).upper_s == pytest.approx(1 / rates.min(), rel=1e-6)
    perm = [2, 0, 3, 1]
    assert theorem37_bounds(rates[perm], caps[perm], 0.6 * nu) == theorem37_bounds(rates, caps, 0.6 * nu)


def test_unstable_gives_infinity() -> None:
    """λ ≥ ν is not an error: every mean response time is infinite."""
    assert theorem37_bounds([1.0, 2.0], [1, 1], 3.0) == ResponseBounds(math.inf, math.inf)
    assert ctmc_mean_response([1.0, 2.0], [1, 1], 3.5) == math.inf
    assert exact_k2_mean_response([1.0, 2.0], [1, 1], 3.0) == math.inf
    assert erlang_c_mean_response(1.0, 2, 2.0) == math.inf
    assert birth_death_mean_jobs(2.0, [1.0, 2.0], 2.0) == math.inf


@pytest.mark.parametrize(
    ("rates", "caps", "lam", "match"),
    [
        ([1.0, -2.0], [1, 1], 1.0, r"rates\[1\]"),
        ([1.0, float("nan")], [1, 1], 1.0, r"rates\[1\]"),
        ([1.0, float("inf")], [1, 1], 1.0, r"rates\[1\]"),
        ([], [], 1.0, "rates"),
        ([1.0, 2.0], [1], 1.0, "capacities"),
        ([1.0, 2.0], [1, 0], 1.0, r"capacities\[1\]"),
        ([1.0, 2.0], [2.5, 1], 1.0, r"capacities\[0\]"),
        ([1.0, 2.0], [1, 1], 0.0, "arrival_rate"),
        ([1.0, 2.0], [1, 1], -1.0, "arrival_rate"),
        ([1.0, 2.0], [1, 1], float("nan"), "arrival_rate"),
    ],
)
def test_bad_input_is_rejected_with_named_field(rates: list, caps: list, lam: float, match: str) -> None:
    """Every entry point names the offending argument."""
    for fn in (theorem37_bounds, ctmc_mean_response):
        with pytest.raises(SpecError, match=match):
            fn(rates, caps, lam)
    if len(rates) == 2:
        with pytest.raises(SpecError, match=match):
            exact_k2_mean_response(rates, caps, lam)


def test_other_bad_inputs() -> None:
    """Erlang C, the birth-death helper, K≠2 for the recursion, and oversized CTMCs are refused clearly."""
    with pytest.raises(SpecError, match="servers"):
        erlang_c_mean_response(1.0, 0, 0.5)
    with pytest.raises(SpecError, match="rate"):
        erlang_c_mean_response(0.0, 2, 0.5)
    with pytest.raises(SpecError, match=r"death_rates\[1\]"):
        birth_death_mean_jobs(1.0, [2.0, 0.0], 3.0)
    with pytest.raises(SpecError, match="total_rate"):
        birth_death_mean_jobs(1.0, [2.0], -3.0)
    with pytest.raises(SpecError, match="exactly 2 chains"):
        exact_k2_stationary([1.0, 2.0, 3.0], [1, 1, 1], 1.0)
    with pytest.raises(SpecError, match="max_states"):
        ctmc_mean_response([1.0] * 8, [9] * 8, 1.0)
