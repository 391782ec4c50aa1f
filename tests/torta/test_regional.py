"""The live macro layer: the simulator's plan over live region loads, a PPO policy plugged in, region placement from
RTTs, and bad input refused naming the field."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from petals_chain.torta.episode import macro_plan, residual_capacity
from petals_chain.torta.ppo import BetaPolicy
from petals_chain.torta.regional import LIVE_PARAMS, RegionalMacro, RegionError, RegionLoad, check_latency, \
    cluster_by_rtt, nearest, place_by_rtt, rtt_vector

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


# round trips (s) between the live demo's three regions' anchors: twice the one-way latency
ANCHOR_RTT_S = 2 * LAT_S - np.diag(np.diag(2 * LAT_S))


@pytest.mark.data
def test_servers_are_placed_by_ripe_atlas_round_trips() -> None:
    """On RIPE Atlas round trips (the repo's pairwise rule over the measured medians): the anchors nearest Lisbon,
    Helsinki and Frankfurt are the regions; the next three anchors near each city, placed one after the other,
    each land in the region of their nearest anchor, the Helsinki and Frankfurt ones in their own city's region;
    placing them again in the same order gives the same regions."""
    from petals_chain.data.ripe import haversine_km, load_ripe_atlas, rtt_matrix_s

    atlas = load_ripe_atlas()
    picks = []
    for lat, lon in ((38.72, -9.14), (60.17, 24.94), (50.11, 8.68)):
        d = haversine_km(np.full(atlas.size, lat), np.full(atlas.size, lon), atlas.lat_deg, atlas.lon_deg)
        picks.append(np.argsort(d, kind="stable")[:4])
    idx = np.array([p[0] for p in picks] + [p[k] for p in picks for k in (1, 2, 3)])
    m = rtt_matrix_s(atlas, idx)

    def place_all() -> list[int]:
        placed: list[tuple[np.ndarray, int]] = []
        for s in range(3, m.shape[0]):
            placed.append((m[s, :3], place_by_rtt(m[s, :3], m[:3, :3], placed)))
        return [r for _, r in placed]

    regions = place_all()
    assert regions == [int(np.argmin(m[s, :3])) for s in range(3, m.shape[0])]
    assert regions[3:] == [1, 1, 1, 2, 2, 2]
    assert place_all() == regions


def test_equidistant_server_goes_to_the_region_listed_first() -> None:
    """A server exactly as near to two anchors joins the one listed first, whichever pair it is (the linkage's own
    tie order is not used); a 1 ms difference decides; far from every anchor it takes the nearest."""
    assert place_by_rtt(np.array([0.020, 0.020, 0.100]), ANCHOR_RTT_S) == 0
    assert place_by_rtt(np.array([0.100, 0.020, 0.020]), ANCHOR_RTT_S) == 1
    assert place_by_rtt(np.array([0.100, 0.021, 0.020]), ANCHOR_RTT_S) == 2
    assert place_by_rtt(np.array([0.030, 0.100, 0.030]), ANCHOR_RTT_S) == 0
    assert place_by_rtt(np.array([0.300, 0.290, 0.300]), ANCHOR_RTT_S) == 1


def test_servers_placed_before_steer_a_borderline_newcomer() -> None:
    """Three servers placed near r0 make r0's cluster wide for a newcomer 1 ms nearer r0 than r2: average linkage
    puts it in r2; without them it joins r0; a server clearly nearer r0 joins r0 either way."""
    near_a = [(np.array([0.012, 0.090, 0.030]), 0)] * 3
    borderline = np.array([0.034, 0.070, 0.035])
    assert place_by_rtt(borderline, ANCHOR_RTT_S) == 0
    assert place_by_rtt(borderline, ANCHOR_RTT_S, near_a) == 2
    assert place_by_rtt(np.array([0.015, 0.090, 0.035]), ANCHOR_RTT_S, near_a) == 0


def test_malformed_rtt_reports_are_refused_naming_the_field() -> None:
    """A report must give a finite round trip >= 0 for every region and name no other."""
    assert rtt_vector({"c": 0.03, "a": 0.01, "b": 0.02}, NAMES).tolist() == [0.01, 0.02, 0.03]
    for bad, field in (({"a": 0.01, "b": 0.02}, "missing 'c'"), ({"a": 0.1, "b": 0.1, "c": 0.1, "z": 0.1}, "'z'"),
                       ({"a": float("nan"), "b": 0.1, "c": 0.1}, "rtt_s.a"), ({"a": 0.1, "b": -1.0, "c": 0.1},
                                                                             "rtt_s.b"),
                       ({"a": 0.1, "b": 0.1, "c": "fast"}, "rtt_s.c"), ({"a": True, "b": 0.1, "c": 0.1}, "rtt_s.a"),
                       ([0.1, 0.1, 0.1], "must map")):
        with pytest.raises(RegionError, match=field):
            rtt_vector(bad, NAMES)  # type: ignore[arg-type]


def test_residual_capacity_water_fills_the_forecast() -> None:
    """ν_r = max(0, c_r·L − Q_r) with Σ ν = F: hand-computed levels; no queue gives capacity shares; a region whose
    queue is above the level gets (almost) nothing; an origin with no forecast is planned away from a full region."""
    c = np.array([1.0, 2.0, 1.0])
    assert np.allclose(residual_capacity(c, np.zeros(3), 4.0), [1.0, 2.0, 1.0], atol=1e-8)
    # queues 3, 0, 1 and F = 2: regions 1 and 2 fill to L = (2 + 0 + 1)/(2 + 1) = 1, region 0 (level 3) gets none
    assert np.allclose(residual_capacity(c, np.array([3.0, 0.0, 1.0]), 2.0), [0.0, 2.0, 0.0], atol=1e-8)
    # F = 8: every region takes work, L = (8 + 4)/4 = 3
    assert np.allclose(residual_capacity(c, np.array([3.0, 0.0, 1.0]), 8.0), [0.0, 6.0, 2.0], atol=1e-8)
    plan = macro_plan(np.array([0.0, 0.33, 0.0]), np.full(3, 0.33), np.array([5.0, 4.0, 3.0]),
                      RegionalMacro(NAMES, LAT_S, slot_s=1.0).cost, LIVE_PARAMS)
    assert plan[0, 0] < 0.01 and plan[0, 2] > 0.99  # r0 sends its next request to the shortest queue, r2
