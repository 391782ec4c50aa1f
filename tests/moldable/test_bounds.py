"""The Stein bounds: their values at n = 4000, and a simulated greedy(p*) inside them when |I*| = 1."""

from __future__ import annotations

import pytest

from petals_chain.model import SpecError
from petals_chain.moldable.bounds import lemma3_tail, stein_bounds
from petals_chain.moldable.sim import MoldableRun, regime_load
from petals_chain.moldable.speedup import from_table, linear


def test_bounds_numbers_at_4000() -> None:
    lam = regime_load(4000, 0.5, 0.1)
    b = stein_bounds(linear(5), 4000, lam)
    assert b.distance == pytest.approx(0.0744, abs=1e-4)
    assert b.blocking == pytest.approx(0.373, abs=1e-3)
    sub = stein_bounds(from_table([1, 1.8, 2.5, 3, 3.4]), 4000, 0.8)
    assert sub.drift > 0.8 and sub.blocking == 1.0  # vacuous when |I*| = 2
    assert 0 < lemma3_tail(linear(5), 4000, lam, 0.001, 0.01) <= 1


def test_simulated_single_support_inside_bounds() -> None:
    n, lam = 1000, regime_load(1000, 0.5, 0.1)
    row = MoldableRun(n, lam, linear(5).s, "greedy-p", "exp", 300_000)(11)
    b = stein_bounds(linear(5), n, lam)
    assert row["blocking"] <= b.blocking
    assert row["exec_time_all"] - 0.2 <= b.execution_gap_single + 0.003


def test_bad_arguments() -> None:
    with pytest.raises(SpecError, match="delta"):
        stein_bounds(linear(5), 100, 0.8, delta=0.5)
    with pytest.raises(SpecError, match="n"):
        stein_bounds(linear(5), 0, 0.8)
