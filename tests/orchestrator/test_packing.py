"""Consolidation (mell/live.py): Mell's scheduler packs sessions onto chains and its moves become
reserved migrations; worst fit, its baseline, never moves and so keeps more servers busy."""

from __future__ import annotations

import asyncio
import math

import numpy as np
import pytest

from petals_chain.dispatch.base import Start
from petals_chain.model import SpecError
from petals_chain.orchestrator.engine.chains import ChainInfo
from petals_chain.orchestrator.leasing.migration import MigratingLeaseManager
from petals_chain.mell.live import PackingPolicy
from petals_chain.protocol.hop import Hop
from tests.orchestrator.test_orchestrator import run

CHAINS = [ChainInfo((Hop(f"s{k}", 0, 4),), capacity=2, service_time_s=1.0, chain_id=f"c{k}") for k in range(3)]


def _drive(policy: PackingPolicy, ops: list[tuple[str, int]]) -> list[int]:
    """Apply arrivals/departures; moves take effect at once; return the servers in use after each operation."""
    used = []
    for kind, job in ops:
        if kind == "a":
            starts = policy.on_arrival(job)
        else:
            starts = policy.on_departure(job, -1)
        assert all(isinstance(s, Start) for s in starts)
        occ = policy.occupancy()
        assert all(0 <= z <= 2 for z in occ), occ  # never more sessions on a chain than its slots
        used.append(policy.servers_in_use())
    return used


def test_mell_keeps_every_server_but_the_latest_full_worst_fit_does_not() -> None:
    """Random arrival/departure sequences over enough chains: with one size class Mell's departures refill a server
    from the latest one, so it uses ⌈n/2⌉ servers after every operation; worst fit never uses fewer, and over the
    sequences it uses more server-operations in total."""
    rng = np.random.default_rng(7)
    total = {"mell": 0, "worst-fit": 0}
    for _ in range(40):
        live: list[int] = []
        ops: list[tuple[str, int]] = []
        nxt = 0
        for _ in range(30):
            if live and (len(live) >= 10 or rng.random() < 0.45):
                ops.append(("d", live.pop(int(rng.integers(len(live))))))
            else:
                ops.append(("a", nxt))
                live.append(nxt)
                nxt += 1
        pols = {p: PackingPolicy([1.0] * 6, [2] * 6, p) for p in total}
        used = {p: _drive(pol, ops) for p, pol in pols.items()}
        n = 0
        for i, (kind, _) in enumerate(ops):
            n += 1 if kind == "a" else -1
            assert used["mell"][i] == math.ceil(n / 2), (i, ops[: i + 1])
            assert used["worst-fit"][i] >= used["mell"][i]
        for p in total:
            total[p] += sum(used[p])
    assert total["worst-fit"] > total["mell"]


def test_packing_bins_are_the_smallest_chain_and_the_packer_must_be_known() -> None:
    """Chains of different capacity are bins of the smallest one; an unknown packer names the field."""
    pol = PackingPolicy([1.0, 1.0], [3, 2])
    _drive(pol, [("a", 0), ("a", 1), ("a", 2)])
    assert pol.occupancy() == [2, 1]
    with pytest.raises(SpecError, match="'packer'"):
        PackingPolicy([1.0], [2], "best-fit-ish")


def test_mell_moves_become_reserved_migrations_and_free_a_server() -> None:
    """Three sessions on two chains; one of the full chain's ends: Mell moves the lone session over, the lease
    manager reserves its slot and offers the move; once it completed one chain is idle. A failed move books the
    session back where it runs. No drain and no packer switch while sessions run."""

    async def body() -> None:
        lm = MigratingLeaseManager(migration="mell")
        lm.set_chains(CHAINS, 1)
        a, b, c = [await lm.acquire(timeout_s=1) for _ in range(3)]
        assert [x.chain.chain_id for x in (a, b, c)] == ["c0", "c0", "c1"]
        with pytest.raises(SpecError, match="drain"):
            lm.drain("s0")
        with pytest.raises(SpecError, match="while"):
            lm.set_policy("worst-fit")
        lm.release(a.lease_id)
        target = lm.offer(c.lease_id)
        assert target is not None and target.chain.chain_id == "c0"
        assert lm.snapshot().occupancy == [2, 0, 0]  # the packer's books: c is at its target already
        moved = lm.complete(c.lease_id)
        assert moved.chain.chain_id == "c0" and not lm.has(c.lease_id)
        assert lm._policy.servers_in_use() == 1
        d = await lm.acquire(timeout_s=1)  # the next session opens a second server
        lm.release(b.lease_id)  # c0 short: d moves over from the latest server
        assert lm.offer(d.lease_id) is not None
        lm.fail(d.lease_id)
        assert lm.offer(d.lease_id) is None and lm.snapshot().occupancy == [1, 1, 0]
        lm.release(moved.lease_id)
        lm.release(d.lease_id)
        assert lm.leases() == [] and lm.snapshot().occupancy == [0, 0, 0]
        lm.set_policy("worst-fit")
        assert lm.migration == "worst-fit"

    run(body())


def test_draining_a_packed_swarm_is_refused_and_changes_nothing() -> None:
    """POST /servers/a/drain while a packer places sessions: 400 naming the reason; a's chains are still offered."""
    import functools

    from petals_chain.protocol.http_client import OrchestratorClient, OrchestratorError
    from tests.orchestrator.test_orchestrator import make_orchestrator, serving

    async def body() -> None:
        orch = make_orchestrator(lease_manager=functools.partial(MigratingLeaseManager, migration="worst-fit"))
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            chains = len((await oc.chains())["chains"])
            with pytest.raises(OrchestratorError) as err:
                await oc.drain("a")
            assert err.value.status == 400 and "JFFC" in err.value.message
            assert not orch.draining and len((await oc.chains())["chains"]) == chains

    run(body())


def test_an_arrival_waits_when_every_server_is_full() -> None:
    """One chain of two slots: the third session waits in the queue and gets the first freed slot."""

    async def body() -> None:
        lm = MigratingLeaseManager(migration="mell")
        lm.set_chains(CHAINS[:1], 1)
        a, _ = [await lm.acquire(timeout_s=1) for _ in range(2)]
        third = asyncio.create_task(lm.acquire(timeout_s=5))
        await asyncio.sleep(0.01)
        assert not third.done() and lm.queue_length() == 1
        lm.release(a.lease_id)
        await asyncio.sleep(0.01)
        assert third.done() and third.result().chain.chain_id == "c0"

    run(body())


def test_an_arrival_never_takes_a_cache_still_held_by_a_session_moving_away() -> None:
    """Two full chains; a departure makes Mell move one session over, so its old server is half free in the
    scheduler's books but still holds that session's cache until the move ends: a new arrival waits instead of
    landing there (PETALS would refuse it: out of cache), and takes the slot when the move is done."""

    async def body() -> None:
        lm = MigratingLeaseManager(migration="mell")
        lm.set_chains(CHAINS[:2], 1)
        a, b, c, d = [await lm.acquire(timeout_s=1) for _ in range(4)]
        assert [x.chain.chain_id for x in (a, b, c, d)] == ["c0", "c0", "c1", "c1"]
        lm.release(a.lease_id)
        mover = next(x for x in (c, d) if lm.offer(x.lease_id) is not None)
        arrival = asyncio.create_task(lm.acquire(timeout_s=5))
        await asyncio.sleep(0.01)
        assert not arrival.done() and lm.queue_length() == 1
        lm.complete(mover.lease_id)
        await asyncio.sleep(0.01)
        assert arrival.done() and arrival.result().chain.chain_id == "c1"
        held = [x.chain.chain_id for x in lm.leases()]
        assert sorted(held) == ["c0", "c0", "c1", "c1"]

    run(body())


def test_mell_opens_an_empty_chain_only_when_every_chain_in_use_is_full() -> None:
    """mell-consolidate's live rows show arrivals starting on one chain and moving at a later departure. With moves
    that end at once, that is Mell's rule and not the mapping of its GPUs onto chains: over random arrivals and
    departures on three chains of two slots, an arrival never opens an empty chain while a chain in use has room,
    and a departure's moves never leave more chains in use than before it."""
    import random

    from petals_chain.mell.live import PackingPolicy

    rng = random.Random(0)
    arrivals = 0
    for _ in range(100):
        p = PackingPolicy([1.0, 1.0, 1.0], [2, 2, 2], "mell")
        live: dict[int, int] = {}
        job = 0
        for _ in range(60):
            before = p.occupancy()
            if live and rng.random() < 0.5:
                j = rng.choice(sorted(live))
                starts = p.on_departure(j, live.pop(j))
                after_moves = p.occupancy()
                assert sum(1 for n in after_moves if n) <= sum(1 for n in before if n)
            else:
                starts = p.on_arrival(job)
                for s in starts:
                    if s.job == job and s.migrated_from is None:
                        arrivals += 1
                        assert before[s.chain] > 0 or all(n in (0, 2) for n in before), (before, s)
                job += 1
            for s in starts:
                if s.migrated_from is not None:
                    p.hold(s.migrated_from)
                    p.unhold(s.migrated_from)
                live[s.job] = s.chain
    assert arrivals > 1000
