"""The Table 1 regime report: spans, cache-to-weights, chains, τc/(τp·L) and loads, on hand-made and paper figures."""

from __future__ import annotations

import math

import pytest

from petals_chain.experiments import table1_regime as tr
from petals_chain.experiments.common import REPO
from petals_chain.model import ModelSpec, Placement, Composition, ServerSpec, SpecError
from petals_chain.model_shapes import paper_testbed_sizes

PAPER_CLUSTER = REPO / "experiments" / "clusters" / "llama2_7b_testbed.yaml"


def test_spans_follow_equation_8_on_the_paper_and_the_emulated_testbed():
    s_m, s_c = paper_testbed_sizes()
    paper = ModelSpec(32, float(s_m), float(s_c))
    assert tr.span_blocks(40e9, paper, 35) == 25  # published 24 (the authors' usable memory is a little less)
    assert tr.span_blocks(20e9, paper, 35) == 12
    assert tr.span_blocks(40e9, paper, 1) == 32  # capped at L
    emulated = ModelSpec(30, 14.160384e6, 1.173870e6)
    assert tr.span_blocks(1311.902e6, emulated, 35) == 23
    assert tr.span_blocks(655.951e6, emulated, 35) == 11
    with pytest.raises(SpecError, match="c must be"):
        tr.span_blocks(1e9, emulated, 0)


def test_block_cut_capacity_is_the_thinnest_block():
    model = ModelSpec(4, 1.0, 0.1)
    servers = [ServerSpec("a", 10, 1.0, 0.5), ServerSpec("b", 10, 1.0, 0.5), ServerSpec("c", 10, 0.0, 1.0)]
    # a holds blocks 1-2, b 3-4, c 3: t_a = t_b = 2 s, t_c = 1 s
    comp = Composition(tuple(servers), model, Placement((1, 3, 3), (2, 2, 1)), ())
    assert tr.block_cut_capacity(servers, model, comp, [2, 2, 2]) == pytest.approx(1.0)  # blocks 1-2: a alone
    assert tr.block_cut_capacity(servers, model, comp, [4, 2, 2]) == pytest.approx(1.0)  # now block 4: b alone
    assert tr.block_cut_capacity(servers, model, comp, [4, 4, 2]) == pytest.approx(2.0)


def _two_hop() -> tuple[list[ServerSpec], ModelSpec]:
    """At c = 5 a big server holds 3 of 4 blocks and a small one 1: one two-hop chain."""
    model = ModelSpec(4, 1.0, 0.1)
    return [ServerSpec("big", 4.5, 0.6, 0.1), ServerSpec("small", 1.5, 0.4, 0.2)], model


def test_regime_of_a_two_hop_chain():
    servers, model = _two_hop()
    reg = tr.regime("x", servers, model, replay_rate=0.5, design_rate=4.0, paper_c=5,
                    methods=["paper", "jffc_only", "petals"])
    assert reg.c == 5
    assert [r.span_blocks for r in reg.servers] == [3, 1]
    assert reg.servers[0].cache_to_weights == pytest.approx(0.5)
    assert reg.servers[0].memory_used == pytest.approx(4.5 / 4.5)
    assert reg.servers[1].comm_to_compute == pytest.approx(0.4 / (0.2 * 4))
    assert reg.chains == (("big", "small"),) and reg.hops() == [2]
    loads = {m.method: m for m in reg.loads}
    chain_time = 0.6 + 0.4 + 3 * 0.1 + 1 * 0.2
    assert loads["paper"].how == "chains"
    assert loads["paper"].load == pytest.approx(0.5 / (reg.chain_capacities[0] / chain_time))
    whole = loads["jffc_only"]  # big holds all 4 blocks with cache for 1 job: 1 / (0.6 + 4 × 0.1) jobs/s
    assert whole.how == "chains" and whole.capacity_per_s == pytest.approx(1.0) and whole.load == pytest.approx(0.5)
    alone = tr.method_load("jffc_only", servers[1:], model, 0.5, 0.5)  # small alone cannot hold the model
    assert alone.how == "infeasible" and math.isinf(alone.load)
    assert loads["petals"].how == "block cut" and loads["petals"].load > 0


def test_bad_input_names_the_field():
    servers, model = _two_hop()
    with pytest.raises(SpecError, match="replay rate"):
        tr.regime("x", servers, model, replay_rate=0, design_rate=1.0)
    with pytest.raises(SpecError, match="design rate"):
        tr.regime("x", servers, model, replay_rate=1.0, design_rate=math.nan)
    with pytest.raises(SpecError, match="unknown method"):
        tr.method_load("nope", servers, model, 1.0, 1.0)


def test_paper_side_reproduces_the_published_shape():
    reg, kinds = tr.paper_side(str(PAPER_CLUSTER), ["proposed", "jffc_only"])
    assert reg.c == tr.PAPER_C
    assert reg.design_rate_per_s == pytest.approx(8 * reg.replay_rate_per_s)
    spans = {kinds[r.name]: r.span_blocks for r in reg.servers}
    assert spans == {"3g.40gb": 25, "2g.20gb": 12}
    assert all(2.7 <= r.cache_to_weights <= 2.95 for r in reg.servers)
    assert set(reg.hops()) == {2}  # two-hop chains, as on the paper's testbed
    rows = tr.report_rows(reg, reg, kinds, kinds)
    text = "\n".join(tr.format_report(rows, "ours", "paper"))
    assert "| c of the paper composition | 35 |" in text and "25/32" in text and "12/32" in text
    assert "load of JFFC only (chains)" in text


def test_paper_method_composes_at_its_design_rate_and_c():
    from petals_chain.experiments.table1 import method_rate_c, parse_args

    args = parse_args([])
    assert (args.design_rate_factor, args.paper_c) == (8.0, 35)
    assert method_rate_c(args, "paper", 0.5) == (4.0, 35)
    assert method_rate_c(args, "proposed", 0.5) == (0.5, None)
    assert method_rate_c(parse_args(["--paper-c", "0"]), "paper", 0.5) == (4.0, None)  # 0: tuned


def test_regime_cli_rejects_a_bad_design_rate(capsys):
    from petals_chain.experiments.table1 import main

    assert main(["--regime", "--design-rate-factor", "0", "--requests", "5"]) == 2
    assert "--design-rate-factor must be > 0" in capsys.readouterr().err
