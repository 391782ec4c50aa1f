"""The multi-class moldable simulator: exact identities, pools respected, agreement with the one-class simulator,
and the shape of the result (p*-schemes approach D*, greedy does not)."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.model import SpecError
from petals_chain.moldable.classes_sim import ClassesRun, reserves
from petals_chain.moldable.optimal import LoadError
from petals_chain.moldable.sim import MoldableRun

S = (1.0, 1.8, 2.5, 3.0, 3.4)
TWO = ((S, 0.5, 1.0), ((1.0, 1.9, 2.7), 0.2, 1.5))


def test_reserves_are_whole_servers_by_largest_remainder() -> None:
    assert reserves(10, np.array([0.55, 0.45])).tolist() == [6, 4]
    assert reserves(7, np.array([1 / 3, 1 / 3, 1 / 3])).tolist() == [3, 2, 2]
    assert reserves(10, np.array([0.25, 0.25])).tolist() == [3, 2]  # Σb < 1: idle servers stay idle
    assert reserves(4000, np.array([2 / 3, 1 / 3])).sum() == 4000


@pytest.mark.parametrize("scheme", ["partition", "shared", "greedy"])
def test_every_scheme_keeps_the_identities_and_its_pools(scheme: str) -> None:
    """Little's law per class within 1 % (time averages), exact on the sample path (checked inside: it raises),
    a class never holds more servers than its speed-up allows, and the partition's pools follow b*."""
    row = ClassesRun(500, TWO, scheme, arrivals=200_000)(7)
    assert row["little_rel_err_0"] < 0.01 and row["little_rel_err_1"] < 0.01
    assert row["max_servers_0"] <= 5 and row["max_servers_1"] <= 3
    assert 0 <= row["blocking"] < 0.3
    if scheme == "partition":
        assert sum(int(p) for p in row["pools"].split()) == 500 and len(row["pools"].split()) == 2
    else:
        assert row["pools"] == "500"
    if scheme == "greedy":
        assert row["max_servers_0"] == 5


def test_one_class_on_a_shared_pool_is_the_one_class_simulator() -> None:
    """Same model, independent streams: blocking and E[D] agree within sampling error."""
    runs = [ClassesRun(1000, ((S, 0.8, 1.0),), "shared", arrivals=300_000)(s) for s in range(3)]
    ref = [MoldableRun(1000, 0.8, S, arrivals=300_000)(s + 10) for s in range(3)]
    assert np.mean([r["blocking"] for r in runs]) == pytest.approx(np.mean([r["blocking"] for r in ref]), abs=0.004)
    assert np.mean([r["exec_time_all"] for r in runs]) == pytest.approx(
        np.mean([r["exec_time_all"] for r in ref]), abs=0.004)


def test_p_star_schemes_approach_d_star_and_greedy_keeps_blocking() -> None:
    """From n = 250 to 4000 the p*-schemes' blocking falls by more than half and E[D] nears D*; greedy's blocking
    stays above the p*-schemes' at n = 4000 (sub-linear speed-ups)."""
    small = {s: ClassesRun(250, TWO, s, arrivals=300_000)(1) for s in ("partition", "shared", "greedy")}
    big = {s: ClassesRun(4000, TWO, s, arrivals=600_000)(2) for s in ("partition", "shared", "greedy")}
    for s in ("partition", "shared"):
        assert big[s]["blocking"] < 0.5 * small[s]["blocking"]
        assert abs(big[s]["exec_time_all"] - big[s]["d_star"]) < 0.01
    assert big["greedy"]["blocking"] > 2 * big["shared"]["blocking"]


def test_bad_input_is_refused_before_running() -> None:
    with pytest.raises(SpecError, match="scheme"):
        ClassesRun(10, TWO, "psychic")
    with pytest.raises(SpecError, match="dist"):
        ClassesRun(10, TWO, dist="cauchy")
    with pytest.raises(SpecError, match="n: must be"):
        ClassesRun(0, TWO)
    with pytest.raises(LoadError, match="infeasible"):
        ClassesRun(10, ((S, 0.9, 1.0), (S, 0.3, 1.0)))
