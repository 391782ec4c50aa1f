"""Baselines: best/worst/first fit choose as named, reservation never overflows, preemption picks the newest,
LB's moves narrow the gap they act on."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.mell.baselines import FitScheduler, LoadBalanceScheduler
from petals_chain.mell.invariants import capacity_violations
from tests.mell.randseq import run_sequence

C = 1000


def _three_gpus(rule):
    s = FitScheduler(C, rule, reserve=False)
    s.step({1: 900}, [])
    s.step({2: 500}, [])  # 900 + 500 > C: new GPU
    s.step({3: 700}, [])  # fits neither: third GPU
    return s


@pytest.mark.parametrize("rule, expected", [("best", 0), ("worst", 1), ("first", 0)])
def test_fit_rules(rule, expected):
    s = _three_gpus(rule)
    assert s.num_gpus() == 3
    free = {g: s.st.free(g) for g in s.st.gpus}  # 100, 500, 300
    s.step({4: 100}, [])
    g = s.placement()[4]
    assert list(free).index(g) == expected


def test_reservation_never_overflows_or_preempts():
    for rule in ("best", "worst"):
        s = FitScheduler(C, rule)
        for res in run_sequence(s, np.random.default_rng(3), 60):
            assert res.preemptions == 0 and not res.moves
            assert capacity_violations(s.st) == []


def test_reservation_mirror_matches_the_requests():
    """The per-GPU reservation the fit rules read equals the final sizes of the requests on that GPU."""
    s = FitScheduler(C, "best")
    for _ in run_sequence(s, np.random.default_rng(5), 120, arrivals_per_step=4):
        for g in s.st.gpus:
            held = sum(s._final[r] for r, h in s.placement().items() if h == g)
            assert s._res_arr[g] == held == s._reserved[g]
    assert s.st.gpus_opened > 64  # past the mirror's first growth


def test_preemption_takes_the_newest_request():
    s = FitScheduler(C, "best", reserve=False)
    s.step({1: 400}, [])
    s.step({2: 400}, [])
    res = s.step({}, [], {1: 700})  # 700 + 400 > C: request 2 (newest) leaves for a new GPU
    assert res.preempted == (2,) and s.num_gpus() == 2


def test_lb_moves_narrow_the_gap_and_respect_capacity():
    s = LoadBalanceScheduler(C, reserve=False)
    moved = 0
    for res in run_sequence(s, np.random.default_rng(4), 80):
        moved += len(res.moves)
        assert capacity_violations(s.st) == []
    assert moved > 0


def _lb_with(groups):
    """An LB scheduler whose GPUs hold the given request sizes (one list per GPU)."""
    s = LoadBalanceScheduler(C, reserve=False)
    r = 0
    for sizes in groups:
        g = s.st.new_gpu()
        for size in sizes:
            r += 1
            s.st.size[r] = size
            s._final[r] = size
            s._admitted[r] = r
            s.st.place(s.st.new_item([r], bundle=False), g)
    return s


def test_lb_moves_the_shortest_request_only_when_it_narrows_the_gap():
    s = _lb_with([[100, 120, 110, 130], [100]])  # freeness 135 vs 900: moving 100 gives 217 vs 400
    moves = s._rebalance()
    assert [(m.request, m.src, m.dst) for m in moves] == [(1, 0, 1)]
    s = _lb_with([[300, 300], [500]])  # freeness 200 vs 500: moving 300 would reverse the gap (700 vs 100)
    assert s._rebalance() == [] and s.placement() == {1: 0, 2: 0, 3: 1}


def test_bad_input():
    with pytest.raises(ValueError, match="rule"):
        FitScheduler(C, "random")
    s = FitScheduler(C, "best")
    with pytest.raises(ValueError, match="final_sizes"):
        s.step({1: 10}, [])
    with pytest.raises(ValueError, match="final size"):
        s.step({1: 10}, [], None, {1: 5})
