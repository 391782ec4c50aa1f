"""The orchestrator over real HTTP on loopback: JFFC order, FIFO queue, leases, expiry, bad input, auth."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer as LoopbackServer  # noqa: E402  (alias: pytest must not collect it)

from petals_chain.compose.method_table import paper_composition  # noqa: E402
from petals_chain.dispatch.jffc import JFFC  # noqa: E402
from petals_chain.model import Chain, Composition, ModelSpec, Placement  # noqa: E402
from petals_chain.orchestrator.http.api import build_app  # noqa: E402
from petals_chain.orchestrator.engine.composition import CompositionPolicy  # noqa: E402
from petals_chain.orchestrator.engine.config import OrchestratorConfig  # noqa: E402
from petals_chain.orchestrator.engine.core import Orchestrator  # noqa: E402
from petals_chain.orchestrator.state.registry import Registry  # noqa: E402
from petals_chain.protocol.http_client import OrchestratorClient, OrchestratorError  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
GB = 1e9
MODEL = ModelSpec(num_blocks=4, block_bytes=1 * GB, cache_bytes=0.1 * GB, name="tiny")
# The paper's Algorithm 1 + GCA (c tuned by the lower bound) at λ = 0.5/s: the compositions these tests expect.
PAPER = CompositionPolicy(paper_composition, arrival_rate=0.5)

# Servers a, b hold the whole model; d holds blocks 1-2 and e blocks 3-4 (1-indexed).
# Chains, fastest first: (a) T=1 s, c=2; (b) T=2 s, c=1; (d→e) T=3 s, c=1. Total capacity 4.
SERVERS = {"a": 8 * GB, "b": 8 * GB, "d": 4 * GB, "e": 4 * GB}


ChainRow = tuple[tuple[str, ...], tuple[int, ...], int, float]  # servers, blocks per hop, capacity, T_k


def hand_composition(registry: Registry, chains: list[ChainRow]) -> Composition:
    """A Composition built by hand over the registered servers (placement: a, b whole model; d 1-2; e 3-4)."""
    names = list(SERVERS)
    specs = tuple(registry.servers[n].spec() for n in names)
    placement = Placement(first_block=(1, 1, 1, 3), num_blocks=(4, 4, 2, 2))
    built = tuple(Chain(tuple(names.index(s) for s in srv), blocks, cap, t) for srv, blocks, cap, t in chains)
    return Composition(specs, MODEL, placement, built, c=1)


BASE_CHAINS = [(("a",), (4,), 2, 1.0), (("b",), (4,), 1, 2.0), (("d", "e"), (2, 2), 1, 3.0)]


def make_orchestrator(*, offer_when_serving: bool = False, **kw: object) -> Orchestrator:
    """An orchestrator with servers a, b, d, e registered and the hand-built composition installed."""
    registry = Registry(MODEL)
    for n, mem in SERVERS.items():
        registry.register(n, mem, 0.1, 0.01, now_s=time.monotonic(), peer_id=f"peer-{n}", address=f"10.0.0.{len(n)}")
    orch = Orchestrator(registry, OrchestratorConfig(heartbeat_timeout_s=None, offer_when_serving=offer_when_serving),
                        composition_policy=PAPER, **kw)
    orch.install(hand_composition(registry, BASE_CHAINS))
    return orch


@contextlib.asynccontextmanager
async def serving(orch: Orchestrator, token: str | None = None) -> AsyncIterator[str]:
    """The real aiohttp app on a loopback port; yields its base URL."""
    server = LoopbackServer(build_app(orch, token=token, sweep_interval_s=0.05), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def wait_until(pred: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> None:
    """Poll an async predicate every 20 ms; fail the test if it stays false."""
    deadline = time.monotonic() + timeout_s
    while not await pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.02)


def run(coro: Awaitable[None]) -> None:
    """Run one async test body."""
    asyncio.run(coro)


def chain_servers(lease) -> tuple[str, ...]:
    """The server names of a lease's chain."""
    return tuple(s.server for s in lease.spans)


# ---- JFFC over HTTP -----------------------------------------------------------------------------


def test_fastest_free_chain_first_then_fifo_queue() -> None:
    """Leases fill the fastest chain first; the overflow waits and is served in arrival order."""

    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            first = [await oc.lease(timeout_s=5) for _ in range(4)]
            assert [chain_servers(x) for x in first] == [("a",), ("a",), ("b",), ("d", "e")]
            de = first[3]
            assert [(s.server, s.peer_id, s.start, s.end) for s in de.spans] == [
                ("d", "peer-d", 0, 2), ("e", "peer-e", 2, 4)]
            assert (await oc.health())["free"] == 0

            w1 = asyncio.create_task(oc.lease(timeout_s=5, client="w1"))
            await wait_until(lambda: _queue_len(oc, 1))
            w2 = asyncio.create_task(oc.lease(timeout_s=5, client="w2"))
            await wait_until(lambda: _queue_len(oc, 2))
            q = await oc.queue()
            assert [h["client"] for h in q["head"]] == ["w1", "w2"]
            assert not w1.done() and not w2.done()

            await oc.release(first[2].lease_id)  # chain b frees: the head (w1) gets it
            got1 = await asyncio.wait_for(w1, 5)
            assert chain_servers(got1) == ("b",)
            assert not w2.done()
            await oc.release(first[0].lease_id)  # a slot of chain a frees: w2 gets it
            got2 = await asyncio.wait_for(w2, 5)
            assert chain_servers(got2) == ("a",)
            assert got1.waited_s > 0 and got2.waited_s > 0

            for x in (first[1], first[3], got1, got2):
                await oc.release(x.lease_id)
            h = await oc.health()
            assert (h["free"], h["capacity"], h["active_leases"], h["queue_length"]) == (4, 4, 0, 0)

    run(body())


async def _queue_len(oc: OrchestratorClient, n: int) -> bool:
    """Whether the central queue holds exactly n requests."""
    return (await oc.queue())["length"] == n


def test_fifty_concurrent_clients_all_served_capacity_restored() -> None:
    """50 clients over 4 slots: every one is served, no chain is ever over capacity, all slots come back."""
    rng = np.random.default_rng(7)
    holds_s = rng.uniform(0.0, 0.03, size=50)

    async def body() -> None:
        orch = make_orchestrator()
        caps = {"v1.0": 2, "v1.1": 1, "v1.2": 1}
        in_use = dict.fromkeys(caps, 0)
        peak = dict.fromkeys(caps, 0)
        served = []
        async with serving(orch) as url, OrchestratorClient(url) as oc:

            async def one(i: int) -> None:
                lease = await oc.lease(timeout_s=60, client=f"c{i}")
                in_use[lease.chain_id] += 1
                peak[lease.chain_id] = max(peak[lease.chain_id], in_use[lease.chain_id])
                await asyncio.sleep(float(holds_s[i]))
                in_use[lease.chain_id] -= 1
                await oc.release(lease.lease_id)
                served.append(i)

            await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(50))), 60)
            h = await oc.health()
            metrics = await oc.metrics()
        assert sorted(served) == list(range(50))
        assert all(peak[k] <= caps[k] for k in caps), peak
        assert peak["v1.0"] == 2  # the fastest chain was used to its capacity
        assert (h["free"], h["active_leases"], h["queue_length"]) == (4, 0, 0)
        c = orch.leases.counters
        assert (c.requested, c.granted, c.released, c.cancelled, c.expired) == (50, 50, 50, 0, 0)
        assert "petals_chain_leases_granted_total 50" in metrics
        assert 'petals_chain_wait_seconds_bucket{le="+Inf"} 50' in metrics
        assert "petals_chain_service_seconds_count 50" in metrics
        assert orch.leases.wait_hist.sum_s > 0  # most of them had to queue

    run(body())


# ---- expiry, renewal, cancellation --------------------------------------------------------------


def test_lease_expiry_frees_capacity_and_renew_keeps_it() -> None:
    """A lease nobody renews expires and its slot goes to a waiter; a renewed lease survives."""

    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            kept = await oc.lease(timeout_s=5, ttl_s=0.3)
            dropped = [await oc.lease(timeout_s=5, ttl_s=0.3) for _ in range(3)]
            waiter = asyncio.create_task(oc.lease(timeout_s=5, ttl_s=30))
            t0 = time.monotonic()
            while time.monotonic() - t0 < 0.8:
                await oc.renew(kept.lease_id)
                await asyncio.sleep(0.1)
            got = await asyncio.wait_for(waiter, 5)  # a dropped lease's slot went to the waiter
            assert got.chain_id in {x.chain_id for x in dropped}
            for x in dropped:
                with pytest.raises(OrchestratorError) as err:
                    await oc.release(x.lease_id)
                assert err.value.status == 404
            await oc.release(kept.lease_id)
            await oc.release(got.lease_id)
            h = await oc.health()
        assert orch.leases.counters.expired == 3
        assert (h["free"], h["active_leases"]) == (4, 0)

    run(body())


def test_client_that_disconnects_while_waiting_leaves_the_queue() -> None:
    """A waiting client that hangs up is taken out of the queue; a timed-out one too; no slot is lost."""

    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            held = [await oc.lease(timeout_s=5) for _ in range(4)]
            async with aiohttp.ClientSession() as raw:
                task = asyncio.create_task(raw.post(url + "/lease", json={"timeout_s": 30}))
                await wait_until(lambda: _queue_len(oc, 1))
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await wait_until(lambda: _queue_len(oc, 0))
            assert orch.leases.counters.cancelled == 1

            with pytest.raises(OrchestratorError) as err:
                await oc.lease(timeout_s=0.1)
            assert err.value.status == 503 and "timeout_s" in err.value.message
            assert orch.leases.counters.timed_out == 1
            assert (await oc.queue())["length"] == 0

            await oc.release(held[0].lease_id)
            h = await oc.health()
            assert (h["free"], h["active_leases"]) == (1, 3)  # nobody phantom took the freed slot
            for x in held[1:]:
                await oc.release(x.lease_id)
            assert (await oc.health())["free"] == 4

    run(body())


# ---- bad input ----------------------------------------------------------------------------------


def test_bad_input_gets_clear_errors_and_changes_nothing() -> None:
    """Malformed JSON, unknown lease, bad memory budgets, wrong block claims: errors, state intact."""

    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            lease = await oc.lease(timeout_s=5)
            before = await oc.health()
            servers_before = json.dumps((await oc.servers()), sort_keys=True)

            async with aiohttp.ClientSession() as raw:
                async def post(path: str, data: str) -> tuple[int, str]:
                    async with raw.post(url + path, data=data, headers={"Content-Type": "application/json"}) as r:
                        return r.status, (await r.json())["error"]

                status, msg = await post("/lease", "{not json")
                assert status == 400 and "malformed JSON" in msg
                status, msg = await post("/servers/register", "[1, 2]")
                assert status == 400 and "JSON object" in msg
                status, msg = await post("/lease", json.dumps({"timeout_s": -1}))
                assert status == 400 and "timeout_s" in msg
                status, msg = await post("/lease", json.dumps({"timout_s": 1}))
                assert status == 400 and "timout_s" in msg

            cases = [
                (dict(memory_bytes=-5e9), "memory_bytes"),
                (dict(memory_bytes=1e30), "memory_bytes"),
                (dict(memory_bytes=float(MODEL.block_bytes) / 2), "memory_bytes"),
                (dict(memory_bytes=8e9, tau_p_s=0.0), "tau_p_s"),
                (dict(memory_bytes=8e9, name="bad name/../x"), "name"),
            ]
            for override, field_name in cases:
                args = dict(name="newcomer", memory_bytes=8e9, tau_p_s=0.1, tau_c_s=0.01) | override
                name = args.pop("name")
                with pytest.raises(OrchestratorError) as err:
                    await oc.register(name, **args)
                assert err.value.status == 400 and field_name in err.value.message, err.value.message

            with pytest.raises(OrchestratorError) as err:
                await oc.release("L999-nope")
            assert err.value.status == 404 and "unknown lease" in err.value.message
            with pytest.raises(OrchestratorError) as err:
                await oc.renew("L999-nope")
            assert err.value.status == 404

            # d was given blocks 0:2; claiming 2:4 (e's) is refused, 0:2 is accepted.
            with pytest.raises(OrchestratorError) as err:
                await oc.heartbeat("d", serving=(2, 4))
            assert err.value.status == 409 and "claims blocks 2:4" in err.value.message and "0:2" in err.value.message
            with pytest.raises(OrchestratorError) as err:
                await oc.heartbeat("d", serving=(0, 9))
            assert err.value.status == 400 and "serving" in err.value.message
            with pytest.raises(OrchestratorError) as err:
                await oc.heartbeat("ghost")
            assert err.value.status == 404 and "ghost" in err.value.message
            with pytest.raises(OrchestratorError) as err:
                await oc.report_failure(lease.lease_id, "b", timeout_s=1)  # b is not on this lease's chain (a)
            assert err.value.status == 400 and "'b'" in err.value.message

            after = await oc.health()
            servers_after = json.dumps((await oc.servers()), sort_keys=True)
            assert servers_after == servers_before
            for k in ("version", "capacity", "free", "active_leases", "servers_alive", "chains"):
                assert after[k] == before[k], k
            assert "newcomer" not in orch.registry.servers
            ok = await oc.heartbeat("d", serving=(0, 2))
            assert (ok.start, ok.end) == (0, 2)
            await oc.renew(lease.lease_id)  # the accepted lease survived all of it
            await oc.release(lease.lease_id)
            assert orch.http_errors.get(400, 0) >= 9

    run(body())


def test_bearer_token_required_except_health() -> None:
    """With a token, every route but /health wants ``Authorization: Bearer <token>``."""

    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch, token="s3cret") as url:
            async with OrchestratorClient(url) as anon, OrchestratorClient(url, token="wrong") as bad:
                assert (await anon.health())["status"] == "ok"
                for client in (anon, bad):
                    with pytest.raises(OrchestratorError) as err:
                        await client.lease(timeout_s=1)
                    assert err.value.status == 401
            assert orch.leases.counters.requested == 0
            async with OrchestratorClient(url, token="s3cret") as good:
                lease = await good.lease(timeout_s=1)
                await good.release(lease.lease_id)
                assert "petals_chain_queue_length 0" in await good.metrics()

    run(body())


# ---- recomposition ------------------------------------------------------------------------------


def test_recomposition_carries_leases_on_surviving_chains_and_orphans_the_rest() -> None:
    """A lease on a chain that survives keeps its slot; one on a vanished chain is not re-offered."""
    orch = make_orchestrator()

    async def body() -> None:
        l_a = await orch.leases.acquire(timeout_s=1)
        l_a2 = await orch.leases.acquire(timeout_s=1)
        l_b = await orch.leases.acquire(timeout_s=1)
        assert [chain_servers_of(x) for x in (l_a, l_a2, l_b)] == [("a",), ("a",), ("b",)]
        # v2: chain a is kept (now listed second, capacity 3); b and d→e are gone; a new chain e-only is absent.
        orch.install(hand_composition(orch.registry, [(("d", "e"), (2, 2), 2, 3.0), (("a",), (4,), 3, 1.0)]))
        snap = orch.leases.snapshot()
        assert snap.occupancy == [0, 2] and snap.orphaned == 1
        nxt = await orch.leases.acquire(timeout_s=1)
        assert chain_servers_of(nxt) == ("a",)  # the one free slot of a, still the fastest
        assert orch.leases.free_capacity() == 2
        orch.leases.release(l_b.lease_id)  # orphan: nothing re-offered
        assert orch.leases.free_capacity() == 2
        orch.leases.release(l_a.lease_id)
        assert orch.leases.free_capacity() == 3
        for x in (l_a2, nxt):
            orch.leases.release(x.lease_id)
        assert orch.leases.free_capacity() == orch.leases.snapshot().capacities[0] + 3 == 5

    run(body())


def chain_servers_of(lease) -> tuple[str, ...]:
    """Server names of a LeaseManager lease."""
    return tuple(s.server for s in lease.chain.spans)


def test_waiters_keep_fifo_order_across_a_recomposition_without_chains() -> None:
    """Requests that arrive while there are no chains wait and are served in order once chains appear."""
    orch = make_orchestrator()

    async def body() -> None:
        orch.install(None, "test: no composition")
        tasks = [asyncio.create_task(orch.leases.acquire(timeout_s=5, client=f"w{i}")) for i in range(3)]
        await asyncio.sleep(0.01)
        assert orch.leases.queue_length() == 3 and not any(t.done() for t in tasks)
        orch.install(hand_composition(orch.registry, [(("b",), (4,), 1, 2.0)]))
        await asyncio.sleep(0.01)
        done = [t for t in tasks if t.done()]
        assert [t.result().client for t in done] == ["w0"]
        orch.leases.release(tasks[0].result().lease_id)
        await asyncio.sleep(0.01)
        assert tasks[1].done() and not tasks[2].done()
        orch.leases.release(tasks[1].result().lease_id)
        await asyncio.sleep(0.01)
        orch.leases.release((await tasks[2]).lease_id)
        assert orch.leases.free_capacity() == 1

    run(body())


def test_a_replacement_lease_keeps_its_place_ahead_of_later_requests() -> None:
    """A lease whose chain broke asks again with its job: the next free slot is its, not the queue head's;
    a job that still holds a lease cannot resume, and the queue limit never refuses a resumed job."""
    from petals_chain.orchestrator.engine.chains import ChainInfo
    from petals_chain.orchestrator.leasing.leases import LeaseManager
    from petals_chain.protocol.hop import Hop

    fast = ChainInfo((Hop("x", 0, 4),), capacity=1, service_time_s=1.0, chain_id="x")
    slow = ChainInfo((Hop("y", 0, 4),), capacity=1, service_time_s=2.0, chain_id="y")

    async def body() -> None:
        lm = LeaseManager(max_waiting=2)
        lm.set_chains([fast, slow], 1)
        lx, ly = await lm.acquire(timeout_s=1), await lm.acquire(timeout_s=1)
        waiters = [asyncio.create_task(lm.acquire(timeout_s=5, client=f"w{i}")) for i in range(2)]
        await asyncio.sleep(0.01)
        assert lm.queue_length() == 2
        with pytest.raises(ValueError, match="still holds a lease"):
            await lm.acquire(timeout_s=1, resume_job=ly.job)
        lm.set_chains([slow], 2)  # x died: its lease is orphaned, y's lease carries over
        lm.release(lx.lease_id, failed=True)
        again = asyncio.create_task(lm.acquire(timeout_s=5, replaces=lx.lease_id, resume_job=lx.job))
        await asyncio.sleep(0.01)
        assert [job for job, _, _ in lm.queued()][0] == lx.job and lm.queue_length() == 3  # over max_waiting
        lm.release(ly.lease_id)
        await asyncio.sleep(0.01)
        assert again.done() and not any(w.done() for w in waiters)
        replacement = again.result()
        assert (replacement.job, replacement.replaces, replacement.chain.chain_id) == (lx.job, lx.lease_id, "y")
        lm.release(replacement.lease_id)
        await asyncio.sleep(0.01)
        assert waiters[0].done() and not waiters[1].done()  # then FIFO among the others
        lm.release(waiters[0].result().lease_id)
        lm.release((await waiters[1]).lease_id)
        assert lm.free_capacity() == 1

    run(body())


def test_chains_are_offered_only_once_their_servers_serve_their_spans() -> None:
    """offer_when_serving: nothing is leased while the servers load; a chain appears when every server on it
    reports its span; a server that reloads (or re-registers) withdraws its chains, its lease keeps its slot
    and takes it up again when the server serves once more."""

    async def body() -> None:
        registry = Registry(MODEL)
        orch = Orchestrator(registry, OrchestratorConfig(heartbeat_timeout_s=None, offer_when_serving=True),
                            composition_policy=PAPER)
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            for i in range(3):
                await oc.register(f"s{i}", memory_bytes=5 * GB, tau_p_s=0.1 * (i + 1), tau_c_s=0.02)
            h = await oc.health()
            assert h["composition"] and h["chains_composed"] >= 1 and (h["chains"], h["capacity"]) == (0, 0)
            with pytest.raises(OrchestratorError) as err:
                await oc.lease(timeout_s=0.2)
            assert err.value.status == 503
            assigned = {f"s{i}": await oc.assignment(f"s{i}") for i in range(3)}
            holders = {n: (x.start, x.end) for n, x in assigned.items() if x.end > x.start}
            waiting = asyncio.create_task(oc.lease(timeout_s=10))
            for n, span in holders.items():
                await oc.heartbeat(n, serving=(span[0], span[0]))  # still loading
            await asyncio.sleep(0.05)
            assert not waiting.done() and (await oc.health())["capacity"] == 0
            for n, span in holders.items():
                await oc.heartbeat(n, serving=span)
            lease = await asyncio.wait_for(waiting, 5)
            h = await oc.health()
            assert h["chains"] == h["chains_composed"] and h["capacity"] >= 1 and h["free"] == h["capacity"] - 1
            full = h["capacity"]
            on = lease.spans[0].server
            await oc.heartbeat(on, serving=(holders[on][0], holders[on][0]))  # reloading: its chains withdrawn
            h = await oc.health()
            assert h["chains"] < h["chains_composed"] and h["capacity"] < full and h["orphaned_leases"] == 1
            assert all(on not in [sp["server"] for sp in c["spans"]] for c in (await oc.chains())["chains"])
            await oc.heartbeat(on, serving=holders[on])  # back: the lease takes its slot again
            h = await oc.health()
            assert (h["capacity"], h["free"], h["orphaned_leases"]) == (full, full - 1, 0)
            await oc.register(on, memory_bytes=5 * GB, tau_p_s=0.1 * (int(on[1]) + 1), tau_c_s=0.02)  # restarted
            assert registry.servers[on].serving is None and (await oc.health())["capacity"] < full
            await oc.heartbeat(on, serving=holders[on])
            await oc.release(lease.lease_id)
            h = await oc.health()
            assert (h["capacity"], h["free"], h["active_leases"]) == (full, full, 0)

    run(body())


def test_register_heartbeat_and_report_failure_recompose_with_the_real_pipeline() -> None:
    """Servers register over HTTP → compose(); a reported failure recomposes and re-leases elsewhere."""

    async def body() -> None:
        registry = Registry(MODEL)
        orch = Orchestrator(registry, OrchestratorConfig(heartbeat_timeout_s=None), composition_policy=PAPER)
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            assert (await oc.health())["composition"] is False
            for i in range(4):
                a = await oc.register(f"s{i}", memory_bytes=5 * GB, tau_p_s=0.1 * (i + 1), tau_c_s=0.02,
                                      peer_id=f"peer-s{i}")
            assert a is not None
            h = await oc.health()
            assert h["composition"] and h["capacity"] >= 1 and h["version"] >= 2
            assigned = {f"s{i}": await oc.assignment(f"s{i}") for i in range(4)}
            holders = {n: x for n, x in assigned.items() if x.end > x.start}
            covered = sorted({b for x in holders.values() for b in range(x.start, x.end)})
            assert covered == list(range(MODEL.num_blocks))
            for n, x in holders.items():
                assert (await oc.heartbeat(n, serving=(x.start, x.end))).version == h["version"]

            lease = await oc.lease(timeout_s=5)
            assert sum(s.end - s.start for s in lease.spans) == MODEL.num_blocks
            assert lease.spans[0].start == 0 and lease.spans[-1].end == MODEL.num_blocks
            victim = lease.spans[0].server
            new = await oc.report_failure(lease.lease_id, victim, timeout_s=10)
            assert new.replaces == lease.lease_id and new.version > lease.version
            assert new.lease_id.split("-")[0] == lease.lease_id.split("-")[0]  # the same job, keeping its place
            assert victim not in chain_servers(new)
            chains = await oc.chains()
            assert all(victim not in [s["server"] for s in c["spans"]] for c in chains["chains"])
            servers = {s["name"]: s for s in (await oc.servers())["servers"]}
            assert servers[victim]["alive"] is False
            with pytest.raises(OrchestratorError) as err:
                await oc.heartbeat(victim)
            assert err.value.status == 410
            await oc.release(new.lease_id)
            h2 = await oc.health()
            assert (h2["free"], h2["active_leases"]) == (h2["capacity"], 0)
            # The dead server comes back by registering again; it is composed in once more.
            await oc.register(victim, memory_bytes=5 * GB, tau_p_s=0.1, tau_c_s=0.02)
            assert (await oc.health())["servers_alive"] == 4

    run(body())


def test_silent_server_is_marked_dead_and_composed_out() -> None:
    """A registered server that stops heartbeating is dropped from the composition."""

    async def body() -> None:
        registry = Registry(MODEL)
        orch = Orchestrator(registry, OrchestratorConfig(heartbeat_timeout_s=0.4), composition_policy=PAPER)
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            for i in range(3):
                await oc.register(f"s{i}", memory_bytes=5 * GB, tau_p_s=0.1, tau_c_s=0.02)
            t0 = time.monotonic()
            while time.monotonic() - t0 < 1.2:
                for i in (0, 1):
                    await oc.heartbeat(f"s{i}")
                await asyncio.sleep(0.1)
            h = await oc.health()
            chains = await oc.chains()
        assert h["servers_alive"] == 2 and registry.servers["s2"].alive is False
        assert all("s2" not in [s["server"] for s in c["spans"]] for c in chains["chains"])
        assert h["capacity"] >= 1

    run(body())


def test_pinned_servers_keep_the_planned_times_and_bad_figures_are_still_refused() -> None:
    """A pinned server registers and heartbeats with its own τ, yet the registry keeps the planned τ (no
    recomposition from its drift); a malformed τ is still a 400 that changes nothing; others keep their own."""
    from petals_chain.model import ServerSpec

    async def body() -> None:
        registry = Registry(MODEL)
        plan = ServerSpec("p", 5 * GB, tau_c_s=0.05, tau_p_s=0.5)
        orch = Orchestrator(registry, OrchestratorConfig(heartbeat_timeout_s=None, pinned={"p": plan}),
                            composition_policy=PAPER)
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            await oc.register("p", memory_bytes=5 * GB * (1 + 1e-9), tau_p_s=0.1, tau_c_s=0.01)
            await oc.register("q", memory_bytes=5 * GB, tau_p_s=0.2, tau_c_s=0.02)
            rec = registry.servers["p"]
            assert (rec.tau_p_s, rec.tau_c_s, rec.memory_bytes) == (0.5, 0.05, 5 * GB)
            assert (registry.servers["q"].tau_p_s, registry.servers["q"].tau_c_s) == (0.2, 0.02)
            version, recomps = (await oc.health())["version"], orch.recompositions
            await oc.heartbeat("p", tau_p_s=0.01, tau_c_s=0.001)  # 50× faster by its own clock: ignored
            assert (rec.tau_p_s, rec.tau_c_s) == (0.5, 0.05)
            assert (await oc.health())["version"] == version and orch.recompositions == recomps
            with pytest.raises(OrchestratorError) as err:
                await oc.heartbeat("p", tau_p_s=-1.0)
            assert err.value.status == 400 and "tau_p_s" in str(err.value)
            await oc.heartbeat("q", tau_p_s=0.8)  # unpinned: its drift is taken and recomposed
            assert registry.servers["q"].tau_p_s == 0.8 and orch.recompositions > recomps
            assert (rec.tau_p_s, rec.tau_c_s) == (0.5, 0.05)

    run(body())


def test_a_pinned_serial_fraction_reaches_the_composition() -> None:
    """σ comes with the pinned times from the cluster file (a server does not report it): the server's whole-model
    chain keeps the 2 slots it can run one at a time, not the 10 its memory holds; the API shows σ."""
    from petals_chain.compose.method_table import METHODS
    from petals_chain.model import ServerSpec

    async def body() -> None:
        registry = Registry(MODEL)
        plan = ServerSpec("p", 8 * GB, tau_c_s=1.0, tau_p_s=0.25, serial_fraction=1.0)  # T = 2 s, D = 1 s per job
        orch = Orchestrator(registry, OrchestratorConfig(heartbeat_timeout_s=None, pinned={"p": plan}),
                            composition_policy=CompositionPolicy(METHODS["proposed"].compose, arrival_rate=0.2))
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            await oc.register("p", memory_bytes=8 * GB, tau_p_s=0.1, tau_c_s=0.01)
            assert [ch.capacity for ch in registry.composition.chains] == [2]
            assert registry.servers["p"].to_json()["serial_fraction"] == 1.0
            await oc.register("q", memory_bytes=8 * GB, tau_p_s=0.25, tau_c_s=1.0)  # unpinned: the paper's model
            assert registry.servers["q"].serial_fraction == 0.0

    run(body())


# ---- the JFFC addition and the CLI --------------------------------------------------------------


def test_jffc_occupy_takes_a_specific_slot() -> None:
    """JFFC.occupy marks a slot busy on the named chain so arrivals skip it when it is full."""
    p = JFFC([1.0, 0.5], [1, 2])
    assert p.occupy(0) and not p.occupy(0)
    assert p.occupancy() == [1, 0]
    assert p.on_arrival(1)[0].chain == 1
    p.on_departure(99, 0)
    assert p.on_arrival(2)[0].chain == 0


def test_cli_serves_and_rejects_bad_arguments() -> None:
    """`python -m petals_chain.orchestrator` listens on a loopback port; bad arguments exit 2 with one line."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    bad = subprocess.run(
        [sys.executable, "-m", "petals_chain.orchestrator", "--model-blocks", "4", "--port", "0"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert bad.returncode == 2 and "--block-bytes" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    unpinnable = subprocess.run(
        [sys.executable, "-m", "petals_chain.orchestrator", "--model-blocks", "4", "--block-bytes", "1e9",
         "--cache-bytes", "1e8", "--pin-cluster-times", "--port", "0"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert unpinnable.returncode == 2 and "--pin-cluster-times needs --cluster" in unpinnable.stderr
    proc = subprocess.Popen(
        [sys.executable, "-m", "petals_chain.orchestrator", "--model-blocks", "4", "--block-bytes", "1e9",
         "--cache-bytes", "1e8", "--port", "0", "--token", "t0k"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
    )
    try:
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line, line
        url = line.split("listening on ")[1].split()[0]

        async def talk() -> None:
            async with OrchestratorClient(url, token="t0k") as oc:
                h = await oc.health()
                assert h["composition"] is False
                assert h["dht"] is None and h["model"]["num_blocks"] == 4  # no DHT asked for (see test_swarm.py)
                await oc.register("s0", memory_bytes=5 * GB, tau_p_s=0.1, tau_c_s=0.01)
                with pytest.raises(OrchestratorError):  # composed, but s0 has not said it serves its blocks yet
                    await oc.lease(timeout_s=0.3)
                await oc.heartbeat("s0", serving=(0, 4))
                lease = await oc.lease(timeout_s=10)
                assert [(s.start, s.end) for s in lease.spans] == [(0, 4)]
                await oc.release(lease.lease_id)

        if _compose_available():
            run(talk())
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err


def _compose_available() -> bool:
    """Whether the lead's composition pipeline can be imported."""
    try:
        import petals_chain.compose.tuning  # noqa: F401
    except ImportError:
        return False
    return True


def test_bench_smoke_restores_capacity_and_writes_figures(tmp_path: Path) -> None:
    """`bench orchestrator` runs end to end on a small swarm and reports every round trip it made."""
    from petals_chain.bench.orchestrator import run as bench_run

    out = tmp_path / "orch.json"
    code = bench_run(["--chains", "20", "--concurrency", "3", "--requests", "30", "--pairs", "500", "--json", str(out),
                      "--client", "protocol", "raw"])
    data = json.loads(out.read_text())
    assert code == 0 and data["chains"] == 20
    assert [r["round_trips"] for r in data["http"]] == [30]
    assert data["http"][0]["p99_ms"] >= data["http"][0]["p50_ms"] > 0
    runs = {(r["persistence"], r["loop"], r["client"]) for r in data["persistence"]}
    # old loop and new, the protocol's client and the lean generator, in the same run
    assert {("off", "asyncio", "protocol"), ("off", "uvloop", "protocol"), ("off", "uvloop", "raw"),
            ("normal", "uvloop", "raw")} <= runs
    assert all(r["round_trips"] == 30 for r in data["persistence"])  # every round trip of the lean one answered 200
    assert all(r["orchestrator_cpu_us_per_round_trip"] > 0 and r["client_cpu_us_per_round_trip"] > 0
               for r in data["persistence"])
    assert data["jffc"]["free_us"] > 0 and data["jffc"]["saturated_us"] > 0
