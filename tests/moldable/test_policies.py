"""greedy(p*) and greedy as an allocation rule and behind the dispatch protocol."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.dispatch.base import DispatchPolicy
from petals_chain.model import SpecError
from petals_chain.moldable.policies import MoldableDispatch, allocate, scheme_probabilities
from petals_chain.moldable.speedup import from_table, linear

SUB = from_table([1, 1.8, 2.5, 3, 3.4])


def test_greedy_p_draws_p_star_and_greedy_takes_d() -> None:
    rng = np.random.default_rng(0)
    p = scheme_probabilities(SUB, 0.8, "greedy-p")
    draws = np.array([allocate(p, 100, rng) for _ in range(20_000)])
    assert set(draws) == {3, 4}
    assert abs(np.mean(draws == 3) - 0.625) < 0.015
    g = scheme_probabilities(SUB, 0.8, "greedy")
    assert [allocate(g, idle, rng) for idle in (0, 2, 5, 9)] == [0, 2, 5, 5]
    assert allocate(p, 0, rng) == 0
    np.testing.assert_array_equal(scheme_probabilities(linear(5), 0.8, "greedy-p"),
                                  scheme_probabilities(linear(5), 0.8, "greedy"))
    with pytest.raises(SpecError, match="scheme"):
        scheme_probabilities(SUB, 0.8, "random")


def test_dispatch_protocol_blocks_when_full_and_frees_on_departure() -> None:
    pol = MoldableDispatch(6, SUB, 0.8, "greedy", np.random.default_rng(1))
    assert isinstance(pol, DispatchPolicy)
    first = pol.on_arrival(0, 0.0)
    assert len(first) == 5 and {s.job for s in first} == {0}
    assert len(pol.on_arrival(1, 0.1)) == 1  # min(d, idle) = 1
    assert pol.on_arrival(2, 0.2) == [] and pol.blocked == 1
    assert sum(pol.occupancy()) == 6 and pol.queue_length() == 0
    assert pol.on_departure(0, first[0].chain, 1.0) == []
    assert sum(pol.occupancy()) == 1 and pol.servers_of(0) == 0
    with pytest.raises(SpecError, match="not in service"):
        pol.on_departure(0, first[0].chain, 1.0)
    with pytest.raises(SpecError, match="n"):
        MoldableDispatch(0, SUB, 0.8, "greedy", np.random.default_rng(1))
