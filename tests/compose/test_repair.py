"""Repairing a composition after a server leaves or joins (compose/repair.py) on the benchmark's clusters."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.bench.cluster import BLOOM, bench_servers
from petals_chain.compose.capacity import blocks_for_capacity
from petals_chain.compose.joint import joint_compose
from petals_chain.compose.repair import add_server, drop_server, residual_slots, worth_replacing
from petals_chain.model import Composition, ServerSpec, SpecError


def _named(comp: Composition) -> set[tuple[tuple[str, ...], tuple[int, ...], int]]:
    """The chains as (server names, blocks, capacity): comparable across compositions whose indices differ."""
    return {(tuple(comp.servers[j].name for j in ch.servers), ch.blocks, ch.capacity) for ch in comp.chains}


def _valid(comp: Composition) -> None:
    """No server gives more cache than it has; every chain covers the model once, on blocks its servers hold."""
    assert min(residual_slots(comp.servers, comp.model, comp.placement, comp.chains)) >= 0
    for ch in comp.chains:
        assert ch.capacity >= 1 and sum(ch.blocks) == comp.model.num_blocks
        pos = 1
        for j, m in zip(ch.servers, ch.blocks):
            a, k = comp.placement.first_block[j], comp.placement.num_blocks[j]
            assert a <= pos and pos + m <= a + k
            pos += m
    order = [ch.service_time_s for ch in comp.chains]
    assert order == sorted(order)


@pytest.fixture(scope="module", params=[60, 300])
def composed(request) -> Composition:
    servers = bench_servers(request.param, 0.2, np.random.default_rng(request.param))
    return joint_compose(servers, BLOOM, 0.01 * request.param)


def test_a_leave_keeps_every_chain_that_misses_the_server_and_hands_its_span_on(composed):
    on_chain = sorted({j for ch in composed.chains for j in ch.servers})
    for victim in (on_chain[0], on_chain[len(on_chain) // 2], on_chain[-1]):
        name = composed.servers[victim].name
        rep = drop_server(composed, name)
        _valid(rep)
        assert name not in {s.name for s in rep.servers} and len(rep.servers) == len(composed.servers) - 1
        untouched = {c for c in _named(composed) if name not in c[0]}
        assert untouched <= _named(rep)  # same hops, blocks and capacity: their leases carry over
        heirs = rep.meta["heirs"]
        assert heirs  # the benchmark's clusters keep idle servers: they cover the span end to end
        pos = composed.placement.first_block[victim]
        for heir in heirs:
            j = [s.name for s in rep.servers].index(heir)
            assert composed.placement.num_blocks[[s.name for s in composed.servers].index(heir)] == 0
            assert rep.placement.first_block[j] == pos
            pos += rep.placement.num_blocks[j]
        assert pos == composed.placement.first_block[victim] + composed.placement.num_blocks[victim]
        assert rep.c == composed.c and rep.total_capacity >= sum(c[2] for c in untouched)


def test_without_an_idle_server_the_hole_stays_and_nothing_is_overbooked(composed):
    idle = {s.name for j, s in enumerate(composed.servers) if composed.placement.num_blocks[j] == 0}
    comp = composed
    for name in sorted(idle):
        comp = drop_server(comp, name)  # idle servers are on no chain: nothing changes but the index
        assert comp.meta["heirs"] == ()
    assert _named(comp) == _named(composed)
    victim = comp.chains[0].servers[0]
    rep = drop_server(comp, comp.servers[victim].name)
    _valid(rep)
    assert rep.meta["heirs"] == () and rep.total_capacity <= comp.total_capacity


def test_a_join_places_the_newcomer_over_the_thinnest_blocks(composed):
    proto = composed.servers[0]
    new = ServerSpec("newcomer", proto.memory_bytes, proto.tau_c_s, proto.tau_p_s)
    rep = add_server(composed, new)
    _valid(rep)
    assert _named(composed) <= _named(rep)
    m = blocks_for_capacity(new, BLOOM, composed.c)
    a, k = rep.placement.first_block[-1], rep.placement.num_blocks[-1]
    assert k == m and 1 <= a <= BLOOM.num_blocks - m + 1
    cover = np.zeros(BLOOM.num_blocks, dtype=int)
    for f, n in zip(composed.placement.first_block, composed.placement.num_blocks):
        cover[f - 1:f - 1 + n] += 1
    windows = [cover[s:s + m].sum() for s in range(BLOOM.num_blocks - m + 1)]
    assert cover[a - 1:a - 1 + m].sum() == min(windows)


def test_bad_input_is_refused_by_name(composed):
    with pytest.raises(SpecError, match="'nobody' is not in the composition"):
        drop_server(composed, "nobody")
    with pytest.raises(SpecError, match="already in the composition"):
        add_server(composed, composed.servers[0])


def test_a_full_recomposition_replaces_a_repair_only_where_it_gains_enough(composed):
    """Same servers and chains: kept. A server's figures moved: replaced. The candidate's lower bound 10 % under
    the repair's: replaced; a repair without chains: replaced."""
    import dataclasses

    lam = 0.01 * len(composed.servers)
    name = composed.servers[composed.chains[0].servers[0]].name
    rep = drop_server(composed, name)
    assert not worth_replacing(rep, rep, lam)
    slower = dataclasses.replace(rep.servers[0], tau_p_s=2 * rep.servers[0].tau_p_s)
    assert worth_replacing(rep, dataclasses.replace(rep, servers=(slower, *rep.servers[1:])), lam)
    faster = dataclasses.replace(rep, chains=tuple(dataclasses.replace(ch, service_time_s=0.5 * ch.service_time_s)
                                                   for ch in rep.chains))
    assert worth_replacing(rep, faster, lam) and not worth_replacing(faster, rep, lam)
    assert worth_replacing(dataclasses.replace(rep, chains=()), rep, lam)


def test_an_overloaded_repair_is_replaced_only_for_a_real_gain(composed):
    """Where the repaired composition cannot keep up with λ (no finite bound), a candidate as overloaded is not
    installed (its servers would reload for nothing: the live swarm's two-server chain swapped its servers' spans
    and dropped a session this way), one with ν 10 % higher or one that keeps up is."""
    import dataclasses

    rep = drop_server(composed, composed.servers[composed.chains[0].servers[0]].name)
    lam = 10 * rep.total_rate_per_s  # far past what any candidate below serves
    same = dataclasses.replace(rep, chains=tuple(reversed(rep.chains)))
    assert not worth_replacing(rep, same, lam)

    def scaled(f: float):
        return dataclasses.replace(rep, chains=tuple(dataclasses.replace(ch, service_time_s=ch.service_time_s / f)
                                                     for ch in rep.chains))

    assert not worth_replacing(rep, scaled(1.05), lam)
    assert worth_replacing(rep, scaled(1.2), lam)
    assert worth_replacing(rep, scaled(20.0), lam)  # keeps up: a finite bound


def test_many_changes_in_one_pass(composed):
    """A burst: three chain servers and one idle server gone, two newcomers, in one repair; untouched chains kept."""
    on_chain = sorted({j for ch in composed.chains for j in ch.servers})
    idle = [j for j in range(len(composed.servers)) if composed.placement.num_blocks[j] == 0]
    gone = [composed.servers[j].name for j in (on_chain[0], on_chain[1], on_chain[-1], idle[-1])]
    proto = composed.servers[0]
    new = [ServerSpec(f"new{i}", proto.memory_bytes, proto.tau_c_s, proto.tau_p_s) for i in range(2)]
    from petals_chain.compose.repair import repair

    rep = repair(composed, gone, new)
    _valid(rep)
    assert {s.name for s in rep.servers} == {s.name for s in composed.servers} - set(gone) | {"new0", "new1"}
    assert {c for c in _named(composed) if not set(gone) & set(c[0])} <= _named(rep)
    assert rep.meta["repair"] == "churn" and set(rep.meta["gone"]) == set(gone)
    with pytest.raises(SpecError, match="named twice"):
        repair(composed, [gone[0], gone[0]])
