"""The default composition's pruned search makes the exhaustive search's choice, and its parts agree with what
they stand in for: prefix lower bounds with Theorem 3.7, reused simulations with one run per chain set, GCA cut
short with GCA's first chains."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from petals_chain.analysis.bounds import prefix_lower_bounds, theorem37_bounds
from petals_chain.analysis.estimate import JffcMeans, jffc_mean_estimate
from petals_chain.bench.cluster import BLOOM, bench_servers
from petals_chain.compose.gbp_cr import gbp_cr
from petals_chain.compose.gca import gca
from petals_chain.compose.joint import joint_compose
from petals_chain.model import InfeasibleError, ModelSpec, SpecError
from tests.conftest import random_servers


def _cluster(seed: int):
    """(servers, model, λ, tune) of one seeded cluster, J ≤ 60: toy models on random servers (some able to hold
    the whole model, some serial), and the benchmark's BLOOM-176B clusters of the paper's two devices."""
    rng = np.random.default_rng(7000 + seed)
    kind = seed % 5
    if kind in (0, 1, 2):  # toy: J = 3..12, L = 2..8; whole-model servers where the model is small
        servers = random_servers(rng, int(rng.integers(3, 13)))
        model = ModelSpec(int(rng.integers(2, 9)), 1.0, float(rng.uniform(0.2, 0.5)), name="toy")
        lam = float(rng.uniform(0.05, 1.0)) * len(servers) / 4
        if kind == 2:  # sessions that slow each other: slots cut per candidate (compose/serial.py)
            servers = [dataclasses.replace(s, serial_fraction=float(rng.uniform(0.2, 1.0))) for s in servers]
    else:  # BLOOM-176B on the paper's two devices, J = 10..60
        J = int(rng.integers(10, 61))
        servers = bench_servers(J, float(rng.uniform(0.1, 0.5)), rng)
        model, lam = BLOOM, float(rng.uniform(0.005, 0.03)) * J
    tune = "upper" if seed % 11 == 10 else "lower"
    return servers, model, lam, tune


def _choose(servers, model, lam, tune, search):
    try:
        return joint_compose(servers, model, lam, tune=tune, search=search)
    except InfeasibleError as exc:
        return str(exc)


N_CLUSTERS = 200


def test_pruned_search_chooses_as_the_exhaustive_one_on_seeded_clusters():
    """Same c, variant, chains, placement, bounds and estimate on every cluster (the reuse is exact, not within
    noise: a reused simulation is the very run the candidate would have had, see analysis.estimate.JffcMeans).
    A difference would be reported with both candidates' predicted means."""
    differ, infeasible = [], 0
    for seed in range(N_CLUSTERS):
        servers, model, lam, tune = _cluster(seed)
        old = _choose(servers, model, lam, tune, "exhaustive")
        new = _choose(servers, model, lam, tune, "pruned")
        if isinstance(old, str) or isinstance(new, str):
            assert old == new, (seed, old, new)
            infeasible += 1
            continue
        same = (old.meta["joint"] == new.meta["joint"] and old.chains == new.chains
                and old.placement == new.placement)
        if not same:
            differ.append((seed, old.meta["joint"], new.meta["joint"]))
    assert not differ, "\n".join(f"seed {s}: exhaustive {o} (mean {o.estimate_s:.6g} s) vs pruned {n} "
                                 f"(mean {n.estimate_s:.6g} s)" for s, o, n in differ)
    assert infeasible < N_CLUSTERS // 4  # most clusters compose, so the comparison covers real choices


def test_fixed_c_and_bad_search():
    servers, model, lam, _ = _cluster(3)
    both = [joint_compose(servers, model, lam, c=2, search=s) for s in ("exhaustive", "pruned")]
    assert both[0].meta["joint"] == both[1].meta["joint"] and both[0].chains == both[1].chains
    with pytest.raises(SpecError, match="search"):
        joint_compose(servers, model, lam, search="greedy")


@pytest.mark.parametrize("seed", range(20))
def test_prefix_lower_bounds_are_theorem37_of_each_prefix(seed):
    rng = np.random.default_rng(seed)
    K = int(rng.integers(1, 40))
    rates = np.sort(rng.uniform(0.05, 1.0, K))[::-1]
    if seed % 2:
        rates = np.sort(np.round(rates, 1) + 0.05)[::-1]  # repeated rates
    caps = rng.integers(1, 20, K)
    lam = float(rng.uniform(0.1, 1.2)) * float(np.dot(rates, caps))
    got = prefix_lower_bounds(rates, caps, lam)
    for k in range(1, K + 1):
        want = theorem37_bounds(rates[:k], caps[:k], lam).lower_s
        if np.isinf(want):
            assert np.isinf(got[k - 1])
        else:
            assert got[k - 1] == pytest.approx(want, rel=1e-11)


def test_prefix_lower_bounds_need_the_fastest_first():
    with pytest.raises(SpecError, match="fastest first"):
        prefix_lower_bounds([0.1, 0.2], [1, 1], 0.05)


def test_reused_simulations_equal_one_run_per_chain_set():
    rates = [1.0, 0.9, 0.8, 0.5, 0.3, 0.2, 0.1]
    caps = [2, 2, 1, 3, 2, 2, 4]
    lam = 1.5  # light: the slowest chains are never reached, so most prefixes share a run
    means = JffcMeans(lam, n_jobs=5000)
    for k in range(len(rates), 0, -1):
        got = means.estimate(rates[:k], caps[:k])
        want = jffc_mean_estimate(rates[:k], caps[:k], lam, n_jobs=5000)
        assert got == want, k  # bit for bit, and the same method (exact where at most two rates)
    assert 1 <= means.simulations < len(rates) - 2  # fewer runs than the five simulated prefixes
    heavy = JffcMeans(6.0, n_jobs=5000)  # load 0.8: every run reaches its slowest chain, so none is shared
    for k in (7, 6, 5):
        assert heavy.estimate(rates[:k], caps[:k]) == jffc_mean_estimate(rates[:k], caps[:k], 6.0, n_jobs=5000)
    assert heavy.simulations == 3


def test_gca_limit_gives_its_first_chains():
    rng = np.random.default_rng(5)
    servers = bench_servers(60, 0.3, rng)
    placement = gbp_cr(servers, BLOOM, 3, 0.6, max_chains=True)
    every = gca(servers, BLOOM, placement)
    assert len(every) > 3
    for limit in (0, 1, 3):
        assert gca(servers, BLOOM, placement, limit=limit) == every[:limit]
