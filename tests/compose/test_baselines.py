"""Placement baselines: PETALS' block choice, BPRR's CG-BP, whole-model-per-server."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.compose.bprr import bprr_concurrency, cg_bp, max_concurrency_bprr
from petals_chain.compose.capacity import blocks_array
from petals_chain.compose.gca import gca
from petals_chain.compose.memory import memory_violations
from petals_chain.compose.petals_default import petals_placement
from petals_chain.compose.whole_model import whole_model_composition
from petals_chain.model import GB, InfeasibleError, ModelSpec, ServerSpec
from tests.conftest import random_servers

BLOOM = ModelSpec(70, 1.32 * GB, 0.11 * GB)


def _coverage(placement, L):
    cov = np.zeros(L + 1, dtype=int)
    for a, m in zip(placement.first_block, placement.num_blocks):
        if m:
            cov[a : a + m] += 1
    return cov[1:]


def paper_like(n_high=4, n_low=16):
    return [ServerSpec(f"h{j}", 40 * GB, 0.5 + 0.01 * j, 0.109) for j in range(n_high)] + [
        ServerSpec(f"l{j}", 20 * GB, 0.6 + 0.01 * j, 0.175) for j in range(n_low)
    ]


def test_petals_placement_covers_model_and_balances():
    servers = paper_like()
    p = petals_placement(servers, BLOOM)
    cov = _coverage(p, 70)
    assert cov.min() >= 1
    m = blocks_array(servers, BLOOM, 2)
    assert list(p.num_blocks) == list(m)  # spans sized by PETALS' fixed cache for 2 sessions
    # the first server starts at block 1; the second fills the least-served blocks right after it
    assert p.first_block[0] == 1 and p.first_block[1] == 1 + m[0]
    chains = gca(servers, BLOOM, p)
    assert chains and memory_violations(servers, BLOOM, p, chains) == []


def test_petals_joining_server_picks_lexicographically_weakest_span():
    servers = [ServerSpec("a", 10.0, 0.1, 1.0), ServerSpec("b", 10.0, 0.1, 0.5), ServerSpec("c", 6.0, 0.1, 0.25)]
    model = ModelSpec(6, 1.0, 0.5)
    p = petals_placement(servers, model, cache_jobs=1, max_rounds=0)
    # a takes blocks 1-6; b (6 blocks) too; c (4 blocks) lands on the first window of equal throughput
    assert p.num_blocks == (6, 6, 4)
    assert p.first_block == (1, 1, 1)


def test_cg_bp_covers_under_served_blocks_first():
    servers = paper_like()
    R = bprr_concurrency(servers, BLOOM, arrival_rate=0.2)
    assert 1 <= R <= max_concurrency_bprr(servers, BLOOM)
    p = cg_bp(servers, BLOOM, R)
    cov = _coverage(p, 70)
    assert cov.min() >= 1
    assert cov.max() - cov.min() <= 2  # greedy keeps the blocks evenly served
    chains = gca(servers, BLOOM, p)
    assert memory_violations(servers, BLOOM, p, chains) == []


def test_bprr_concurrency_grows_with_load():
    servers = paper_like()
    rs = [bprr_concurrency(servers, BLOOM, lam) for lam in (0.05, 0.2, 1.0, 5.0)]
    assert rs == sorted(rs) and rs[0] < rs[-1]
    assert rs[-1] <= max_concurrency_bprr(servers, BLOOM)


def test_whole_model_chains():
    model = ModelSpec(4, 1.0, 0.25)
    servers = [ServerSpec("big", 10.0, 0.1, 0.2), ServerSpec("small", 4.5, 0.1, 0.1)]
    comp = whole_model_composition(servers, model)
    assert [ch.servers for ch in comp.chains] == [(0,)]
    assert comp.chains[0].capacity == 6  # (10 - 4) / (4 * 0.25)
    assert comp.chains[0].service_time_s == pytest.approx(0.1 + 0.8)
    with pytest.raises(InfeasibleError):
        whole_model_composition([servers[1]], model)


def test_baselines_respect_memory_on_random_clusters():
    rng = np.random.default_rng(3)
    model = ModelSpec(8, 1.0, 0.2)
    for _ in range(30):
        servers = random_servers(rng, int(rng.integers(3, 9)))
        for make in (lambda s: petals_placement(s, model), lambda s: cg_bp(s, model, 2)):
            try:
                p = make(servers)
            except InfeasibleError:
                continue
            assert _coverage(p, 8).min() >= 1
            assert memory_violations(servers, model, p, gca(servers, model, p)) == []


def test_petals_capped_as_the_authors_modelled_it():
    """The authors' PETALS: low-end spans ≤ 4 blocks, so J = 10, η = 0.1 (1 high + 9 low) cannot hold BLOOM-176B,
    while PETALS sizing spans from memory can; high-end spans are not capped."""
    from petals_chain.compose.method_table import METHODS
    from petals_chain.compose.petals_default import AUTHORS_LOW_END_SPAN
    from petals_chain.experiments.paper import model

    bloom = model()
    high = [ServerSpec("h0", 40 * GB, 0.05, 0.109)]
    low = [ServerSpec(f"l{i}", 20 * GB, 0.05, 0.175) for i in range(9)]
    servers = high + low
    free = petals_placement(servers, bloom)
    assert max(free.num_blocks[1:]) > AUTHORS_LOW_END_SPAN  # PETALS itself gives low-end servers more
    with pytest.raises(InfeasibleError, match="capped at 4"):
        METHODS["petals_capped"].compose(servers, bloom, 0.2)
    servers = high * 1 + [ServerSpec(f"h{i}", 40 * GB, 0.05, 0.109) for i in range(1, 4)] + low
    capped = METHODS["petals_capped"].compose(servers, bloom, 0.2).placement
    assert all(m <= AUTHORS_LOW_END_SPAN for m in capped.num_blocks[4:])
    assert max(capped.num_blocks[:4]) > AUTHORS_LOW_END_SPAN
    assert not METHODS["petals_capped"].live
    with pytest.raises(InfeasibleError, match="low_end_span"):
        petals_placement(servers, bloom, low_end_span=0)
