"""Tests of the routed-system simulator (PETALS, BPRR WS-RR), the four whole systems, and fig8's bookkeeping."""

from __future__ import annotations

import math

import numpy as np
import pytest

from petals_chain.compose.optimal import enumerate_chains
from petals_chain.compose.petals_default import petals_placement
from petals_chain.compose.routes import RouteGraph
from petals_chain.experiments.fig8_overall import Fig8Run, aggregate, reductions
from petals_chain.experiments.paper import draw_cluster, model
from petals_chain.model import InfeasibleError, ModelSpec, Placement, ServerSpec, SpecError
from petals_chain.sim.baselines import backoff_s, cache_use_peaks, simulate_bprr, simulate_petals
from petals_chain.sim.systems import build_system, run_method, simulate_system
from petals_chain.sim.workloads import Workload, poisson_workload


def two_server_instance() -> RouteGraph:
    """L = 2; A and B both hold blocks 1-2 with 2 cache slots (one job) each; T_A = 2 s, T_B = 3 s."""
    servers = [ServerSpec("A", 4.0, 1.0, 0.5), ServerSpec("B", 4.0, 1.0, 1.0)]
    return RouteGraph.build(servers, ModelSpec(2, 1.0, 1.0, name="tiny"), Placement((1, 1), (2, 2)))


def three_jobs() -> Workload:
    return Workload(np.array([0.0, 0.5, 0.9]), np.ones(3))


def test_petals_hand_checked_routes_and_backoff():
    g = two_server_instance()
    assert g.slots.tolist() == [2, 2]
    res = simulate_petals(g, three_jobs())
    r = res.records
    routes = [res.routes[k] for k in r["chain"]]
    # job 0 takes the fast A; job 1 finds A full (10 s penalty) and takes B; job 2 finds both full at 0.9 and
    # at 1.9 (A frees at 2.0), then retries 2 s later at 3.9 and takes A again.
    assert routes == [((0, 2),), ((1, 2),), ((0, 2),)]
    assert r["start_s"].tolist() == pytest.approx([0.0, 0.5, 3.9])
    assert r["end_s"].tolist() == pytest.approx([2.0, 3.5, 5.9])
    assert res.attempts.tolist() == [0, 0, 2]


@pytest.mark.parametrize("estimate", ["exact", "mean"])
def test_bprr_hand_checked_waiting_aware_routes(estimate):
    # all sizes are 1 (the mean), so the size-unaware scheduler sees exactly what the oracle sees
    res = simulate_bprr(two_server_instance(), three_jobs(), estimate=estimate)
    r = res.records
    routes = [res.routes[k] for k in r["chain"]]
    # job 1 at 0.5: A costs 1.5 s wait + 2 s > B's 3 s → B; job 2 at 0.9: A 1.1 + 2 < B 2.6 + 3 → A, from 2.0
    assert routes == [((0, 2),), ((1, 2),), ((0, 2),)]
    assert r["start_s"].tolist() == pytest.approx([0.0, 0.5, 2.0])
    assert r["end_s"].tolist() == pytest.approx([2.0, 3.5, 4.0])


def test_multi_hop_route_uses_partial_spans():
    # X holds 1-2, Y holds 2-3 (so after X it processes only block 3), Z holds 3, W holds 1-3 but is slow.
    servers = [ServerSpec("X", 10.0, 1.0, 0.1), ServerSpec("Y", 10.0, 0.2, 0.1), ServerSpec("Z", 10.0, 2.0, 0.1),
               ServerSpec("W", 10.0, 5.0, 0.1)]
    g = RouteGraph.build(servers, ModelSpec(3, 1.0, 1.0), Placement((1, 2, 3, 1), (2, 2, 1, 3)))
    assert g.route() == ((0, 2), (1, 1))
    # With Y penalised (PETALS' alloc delay), the best is X→Z (3.3 s) rather than W (5.3 s).
    local_y = int(np.flatnonzero(g.index == 1)[0])
    pen = np.zeros(g.index.size)
    pen[local_y] = 10.0
    assert g.route(pen) == ((0, 2), (2, 1))


@pytest.mark.parametrize("seed", range(6))
def test_route_matches_brute_force_fastest_chain(seed):
    rng = np.random.default_rng(seed)
    L = int(rng.integers(3, 9))
    J = int(rng.integers(2, 7))
    servers = [ServerSpec(f"s{j}", 100.0, float(rng.uniform(0.1, 2)), float(rng.uniform(0.05, 1))) for j in range(J)]
    m = rng.integers(1, L + 1, J)
    m[0] = L  # someone covers everything, so a chain exists
    first = [int(rng.integers(1, L - mj + 2)) for mj in m]
    placement = Placement(tuple(first), tuple(int(x) for x in m))
    mdl = ModelSpec(L, 1.0, 1.0)
    g = RouteGraph.build(servers, mdl, placement)
    best = min(enumerate_chains(servers, placement, mdl), key=lambda ch: ch.service_time_s)
    route = g.route()
    assert g.route_time_s(route) == pytest.approx(best.service_time_s)


def high_load_graphs():
    """A J=20, η=0.2 BLOOM cluster under λ = 1.5/s (far above what its cache can carry)."""
    rng = np.random.default_rng(7)
    servers = draw_cluster(20, 0.2, rng)
    wl = poisson_workload(1.5, 800, rng)
    return servers, wl


@pytest.mark.data
def test_petals_backoff_and_cache_never_overcommitted():
    servers, wl = high_load_graphs()
    system = build_system("petals", servers, model(), 1.5)
    res = simulate_system(system, wl)
    r = res.records
    failed = res.attempts > 0
    assert failed.any() and (r["waiting_s"] >= 1.0).any()
    # no queue: a session either starts on arrival or after its k backoffs, exactly Σ_{i≤k} min(2^(i-1), 60) s
    expected = np.array([sum(backoff_s(i) for i in range(1, k + 1)) for k in res.attempts])
    np.testing.assert_allclose(r["waiting_s"], expected, rtol=0, atol=1e-6)
    assert res.attempts.max() >= 7 and backoff_s(7) == 60.0  # the cap is reached
    peaks = cache_use_peaks(r["start_s"], r["end_s"], [res.routes[k] for k in r["chain"]], len(servers))
    assert np.all(peaks <= system.graph.slots)
    assert np.any(peaks == system.graph.slots)  # the check is not vacuous: some server is full at times
    assert res.littles_law_gap < 1e-9


def test_bprr_mean_estimates_are_wrong_but_waits_real():
    # job 0 is 3x the mean: the scheduler believes A frees at 2.0, so job 1 (arriving at 1.2) picks A
    # (0.8 s believed wait + 2 s < B's 3 s) and really waits until 6.0; the oracle would have taken B.
    g = two_server_instance()
    wl = Workload(np.array([0.0, 1.2]), np.array([3.0, 1.0]))
    mean = simulate_bprr(g, wl, estimate="mean").records
    exact = simulate_bprr(g, wl, estimate="exact").records
    assert mean["start_s"].tolist() == pytest.approx([0.0, 6.0]) and mean["chain"].tolist() == [0, 0]
    assert exact["start_s"].tolist() == pytest.approx([0.0, 1.2]) and exact["chain"].tolist() == [0, 1]
    with pytest.raises(ValueError, match="estimate"):
        simulate_bprr(g, wl, estimate="psychic")


@pytest.mark.data
@pytest.mark.parametrize("method", ["bprr", "bprr_oracle"])
def test_bprr_cache_never_overcommitted_at_high_load(method):
    servers, wl = high_load_graphs()
    system = build_system(method, servers, model(), 1.5)
    res = simulate_system(system, wl)
    r = res.records
    assert (r["waiting_s"] > 1.0).mean() > 0.5
    peaks = cache_use_peaks(r["start_s"], r["end_s"], [res.routes[k] for k in r["chain"]], len(servers))
    assert np.all(peaks <= system.graph.slots) and np.any(peaks == system.graph.slots)
    assert res.littles_law_gap < 1e-9
    assert res.littles_law_window_gap < 0.05


def test_cache_peaks_count_overlaps_and_release_first():
    start = np.array([0.0, 1.0, 2.0])
    end = np.array([2.0, 3.0, 4.0])
    routes = [((0, 3), (1, 1)), ((0, 2),), ((0, 4),)]
    # server 0: [0,2) 3 slots, [1,3) 2, [2,4) 4 → peak 6 at t in [2,3) (job 0 released at 2 before job 2 takes)
    assert cache_use_peaks(start, end, routes, 3).tolist() == [6, 1, 0]


@pytest.mark.data
def test_proposed_beats_petals_and_bprr_at_default_setting():
    rng = np.random.default_rng(2024)
    means = {"proposed": [], "petals": [], "bprr": [], "bprr_oracle": []}
    for _ in range(3):
        servers = draw_cluster(20, 0.2, rng)
        wl = poisson_workload(0.2, 1500, rng)
        for method in means:
            res = run_method(method, servers, model(), 0.2, wl, warmup_jobs=150)
            assert res.littles_law_gap < 1e-9
            means[method].append(res.mean_response_s)
    prop = np.mean(means["proposed"])
    assert prop < np.mean(means["petals"])
    assert prop < np.mean(means["bprr"])
    assert prop < np.mean(means["bprr_oracle"])


@pytest.mark.data
def test_whole_systems_infeasible_and_bad_input():
    servers = draw_cluster(10, 0.2, np.random.default_rng(0))
    with pytest.raises(InfeasibleError):  # 70 × 1.32 GB does not fit a 40 GB server
        build_system("jffc_only", servers, model(), 0.2)
    with pytest.raises(SpecError, match="unknown method"):
        build_system("vllm", servers, model(), 0.2)
    with pytest.raises(SpecError, match="arrival_rate"):
        build_system("bprr", servers, model(), 0.0)
    with pytest.raises(SpecError, match="slots"):
        RouteGraph.build(servers, model(), petals_placement(servers, model()), slots=[1, 2])
    tiny = [ServerSpec("A", 4.0, 1.0, 0.5)]
    with pytest.raises(InfeasibleError, match="block 2"):
        RouteGraph.build(tiny, ModelSpec(2, 1.0, 1.0), Placement((1,), (1,)))
    with pytest.raises(ValueError, match="warmup_jobs"):
        simulate_petals(two_server_instance(), three_jobs(), warmup_jobs=3)
    with pytest.raises(ValueError, match="failures"):
        backoff_s(0)


@pytest.mark.data
def test_fig8_run_row_and_tables():
    task = Fig8Run(((10, 0.2),), runs=1, n_jobs=300)
    row = task(np.random.SeedSequence(5), 0)
    assert row["jffc_only_status"] == "infeasible" and math.isnan(row["jffc_only_mean_response_s"])
    assert row["proposed_status"] in ("ok", "overloaded") and row["proposed_mean_response_s"] > 0
    rows = [dict(row, run=0), dict(row, run=1, proposed_mean_response_s=row["proposed_mean_response_s"] * 2)]
    agg = {r["method"]: r for r in aggregate(rows, ((10, 0.2),))}
    assert agg["proposed"]["mean_response_s"] == pytest.approx(1.5 * row["proposed_mean_response_s"])
    assert agg["jffc_only"]["feasible_runs"] == 0
    red = reductions(rows, ((10, 0.2),))[0]
    expect = 100 * (1 - 1.5 * row["proposed_mean_response_s"] / row["petals_mean_response_s"])
    assert red["vs_petals_pct"] == pytest.approx(expect) and red["vs_jffc_only_runs"] == 0
