"""The distance to the limit: measured μ per chain from replay records, Theorem 3.7 bounds, the verdict line."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.experiments.limit import chain_route, distance_to_limit, plot_limits
from petals_chain.experiments.replay import RequestRecord

CHAINS = [{"spans": [{"server": "a", "start": 0, "end": 30}], "capacity": 2, "service_time_s": 1.0},
          {"spans": [{"server": "b", "start": 0, "end": 12}, {"server": "c", "start": 12, "end": 30}], "capacity": 1,
           "service_time_s": 3.0}]


def _rec(i: int, arrival: float, service: float, route: str, wait: float = 0.0, **kw) -> RequestRecord:
    start = arrival + wait
    return RequestRecord("proposed", i, arrival, start, start + service, wait, service, wait + service, 10, 5, 5, 0,
                         0.0, route, **kw)


def test_bounds_use_measured_service_rates_and_the_replayed_rate() -> None:
    assert chain_route(CHAINS[1]) == "b[0:12] -> c[12:30]"
    recs = [_rec(i, 2.0 * i, 2.0, chain_route(CHAINS[0])) for i in range(10)]  # measured 2 s, not the predicted 1 s
    check = distance_to_limit(recs, CHAINS)
    expected = theorem37_bounds([0.5, 1.0 / 3.0], [2, 1], 0.5)  # λ = 9 gaps over 18 s
    assert check.lower_s == pytest.approx(expected.lower_s) and check.upper_s == pytest.approx(expected.upper_s)
    assert check.measured_s == pytest.approx(2.0) and check.chains_used == 1 and check.chains_offered == 2
    # evenly spaced arrivals and constant service never queue: below the Markovian lower bound, and said so
    assert "below the lower bound" in check.describe() and "0.91× the lower bound" in check.describe()
    slow = [_rec(i, 2.0 * i, 2.0, chain_route(CHAINS[0]), wait=30.0) for i in range(10)]
    assert "above the upper bound" in distance_to_limit(slow, CHAINS).describe()


def test_errors_and_censored_records_do_not_set_the_rates_and_overload_has_no_bound(tmp_path) -> None:
    recs = [_rec(i, 0.1 * i, 2.0, chain_route(CHAINS[0])) for i in range(10)]  # λ = 10/s ≫ 2/2 + 1/3
    check = distance_to_limit(recs, CHAINS)
    assert check.lower_s is None and "no bound" in check.describe() and "total service rate" in check.note
    bad = [_rec(0, 0.0, 100.0, chain_route(CHAINS[0]), error="boom"), _rec(1, 10.0, 1.0, chain_route(CHAINS[0]))]
    assert distance_to_limit(bad, CHAINS[:1]).lower_s == pytest.approx(theorem37_bounds([1.0], [2], 0.1).lower_s)
    assert distance_to_limit([], CHAINS).lower_s is None and math.isnan(distance_to_limit([], CHAINS).measured_s)
    out = plot_limits(tmp_path / "limit.png", {"proposed": check, "ok": distance_to_limit(bad, CHAINS[:1])}, "t")
    assert out.stat().st_size > 1000


def test_one_chain_bounds_coincide_and_are_labelled_as_its_exact_mean() -> None:
    """With one chain the two bounds are one number (its M/M/c mean): a mean a hair above it, inside its own 95 %
    interval, is 'at' it, not 'above the upper bound'; without an interval the line says it cannot tell."""
    recs = [_rec(i, 2.0 * i, 1.9 + 0.2 * (i % 2), chain_route(CHAINS[0])) for i in range(10)]
    check = distance_to_limit(recs, CHAINS[:1])
    assert check.degenerate and check.requests == 10 and check.measured_ci95_half_s > 0
    exact = replace(check, measured_s=check.lower_s + 0.006)
    assert "at the exact M/M/c mean" in exact.describe() and "coincide" in exact.describe()
    assert "above the upper bound" not in exact.describe()
    far = replace(check, measured_s=check.lower_s + 10 * check.measured_ci95_half_s)
    assert "above the exact M/M/c mean" in far.describe()
    unknown = replace(check, measured_s=check.lower_s + 0.006, measured_ci95_half_s=math.nan)
    assert "no interval to tell noise from a gap" in unknown.describe()
    two = [_rec(i, 2.0 * i, 2.0 + 2.0 * (i % 2), chain_route(CHAINS[i % 2])) for i in range(10)]  # two speeds
    assert not distance_to_limit(two, CHAINS).degenerate
