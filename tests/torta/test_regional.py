"""The live macro layer: the simulator's plan over live region loads, a PPO policy plugged in, region placement from
RTTs, and bad input refused naming the field."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from petals_chain.torta.episode import macro_plan
from petals_chain.torta.ppo import BetaPolicy
from petals_chain.torta.regional import LIVE_PARAMS, RegionalMacro, RegionError, RegionLoad, check_latency, \
    cluster_by_rtt, nearest

NAMES = ["a", "b", "c"]
LAT_S = np.array([[0.005, 0.060, 0.025], [0.060, 0.005, 0.040], [0.025, 0.040, 0.005]])


def load(cap=(10.0, 10.0, 10.0), queue=(0.0, 0.0, 0.0)) -> RegionLoad:
    """A region load with free = capacity − queue slots."""
    cap, queue = np.array(cap), np.array(queue)
    return RegionLoad(cap, queue, np.maximum(cap - queue, 0), np.zeros(3))


def test_plan_is_the_simulators_macro_plan_of_the_forecast() -> None:
    """A_t is macro_plan(mean of the last slots' counts, capacity, queue) exactly: one concept, one place."""
    m = RegionalMacro(NAMES, LAT_S, slot_s=2.0, forecast_slots=2)
    for counts in ([6.0, 2.0, 0.0], [10.0, 4.0, 1.0]):
        m.counts[:] = counts
        plan = m.new_slot(load(queue=(3.0, 0.0, 0.0)))
    f = np.array([8.0, 3.0, 0.5])
    assert np.allclose(m.forecast(), f)
    want = macro_plan(f, np.full(3, 10.0), np.array([3.0, 0.0, 0.0]), m.cost, LIVE_PARAMS)
    assert np.allclose(plan, want) and np.allclose(plan.sum(1), 1.0)
    assert m.counts.sum() == 0 and m.slot == 2


def test_no_arrivals_or_no_capacity_keeps_everyone_home() -> None:
    """Before any arrival (or with no chain anywhere) the plan is the identity."""
    m = RegionalMacro(NAMES, LAT_S, slot_s=1.0)
    assert np.array_equal(m.new_slot(load()), np.eye(3))
    m.counts[:] = [5, 0, 0]
    assert np.array_equal(m.new_slot(load(cap=(0.0, 0.0, 0.0))), np.eye(3))


def test_an_untrained_anchored_policy_returns_its_anchor() -> None:
    """A fresh anchored PPO policy's mean is its anchor (1 − η)·A_{t−1} + η·Prob_t (up to its 1 % head)."""
    torch.manual_seed(0)
    net = BetaPolicy(3 * 3 + 3 + 2 * 9, 3, hidden=(16,))
    m = RegionalMacro(NAMES, LAT_S, slot_s=1.0, policy=net.act)
    m.counts[:] = [9.0, 1.0, 0.0]
    prev = m.ppo_plan.copy()
    assert np.array_equal(m.new_slot(load()), m.prob)  # TORTA-OT's plan is Prob_t; the policy's is ppo_plan
    a = m.ppo_plan
    anchor = (1 - LIVE_PARAMS.anchor_mix) * prev + LIVE_PARAMS.anchor_mix * m.prob
    assert np.allclose(a.sum(1), 1.0)
    assert np.abs(a - anchor / anchor.sum(1, keepdims=True)).max() < 0.05
    assert not np.allclose(a, m.prob)


def test_nearest_and_clustering_place_by_round_trips() -> None:
    """An origin is the region of its smallest RTT; servers cluster into regions by their pairwise RTTs."""
    assert nearest({"a": 0.05, "b": 0.01, "c": 0.02}, NAMES) == "b"
    assert nearest({"c": 0.02}, NAMES) == "c"
    rtt = np.array([[0, 2, 50, 51], [2, 0, 52, 49], [50, 52, 0, 3], [51, 49, 3, 0]], float) * 1e-3
    assert cluster_by_rtt(rtt, 2).tolist() == [0, 0, 1, 1]
    assert cluster_by_rtt(rtt, 1).tolist() == [0, 0, 0, 0]
    assert cluster_by_rtt(rtt, 4).tolist() == [0, 1, 2, 3]


def test_bad_input_is_refused_naming_the_field() -> None:
    """Malformed latencies, names, slots, RTTs, policies and cluster counts raise RegionError."""
    with pytest.raises(RegionError, match="latency_s"):
        check_latency(np.zeros((2, 3)), NAMES[:2])
    with pytest.raises(RegionError, match="latency_s"):
        check_latency(-LAT_S, NAMES)
    with pytest.raises(RegionError, match="regions"):
        check_latency(np.zeros((2, 2)), ["a", "a"])
    with pytest.raises(RegionError, match="slot_s"):
        RegionalMacro(NAMES, LAT_S, slot_s=0.0)
    with pytest.raises(RegionError, match="price_per_kwh"):
        RegionalMacro(NAMES, LAT_S, slot_s=1.0, price_per_kwh=np.ones(2))
    with pytest.raises(RegionError, match="rtt_s"):
        nearest({}, NAMES)
    with pytest.raises(RegionError, match="rtt_s.a"):
        nearest({"a": float("nan")}, NAMES)
    with pytest.raises(RegionError, match="policy"):
        RegionalMacro(NAMES, LAT_S, slot_s=1.0).choose(0, "random", load())
    with pytest.raises(RegionError, match="regions"):
        cluster_by_rtt(np.zeros((3, 3)), 4)
    with pytest.raises(RegionError, match="origin"):
        RegionalMacro(NAMES, LAT_S, slot_s=1.0).index("z", "origin")
