"""Installing a full recomposition without reloading interchangeable servers (compose/stable.py)."""

from __future__ import annotations

import dataclasses

import numpy as np

from petals_chain.bench.cluster import BLOOM, bench_servers
from petals_chain.compose.joint import joint_compose
from petals_chain.compose.repair import worth_replacing
from petals_chain.compose.stable import keep_spans, spans_changed, spans_of
from tests.compose.test_repair import _valid


def _two_kinds(J: int) -> list:
    """The benchmark's two MIG kinds with every server of a kind at the same RTT: interchangeable within a kind."""
    servers = bench_servers(J, 0.3, np.random.default_rng(J))
    high, low = servers[0], servers[-1]
    return [dataclasses.replace(high if s.memory_bytes == high.memory_bytes else low, name=s.name) for s in servers]


def test_interchangeable_servers_keep_their_spans_when_the_input_order_changes() -> None:
    """The composer places servers of equal figures by input order: the same swarm listed in another order gets
    a placement that would send servers loading; keep_spans gives each server back its span, and the composition
    is otherwise the candidate's (same chains by index, same figures per index)."""
    servers = _two_kinds(60)
    lam = 0.6
    current = joint_compose(servers, BLOOM, lam)
    order = np.random.default_rng(1).permutation(len(servers))
    candidate = joint_compose([servers[i] for i in order], BLOOM, lam)
    moved = spans_changed(spans_of(current), candidate)
    assert moved > 5  # the premise: the order alone reloads servers
    kept = keep_spans(candidate, spans_of(current))
    assert spans_changed(spans_of(current), kept) == 0
    _valid(kept)
    assert kept.chains == candidate.chains and kept.placement == candidate.placement
    assert [dataclasses.replace(s, name="-") for s in kept.servers] == [
        dataclasses.replace(s, name="-") for s in candidate.servers]
    assert not worth_replacing(kept, current, lam)  # the same servers, the same bound
    print(f"\n[keep_spans] J=60, two kinds: {moved} servers sent loading by the reordered recomposition, 0 after")


def test_servers_with_their_own_figures_are_never_renamed() -> None:
    servers = bench_servers(40, 0.3, np.random.default_rng(3))  # every server its own RTT
    current = joint_compose(servers, BLOOM, 0.4)
    candidate = joint_compose(list(reversed(servers)), BLOOM, 0.4)
    assert keep_spans(candidate, spans_of(current)) is candidate
    assert keep_spans(candidate, {}) is candidate


def test_a_restart_rebuilds_the_composition_the_servers_hold() -> None:
    """`restored` routes the servers' spans as they are (a repaired composition, say) without moving anyone; spans
    that no longer fit are refused by name."""
    from petals_chain.compose.repair import drop_server, restored

    servers = bench_servers(60, 0.2, np.random.default_rng(60))
    comp = drop_server(joint_compose(servers, BLOOM, 0.6), servers[0].name)
    back = restored(comp.servers, BLOOM, spans_of(comp), comp.c)
    assert spans_of(back) == spans_of(comp) and back.meta["repair"] == "restored"
    _valid(back)
    assert back.total_rate_per_s >= 0.9 * comp.total_rate_per_s
    import pytest

    from petals_chain.model import SpecError

    too_much = {comp.servers[1].name: (0, BLOOM.num_blocks)}  # a whole 176B model on one MIG slice
    with pytest.raises((SpecError, ValueError)):
        restored(comp.servers, BLOOM, too_much, comp.c)
