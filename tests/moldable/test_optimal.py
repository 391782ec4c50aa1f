"""Theorem 1 and the multi-class water-fill against their LPs solved by HiGHS; infeasible loads."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.moldable.optimal import (JobClass, LoadError, lp_allocation, lp_classes, optimal_allocation,
                                           segment_gains, water_fill)
from petals_chain.moldable.speedup import SpeedUp, from_table, linear

SUB = from_table([1, 1.8, 2.5, 3, 3.4])


def random_speedup(rng: np.random.Generator) -> SpeedUp:
    """A random concave speed-up; increments are drawn from a coarse grid so that ties and linear stretches
    (equal increments, hence equal a_i runs) are frequent."""
    d = int(rng.integers(1, 9))
    inc = np.sort(rng.choice([1.0, 0.75, 0.5, 0.5, 0.25, 0.125, 0.05], size=d - 1))[::-1] if d > 1 else np.array([])
    if rng.random() < 0.3:  # a linear start: s_2 = 2
        inc[: int(rng.integers(0, d))] = 1.0
        inc = np.sort(inc)[::-1]
    return SpeedUp(tuple(np.concatenate([[1.0], 1.0 + np.cumsum(inc)])))


def test_paper_example_sub_linear_mean_field() -> None:
    alloc = optimal_allocation(SUB, 0.8)
    np.testing.assert_allclose(alloc.y, [0, 0, 0.2, 0.1, 0], atol=1e-12)
    np.testing.assert_allclose(alloc.p, [0, 0, 0.625, 0.375, 0], atol=1e-12)
    assert alloc.execution_time == pytest.approx(0.375, abs=1e-12)
    assert alloc.support == (3, 4)


def test_published_halfin_whitt_numbers() -> None:
    alloc = optimal_allocation(SUB, 1 - 0.1 / np.sqrt(4000))
    assert alloc.execution_time == pytest.approx(0.99367, abs=1e-5)
    np.testing.assert_allclose(alloc.p[:2], [0.98575, 0.01425], atol=1e-5)
    assert optimal_allocation(linear(5), 0.8).execution_time == pytest.approx(0.2)


def test_theorem1_equals_highs_on_random_concave_speedups() -> None:
    rng = np.random.default_rng(7)
    cases = set()
    for _ in range(1200):
        sp = random_speedup(rng)
        a = sp.efficiency()
        lam = float(rng.choice(a)) if rng.random() < 0.3 else float(rng.uniform(1e-3, 1.0))  # ties: λ = a_i
        alloc = optimal_allocation(sp, lam)
        d_lp, _ = lp_allocation(sp, lam)
        assert abs(alloc.execution_time - d_lp) <= 1e-9, (sp.s, lam)
        s = sp.array()
        assert abs(s @ alloc.y - lam) <= 1e-9
        assert np.arange(1, sp.d + 1) @ alloc.y <= 1 + 1e-9
        assert np.all(alloc.y >= 0) and abs(alloc.p.sum() - 1) <= 1e-9
        sup = alloc.support
        assert len(sup) <= 2 and (len(sup) < 2 or sup[1] == sup[0] + 1)
        cases.add(alloc.case)
    assert cases == {"i", "ii", "iii"}


@pytest.mark.parametrize("load", [0.0, -0.1, 1.2, float("nan"), float("inf")])
def test_infeasible_or_bad_load_raises(load: float) -> None:
    with pytest.raises(LoadError, match="load"):
        optimal_allocation(SUB, load)


def test_segment_gains_of_the_example() -> None:
    np.testing.assert_allclose(segment_gains(SUB), [4, 1.75, 0.5, 2 / 7])


def test_water_fill_equals_lp() -> None:
    rng = np.random.default_rng(3)
    for _ in range(300):
        k = int(rng.integers(1, 6))
        sps = [random_speedup(rng) for _ in range(k)]
        w = rng.dirichlet(np.ones(k)) * rng.uniform(0.05, 1.0)
        sizes = rng.uniform(0.5, 2.0, k)
        classes = [JobClass(sp, float(w[j] / sizes[j]), float(sizes[j])) for j, sp in enumerate(sps)]
        alloc = water_fill(classes)
        assert abs(alloc.execution_time - lp_classes(classes)) <= 1e-9
        assert alloc.share.sum() <= 1 + 1e-9
        for j, c in enumerate(classes):
            assert abs(c.speedup.array() @ alloc.y[j] - c.load) <= 1e-9


def test_water_fill_single_class_is_theorem1() -> None:
    alloc = water_fill([JobClass(SUB, 0.8)])
    np.testing.assert_allclose(alloc.y[0], [0, 0, 0.2, 0.1, 0], atol=1e-12)


def test_classes_overload_raises() -> None:
    with pytest.raises(LoadError, match="Σρ_j"):
        water_fill([JobClass(SUB, 0.6), JobClass(linear(2), 0.3, 2.0)])
    with pytest.raises(LoadError):
        lp_classes([JobClass(SUB, 0.6), JobClass(linear(2), 0.3, 2.0)])
