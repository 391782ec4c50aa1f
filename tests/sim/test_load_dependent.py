"""The simulator with servers that slow with their batch (sim/load_dependent.py): the paper's model gives the general
engine's records; a batching chain is the birth-death chain its load rates define (its Theorem 3.7 bounds meet)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.compose.serial import bound_rates, cap_chains
from petals_chain.model import Chain, ModelSpec, ServerSpec
from petals_chain.sim.engine import simulate
from petals_chain.sim.load_dependent import run_load_dependent
from petals_chain.sim.systems import build_system, simulate_system
from petals_chain.sim.workloads import Workload, poisson_workload

CURVE = (1.0, 1.15, 1.3, 1.45, 1.6, 1.75, 1.9, 2.05)


def test_chains_in_the_paper_model_give_the_general_engines_records():
    chains = [Chain((0,), (30,), 3, 5.0), Chain((1,), (30,), 2, 8.0), Chain((2, 3), (10, 20), 4, 6.5)]
    wl = poisson_workload(0.6, 3000, np.random.default_rng(3))
    ours = run_load_dependent(chains, wl, warmup_jobs=100)
    ref = simulate([c.rate_per_s for c in chains], [c.capacity for c in chains], wl, "JFFC", warmup_jobs=100,
                   engine="general")
    assert np.array_equal(ours.records["chain"], ref.records["chain"])
    for field in ("start_s", "end_s", "response_s"):
        assert np.allclose(ours.records[field], ref.records[field], rtol=1e-9, atol=1e-9), field


def test_a_batching_chain_is_the_birth_death_chain_of_its_load_rates():
    server = ServerSpec("a", 1.3e9, 2.0, 0.1, batch_slowdown=CURVE)
    (chain,) = cap_chains((Chain((0,), (30,), 6, 5.0),), [server])
    assert chain.load_rates and chain.capacity == 6
    lam = 0.7 * chain.load_rates[-1]
    means = [run_load_dependent([chain], poisson_workload(lam, 20000, np.random.default_rng(s)),
                                warmup_jobs=2000).mean_response_s for s in range(4)]
    b = theorem37_bounds(*bound_rates([chain]), lam)
    # one chain: with n jobs JFFC departs at exactly r(min(n, c)), the fastest-slots rate, so the lower bound is exact
    half = 1.96 * np.std(means, ddof=1) / np.sqrt(len(means))
    assert abs(np.mean(means) - b.lower_s) < max(3 * half, 0.03 * b.lower_s), (means, b)
    fixed = simulate([chain.rate_per_s], [chain.capacity], poisson_workload(lam, 20000, np.random.default_rng(0)),
                     warmup_jobs=2000).mean_response_s
    assert np.mean(means) < fixed  # a job alone on the chain goes faster than at full batch


def test_the_simulator_uses_the_curve_for_a_composed_system():
    model = ModelSpec(num_blocks=30, block_bytes=14.16e6, cache_bytes=1.17e6, name="smol")
    servers = [ServerSpec(f"s{k}", 1.31e9, 2.4, 0.08 + 0.01 * k, batch_slowdown=CURVE) for k in range(4)]
    system = build_system("proposed", servers, model, 0.3)
    assert any(ch.load_rates for ch in system.chains)
    res = simulate_system(system, poisson_workload(0.3, 4000, np.random.default_rng(1)), warmup_jobs=400)
    assert res.engine == "load-dependent" and res.littles_law_gap < 1e-6
    flat = dataclasses.replace(system, chains=tuple(dataclasses.replace(c, load_rates=()) for c in system.chains))
    again = simulate_system(flat, poisson_workload(0.3, 4000, np.random.default_rng(1)), warmup_jobs=400)
    assert again.engine != "load-dependent"


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="at least one chain"):
        run_load_dependent([], poisson_workload(1.0, 10, np.random.default_rng(0)))
    bad = Chain((0,), (30,), 3, 5.0, load_rates=(0.2, 0.3))
    with pytest.raises(ValueError, match="2 load rates for 3 slots"):
        run_load_dependent([bad], poisson_workload(1.0, 10, np.random.default_rng(0)))
    wl = Workload(np.array([0.0, 1.0]), np.ones(2), service_s=np.ones((2, 1)))
    with pytest.raises(ValueError, match="job sizes"):
        run_load_dependent([Chain((0,), (30,), 3, 5.0)], wl)
