"""The composition variants: paper (Algorithm 1 as written), max-chains, and the joint default (lower bound)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.analysis.estimate import jffc_mean_estimate
from petals_chain.cli import main
from petals_chain.compose.gbp_cr import gbp_cr_detail
from petals_chain.compose.memory import memory_violations
from petals_chain.compose.method_table import METHODS, get_method
from petals_chain.compose.tuning import TIE_RTOL, tune_c
from petals_chain.model import InfeasibleError, ModelSpec, ServerSpec, SpecError
from tests.conftest import random_servers, worked_example

SNAPSHOT = Path(__file__).parent / "data" / "paper_snapshot.json"
CHAIN_METHODS = ("proposed", "paper", "max-chains")


def _cases() -> list[dict]:
    return json.loads(SNAPSHOT.read_text())["cases"]


def _lower(comp) -> float:
    return theorem37_bounds([ch.rate_per_s for ch in comp.chains], [ch.capacity for ch in comp.chains],
                            comp.meta["arrival_rate"]).lower_s


def _estimate(comp):
    return jffc_mean_estimate([ch.rate_per_s for ch in comp.chains], [ch.capacity for ch in comp.chains],
                              comp.meta["arrival_rate"])


def _compose(name: str, servers, model, lam: float, rho: float = 0.7):
    comp = METHODS[name].compose(servers, model, lam, rho)
    comp.meta["arrival_rate"] = lam
    return comp


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["name"])
def test_paper_reproduces_the_composition_from_before_the_variants(case):
    """Snapshot taken from Algorithm 1 as written: shipped clusters (as shipped then), worked example, random. Where
    the tuned c differs, the snapshot's c must tie with it (the lower bound equal up to rounding: the snapshot's
    machine broke that exact tie by a few ulps, the rule gives it to the smallest c), and the composition at the
    snapshot's c must still be the snapshot's."""
    servers = [ServerSpec(**s) for s in case["servers"]]
    model = ModelSpec(**case["model"])
    comp = METHODS["paper"].compose(servers, model, case["arrival_rate"], case["target_load"])
    if comp.c != case["c"]:
        curve = {p.c: p.lower_s for p in tune_c(servers, model, case["arrival_rate"], case["target_load"]).curve}
        assert comp.c < case["c"] and curve[comp.c] == pytest.approx(curve[case["c"]], rel=TIE_RTOL)
        comp = METHODS["paper"].compose(servers, model, case["arrival_rate"], case["target_load"], c=case["c"])
    assert comp.c == case["c"]
    assert list(comp.placement.first_block) == case["first_block"]
    assert list(comp.placement.num_blocks) == case["num_blocks"]
    assert [dict(servers=list(ch.servers), blocks=list(ch.blocks), capacity=ch.capacity) for ch in comp.chains] \
        == case["chains"]


def test_max_chains_keeps_placing_after_the_rate_is_met():
    servers, model = worked_example()
    paper = gbp_cr_detail(servers, model, 1, arrival_rate=0.1)  # low λ: one chain meets the rate
    full = gbp_cr_detail(servers, model, 1, arrival_rate=0.1, max_chains=True)
    assert paper.num_chains == 1 and paper.target_met
    assert full.num_chains == 2
    assert sum(m > 0 for m in full.placement.num_blocks) == 5


@pytest.mark.parametrize("seed", range(12))
def test_max_chains_has_at_least_the_papers_chains_and_fits_memory(seed):
    rng = np.random.default_rng(seed)
    servers = random_servers(rng, int(rng.integers(3, 10)))
    model = ModelSpec(int(rng.integers(2, 8)), 1.0, float(rng.uniform(0.01, 0.2)), name="toy")
    lam = float(rng.uniform(0.05, 2.0))
    for c in range(1, 6):
        try:
            paper = gbp_cr_detail(servers, model, c, lam)
        except InfeasibleError:
            continue
        full = gbp_cr_detail(servers, model, c, lam, max_chains=True)
        assert full.num_chains >= paper.num_chains
    try:
        comp = _compose("max-chains", servers, model, lam)
    except InfeasibleError:
        return
    assert memory_violations(servers, model, comp.placement, comp.chains) == []


@pytest.mark.parametrize("seed", range(25))
def test_default_estimated_mean_is_at_most_both_variants_and_fits_memory(seed):
    rng = np.random.default_rng(100 + seed)
    servers = random_servers(rng, int(rng.integers(3, 12)))
    model = ModelSpec(int(rng.integers(2, 8)), 1.0, float(rng.uniform(0.01, 0.2)), name="toy")
    lam = float(rng.uniform(0.05, 3.0))
    others = []
    for name in ("paper", "max-chains"):
        try:
            others.append(_estimate(_compose(name, servers, model, lam)))
        except InfeasibleError:
            pass
    if not others:
        with pytest.raises(InfeasibleError):
            _compose("proposed", servers, model, lam)
        return
    comp = _compose("proposed", servers, model, lam)
    assert _lower(comp) == pytest.approx(comp.meta["lower_s"])
    mine = _estimate(comp)
    assert mine.mean_s == pytest.approx(comp.meta["joint"].estimate_s)
    for other in others:
        # Exact estimates obey the choice exactly; a simulated one may sit a little below a bound it was pruned by.
        slack = 1e-9 if {mine.how, other.how} <= {"erlang-c", "exact-k2"} else 0.02
        assert mine.mean_s <= other.mean_s * (1 + slack), (mine, other)
    assert memory_violations(servers, model, comp.placement, comp.chains) == []
    used = {j for ch in comp.chains for j in ch.servers}
    assert all(comp.placement.num_blocks[j] == 0 for j in range(len(servers)) if j not in used)


def _toy_with_a_big_slow_server():
    # Two small servers form the only multi-hop chain; a big, slow server can hold the whole model alone.
    model = ModelSpec(4, 1.0, 0.1, name="toy")
    servers = [ServerSpec("a", 2.5, 0.1, 0.01), ServerSpec("b", 2.5, 0.1, 0.01), ServerSpec("big", 4.5, 0.5, 0.1)]
    return servers, model


def test_default_uses_an_idle_whole_model_server_when_it_lowers_the_mean():
    servers, model = _toy_with_a_big_slow_server()
    lam = 6.0  # the fast chain alone (2 slots of 0.24 s) would be 72 % busy
    comp = _compose("proposed", servers, model, lam)
    assert any(ch.servers == (2,) for ch in comp.chains), comp.chains
    assert comp.meta["joint"].whole_model_chains == 1
    assert (comp.placement.first_block[2], comp.placement.num_blocks[2]) == (1, 4)
    assert memory_violations(servers, model, comp.placement, comp.chains) == []
    fast = [ch for ch in comp.chains if ch.servers != (2,)]
    alone = jffc_mean_estimate([ch.rate_per_s for ch in fast], [ch.capacity for ch in fast], lam)
    assert comp.meta["joint"].estimate_s < alone.mean_s


def test_default_leaves_it_idle_where_only_the_lower_bound_would_gain():
    servers, model = _toy_with_a_big_slow_server()
    lam = 1.2  # light load: a job sent to the 0.9 s chain stays there, while the lower bound counts it as fast
    comp = _compose("proposed", servers, model, lam)
    assert [ch.servers for ch in comp.chains] == [(0, 1)] and comp.placement.num_blocks[2] == 0
    whole = _compose("max-chains", servers, model, lam)
    assert any(ch.servers == (2,) for ch in whole.chains)
    assert _lower(whole) < comp.meta["lower_s"]
    assert _estimate(whole).mean_s > comp.meta["joint"].estimate_s


def test_default_with_fixed_c_and_bad_c_or_criterion():
    servers, model = worked_example()
    assert METHODS["proposed"].compose(servers, model, 0.5, c=1).c == 1
    with pytest.raises(SpecError, match="'c'"):
        METHODS["proposed"].compose(servers, model, 0.5, c=0)
    with pytest.raises(SpecError, match="one of \\('lower', 'upper'\\)"):
        METHODS["proposed"].compose(servers, model, 0.5, tune="surrogate")
    by_upper = METHODS["proposed"].compose(servers, model, 0.5, tune="upper")
    assert by_upper.meta["upper_s"] <= METHODS["proposed"].compose(servers, model, 0.5).meta["upper_s"]


def test_bad_method_names_are_rejected_with_the_choices():
    with pytest.raises(SpecError, match="choose one of proposed, paper, max-chains"):
        get_method("max_chains")


@pytest.mark.parametrize("method", CHAIN_METHODS)
def test_compose_cli_method_option(method, capsys):
    cluster = Path(__file__).parents[2] / "experiments" / "clusters" / "paper_default.yaml"
    assert main(["compose", str(cluster), "--method", method, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["chains"]
    assert ("joint" in doc) == (method == "proposed") and ("tuning" in doc) == (method != "proposed")
    if method == "proposed":
        assert doc["joint"]["c"] == doc["c"] and doc["joint"]["kept_chains"] + doc["joint"]["whole_model_chains"] \
            == len(doc["chains"])


@pytest.mark.parametrize("bad, why", [("nope", "unknown method 'nope'"), ("bprr", "without fixed chains")])
def test_compose_cli_rejects_bad_methods(bad, why, capsys):
    cluster = Path(__file__).parents[2] / "experiments" / "clusters" / "paper_default.yaml"
    assert main(["compose", str(cluster), "--method", bad]) == 2
    err = capsys.readouterr().err
    assert why in err and "proposed, paper, max-chains, jffc_only" in err


def test_criterion_values_equal_up_to_rounding_tie_to_the_smallest_c():
    """Lower bounds a few ulps apart are one value (the fastest chain's service time along different sums): the
    smallest such c wins whichever came out lowest on this CPU; a real difference still decides."""
    import math

    from petals_chain.compose.tuning import CPoint, _pick

    x = 1.8075516902912285

    def point(c: int, lower: float) -> CPoint:
        return CPoint(c, 1, c, 1, 1, 1.0, lower, 2.0)

    ulps = [point(1, math.nextafter(x, 2)), point(2, x), point(3, math.nextafter(x, 0)), point(4, x * (1 + 1e-6))]
    assert _pick(ulps, "lower") == 1
    assert _pick([point(1, x * (1 + 1e-6)), point(3, x)], "lower") == 3
