"""GBP-CR, GCA and c tuning: the worked example, Theorem 3.4, memory safety, tuning curves."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petals_chain.compose.capacity import blocks_for_capacity, max_concurrency
from petals_chain.compose.gbp_cr import gbp_cr, gbp_cr_detail
from petals_chain.compose.gca import gca
from petals_chain.compose.memory import memory_violations
from petals_chain.compose.optimal import brute_force_groups, enumerate_chains, optimal_cache_allocation
from petals_chain.compose.tuning import compose, compose_for_c, tune_c
from petals_chain.model import Chain, ModelSpec, Placement, ServerSpec
from tests.conftest import random_servers, worked_example


def _names(servers, chain):
    return [servers[j].name for j in chain.servers]


def test_worked_example_gbp_cr_forms_the_two_disjoint_chains():
    servers, model = worked_example()
    res = gbp_cr_detail(servers, model, c=1, arrival_rate=100.0)  # high λ: use every server
    p = res.placement
    assert [blocks_for_capacity(s, model, 1) for s in servers] == [1, 2, 1, 1, 1]
    assert res.num_chains == 2
    # j1 -> j2 (j2 holds blocks 2-3) and j3 -> j4 -> j5
    assert (p.first_block[0], p.num_blocks[0]) == (1, 1)
    assert (p.first_block[1], p.num_blocks[1]) == (2, 2)
    assert [(p.first_block[j], p.num_blocks[j]) for j in (2, 3, 4)] == [(1, 1), (2, 1), (3, 1)]
    assert res.rate_estimate_per_s == pytest.approx(1 / (3 + 5e-3) + 1 / (3 + 12e-3))


def test_worked_example_gca_finds_three_chains_of_capacity_five():
    servers, model = worked_example()
    chains = gca(servers, model, gbp_cr(servers, model, 1, arrival_rate=100.0))
    assert [_names(servers, ch) for ch in chains] == [["j1", "j2"], ["j1", "j4", "j5"], ["j3", "j4", "j5"]]
    assert [ch.capacity for ch in chains] == [5, 5, 5]
    eps = 0.001
    total = sum(ch.capacity * ch.rate_per_s for ch in chains)
    assert total == pytest.approx(5 / (3 + 5 * eps) + 5 / (3 + 10 * eps) + 5 / (3 + 12 * eps))
    assert memory_violations(servers, model, gbp_cr(servers, model, 1, 100.0), chains) == []


def test_gca_python_and_numba_paths_agree(rng):
    model = ModelSpec(6, 1.0, 0.05)
    for _ in range(20):
        servers = random_servers(rng, 7)
        placement = gbp_cr(servers, model, int(rng.integers(1, 5)), arrival_rate=50.0)
        assert gca(servers, model, placement, use_numba=False) == gca(servers, model, placement, use_numba=True)


def test_gbp_cr_stops_once_target_rate_is_met():
    servers = [ServerSpec(f"s{j}", 10.0, 0.1, 0.1) for j in range(8)]
    model = ModelSpec(4, 1.0, 0.1)  # c=1: m=min(floor(10/1.1), 4) = 4 -> one server is a whole chain
    low = gbp_cr_detail(servers, model, 1, arrival_rate=0.1)
    assert low.num_chains == 1 and low.target_met
    assert sum(1 for m in low.placement.num_blocks if m > 0) == 1
    high = gbp_cr_detail(servers, model, 1, arrival_rate=1e6)
    assert high.num_chains == 8 and not high.target_met


def test_theorem_3_4_gbp_cr_is_optimal_for_equal_memory():
    """GBP-CR's K(c) equals the brute-force optimum of problem (10) when all M_j are equal."""
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(120):
        n = int(rng.integers(3, 8))
        servers = random_servers(rng, n, equal_memory=True)
        model = ModelSpec(int(rng.integers(2, 7)), 1.0, float(rng.uniform(0.05, 0.5)))
        c = int(rng.integers(1, 4))
        lam = float(rng.uniform(0.05, 3.0))
        if sum(blocks_for_capacity(s, model, c) for s in servers) < model.num_blocks:
            continue
        res = gbp_cr_detail(servers, model, c, lam)
        best = brute_force_groups(servers, model, c, lam)
        if res.target_met:
            assert best == res.num_chains, (servers, model, c, lam)
        else:
            assert best is None
        checked += 1
    assert checked > 60


def test_tuning_curve_and_criteria():
    servers = [ServerSpec(f"h{j}", 40e9, 0.5, 0.109) for j in range(4)] + [
        ServerSpec(f"l{j}", 20e9, 0.6, 0.175) for j in range(16)
    ]
    model = ModelSpec(70, 1.32e9, 0.11e9, name="bloom")
    t = tune_c(servers, model, arrival_rate=0.2)
    assert t.curve[0].c == 1 and t.curve[-1].c <= max_concurrency(servers, model)
    by_c = {p.c: p for p in t.curve}
    chosen = by_c[t.c]
    assert all(chosen.lower_s <= p.lower_s for p in t.curve)
    for p in t.curve:
        assert p.lower_s <= p.upper_s or (math.isinf(p.lower_s) and math.isinf(p.upper_s))
        assert p.surrogate == p.c * p.gbp_chains
    assert t.best("surrogate") == min(t.curve, key=lambda p: (p.surrogate, p.c)).c
    comp = compose(servers, model, arrival_rate=0.2)
    assert comp.c == t.c
    assert comp.meta["lower_s"] == pytest.approx(chosen.lower_s)
    assert comp.total_rate_per_s > 0.2
    assert memory_violations(comp.servers, model, comp.placement, comp.chains) == []


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 9),
    L=st.integers(1, 12),
    cache=st.floats(0.01, 1.0),
    c=st.integers(1, 6),
    lam=st.floats(0.01, 20.0),
)
def test_every_composition_respects_memory(seed, n, L, cache, c, lam):
    rng = np.random.default_rng(seed)
    servers = random_servers(rng, n)
    model = ModelSpec(L, 1.0, cache)
    try:
        comp = compose_for_c(servers, model, c, lam)
    except ValueError:
        return  # infeasible instance: covered by the error tests
    assert memory_violations(servers, model, comp.placement, comp.chains) == []
    assert all(ch.capacity >= 1 for ch in comp.chains)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 7), L=st.integers(1, 6))
def test_gca_respects_memory_under_any_placement(seed, n, L):
    """GCA works on arbitrary placements, not only GBP-CR's."""
    rng = np.random.default_rng(seed)
    servers = random_servers(rng, n)
    model = ModelSpec(L, 1.0, float(rng.uniform(0.02, 0.5)))
    first, count = [], []
    for s in servers:
        m = int(rng.integers(0, min(L, int(s.memory_bytes)) + 1))
        a = int(rng.integers(1, L - m + 2)) if m else 0
        first.append(a)
        count.append(m)
    placement = Placement(tuple(first), tuple(count))
    chains = gca(servers, model, placement)
    assert memory_violations(servers, model, placement, chains) == []
    feasible = enumerate_chains(servers, placement, model)
    assert {ch.servers for ch in chains} <= {ch.servers for ch in feasible}
    times = [ch.service_time_s for ch in chains]
    assert times == sorted(times)  # peeled fastest first


def test_ilp_matches_exhaustive_search_on_tiny_instance():
    servers, model = worked_example()
    placement = gbp_cr(servers, model, 1, arrival_rate=100.0)
    chains = enumerate_chains(servers, placement, model)
    # j1->j2, j1->j4->j5, j1->j4->j2, j3->j2, j3->j4->j5, j3->j4->j2
    assert len(chains) == 6
    need = 1.2
    res = optimal_cache_allocation(servers, model, placement, chains, need)
    assert res.total_capacity == 4  # ceil(1.2 / (1/3.005)) chains of the fastest kind
    best = None
    for caps in np.ndindex(*(5,) * len(chains)):
        trial = [Chain(ch.servers, ch.blocks, int(k), ch.service_time_s) for ch, k in zip(chains, caps)]
        ok = not memory_violations(servers, model, placement, [t for t in trial if t.capacity > 0])
        if ok and sum(t.capacity * t.rate_per_s for t in trial) >= need:
            best = sum(caps) if best is None else min(best, sum(caps))
    assert res.total_capacity == best
