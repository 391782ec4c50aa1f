"""Speed-up validation and constructors (linear, Amdahl, table, concave hull)."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.moldable.speedup import SpeedUpError, amdahl, concave_hull, from_table, linear, parse


def test_linear_and_amdahl_are_valid_and_concave() -> None:
    assert linear(4).s == (1.0, 2.0, 3.0, 4.0)
    s = amdahl(6, 0.9).array()
    assert s[0] == 1 and np.all(np.diff(s) > 0) and np.all(np.diff(np.diff(s)) <= 1e-12)
    np.testing.assert_allclose(amdahl(3, 1.0).array(), [1, 2, 3])


@pytest.mark.parametrize("values, match", [
    ([2, 3], "s_1 must be 1"),
    ([1, 0.9], "must exceed"),
    ([1, 1], "must exceed"),
    ([1, 1.5, 2.5], "not concave"),
    ([1, float("nan")], "finite"),
    ([], "at least"),
])
def test_bad_speedups_raise(values: list[float], match: str) -> None:
    with pytest.raises(SpeedUpError, match=match):
        from_table(values)


def test_parse_and_its_errors() -> None:
    assert parse("1,1.8,2.5").s == (1.0, 1.8, 2.5)
    with pytest.raises(SpeedUpError, match="comma-separated"):
        parse("1,x")
    with pytest.raises(SpeedUpError):
        amdahl(3, 0.0)


def test_concave_hull_of_noisy_measurements() -> None:
    # a dip at 3 and a gain that flattens after 4: the hull bridges the dip and stops where it stops rising
    hull = concave_hull([1, 2, 3, 4, 5, 6], [10.0, 18.0, 20.0, 30.0, 30.0, 29.0])
    np.testing.assert_allclose(hull.array(), [1.0, 1.8, 2.4, 3.0])
    assert hull.d == 4
    with pytest.raises(SpeedUpError, match="i = 1"):
        concave_hull([2, 3], [1.0, 2.0])
