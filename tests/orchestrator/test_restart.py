"""An orchestrator restored from its state store: same composition, leases kept (no slot handed out twice), the
queue served in its original order when its clients come back, and clients that retry while it is down."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer as LoopbackServer  # alias: pytest must not collect it

from petals_chain.model import Chain, Composition, ModelSpec, Placement, ServerSpec
from petals_chain.orchestrator.http.api import build_app
from petals_chain.orchestrator.trust.auth import Credentials
from petals_chain.orchestrator.engine.composition import CompositionPolicy
from petals_chain.orchestrator.engine.config import OrchestratorConfig
from petals_chain.orchestrator.engine.core import Orchestrator
from petals_chain.orchestrator.leasing.leases import LeaseTimeoutError
from petals_chain.orchestrator.state.persist import Persistence
from petals_chain.orchestrator.state.registry import Registry
from petals_chain.orchestrator.state.store import StateStore
from petals_chain.protocol.auth import SECRET_HEADER
from petals_chain.protocol.http_client import OrchestratorClient, OrchestratorUnreachableError
from petals_chain.protocol.requests import RegisterBody

GB = 1e9
MODEL = ModelSpec(num_blocks=4, block_bytes=1 * GB, cache_bytes=0.25 * GB, name="tiny")
SERVERS = {"a": 6 * GB, "b": 5.5 * GB, "c": 7 * GB}  # 2, 1 and 3 slots


class Clock:
    """A hand-driven clock, so that expiry and grace periods are exact."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def whole_model_chains(servers: tuple[ServerSpec, ...], model: ModelSpec, *_: object, **__: object) -> Composition:
    """A small deterministic composer (instead of GBP-CR/GCA, whose first call compiles): every server holds the
    whole model as its own chain, as many slots as its memory leaves for caches."""
    L = model.num_blocks
    slots = [int((s.memory_bytes - L * model.block_bytes) // (L * model.cache_bytes)) for s in servers]
    chains = tuple(Chain((j,), (L,), n, L * s.tau_p_s + s.tau_c_s) for j, (s, n) in enumerate(zip(servers, slots)))
    return Composition(tuple(servers), model, Placement((1,) * len(servers), (L,) * len(servers)), chains, c=1)


def restored(clock: Clock, store: StateStore, attach_grace_s: float, *, offer_when_serving: bool = False
             ) -> Orchestrator:
    """A fresh orchestrator for MODEL (no servers yet), as the CLI builds it, restored from ``store``."""
    registry = Registry(MODEL)
    state = Persistence(store)
    orch = Orchestrator(registry, OrchestratorConfig(heartbeat_timeout_s=None, offer_when_serving=offer_when_serving),
                        composition_policy=CompositionPolicy(whole_model_chains, arrival_rate=0.5), clock=clock,
                        state=state)
    state.restore(attach_grace_s=attach_grace_s)
    return orch


async def registered(clock: Clock, store: StateStore) -> Orchestrator:
    """A first run: attached to an empty store, then four servers register and the composition follows them."""
    orch = restored(clock, store, 30.0)
    for k, (name, memory) in enumerate(SERVERS.items()):
        await orch.register(RegisterBody(name=name, memory_bytes=memory, tau_p_s=0.01 * (k + 1), tau_c_s=0.05,
                                         peer_id=f"peer-{name}", max_batch_sessions=16))
    return orch


def occupancy(orch: Orchestrator) -> list[tuple[int, int]]:
    """(busy, capacity) of every offered chain."""
    snap = orch.leases.snapshot()
    return list(zip(snap.occupancy, snap.capacities))


async def crash(orch: Orchestrator, tasks: list[asyncio.Task]) -> None:
    """The process dies once what its clients were told is committed (the API answers only then): nothing more
    reaches the store, and its waiting HTTP handlers vanish."""
    await orch.state.durable()
    orch.state.detach()
    for t in tasks:
        t.cancel()


def test_restart_keeps_composition_leases_and_queue_order(tmp_path: Path) -> None:
    async def main() -> None:
        clock = Clock()
        store = StateStore(tmp_path / "state.db")
        first = await registered(clock, store)
        chains = [(c.key, c.capacity) for c in first.composed]
        capacity = sum(cap for _, cap in chains)
        assert capacity == 6 and first.registry.composition is not None
        held = [await first.leases.acquire(timeout_s=1, request_id=f"held{i}") for i in range(capacity)]
        waiting = [asyncio.create_task(first.leases.acquire(timeout_s=60, request_id=f"w{i}")) for i in range(3)]
        await asyncio.sleep(0.01)
        assert [j for j, _, _ in first.leases.queued()] == [capacity, capacity + 1, capacity + 2]
        first.leases.release(held.pop(0).lease_id)  # w0 gets that slot: leased, not waiting, when we crash
        w0 = await waiting[0]
        await crash(first, waiting[1:])
        store.close()

        clock.now_s += 5.0
        second = restored(clock, StateStore(tmp_path / "state.db"), 30.0)
        assert [(c.key, c.capacity) for c in second.composed] == chains  # the swarm serves the same chains
        assert second.registry.version > first.registry.version
        assert {r.name: r.peer_id for r in second.registry.servers.values()} == {n: f"peer-{n}" for n in SERVERS}
        # Every lease is back and holds its slot: the chains are full, nothing is handed out twice.
        assert {x.lease_id for x in second.leases.leases()} == {x.lease_id for x in held} | {w0.lease_id}
        assert all(busy == cap for busy, cap in occupancy(second))
        assert second.leases.renew(held[0].lease_id).expires_s == clock.now_s + held[0].ttl_s
        # A retry of w0's request finds its lease; a newcomer queues behind w1 and w2, who come back in any order.
        assert (await second.leases.acquire(timeout_s=1, request_id="w0")).lease_id == w0.lease_id
        newcomer = asyncio.create_task(second.leases.acquire(timeout_s=60, request_id="new"))
        await asyncio.sleep(0.01)
        w2 = asyncio.create_task(second.leases.acquire(timeout_s=60, request_id="w2"))
        w1 = asyncio.create_task(second.leases.acquire(timeout_s=60, request_id="w1"))
        await asyncio.sleep(0.01)
        assert second.leases.queue_length() == 3
        order = []
        for task in (w1, w2, newcomer):
            second.leases.release(held.pop(0).lease_id)
            await asyncio.sleep(0.01)
            order.append([t.done() for t in (w1, w2, newcomer)])
        assert order == [[True, False, False], [True, True, False], [True, True, True]]
        assert (await w1).job < (await w2).job < (await newcomer).job
        assert all(busy <= cap for busy, cap in occupancy(second))

    asyncio.run(main())


def test_a_restored_request_whose_client_never_returns_leaves_the_queue(tmp_path: Path) -> None:
    async def main() -> None:
        clock = Clock()
        store = StateStore(tmp_path / "state.db")
        first = await registered(clock, store)
        capacity = sum(c.capacity for c in first.composed)
        held = [await first.leases.acquire(timeout_s=1) for _ in range(capacity)]
        gone = asyncio.create_task(first.leases.acquire(timeout_s=60, request_id="gone"))
        await asyncio.sleep(0.01)
        await crash(first, [gone])

        second = restored(clock, StateStore(tmp_path / "state.db"), 10.0)
        assert second.leases.queue_length() == 1
        clock.now_s += 9.0
        second.leases.expire_due()
        assert second.leases.queue_length() == 1
        clock.now_s += 2.0  # past the grace; the leases (renewed at restore) are not due yet
        assert second.leases.expire_due() == []
        assert second.leases.queue_length() == 0
        second.leases.release(held[0].lease_id)
        assert second.leases.free_capacity() == 1  # the slot is not held for the vanished request
        await second.state.durable()
        third = restored(clock, StateStore(tmp_path / "state.db"), 10.0)
        assert third.leases.queue_length() == 0 and len(third.leases.leases()) == capacity - 1

    asyncio.run(main())


def test_chains_wait_for_heartbeats_and_leases_reclaim_their_slots_first(tmp_path: Path) -> None:
    """With offer_when_serving (the CLI's default) nothing is offered after a restart until the servers report
    their spans; then the restored leases take their slots before any waiting request."""

    async def main() -> None:
        clock = Clock()
        store = StateStore(tmp_path / "state.db")
        first = await registered(clock, store)
        capacity = sum(c.capacity for c in first.composed)
        held = [await first.leases.acquire(timeout_s=1) for _ in range(capacity)]
        await crash(first, [])

        second = restored(clock, StateStore(tmp_path / "state.db"), 10.0, offer_when_serving=True)
        assert second.leases.chains == []
        newcomer = asyncio.create_task(second.leases.acquire(timeout_s=60))
        await asyncio.sleep(0.01)
        from petals_chain.protocol.requests import HeartbeatBody

        for rec in list(second.registry.servers.values()):
            a = rec.assignment
            serving = {"start": a.start, "end": a.end} if a is not None else None
            await second.heartbeat(HeartbeatBody.model_validate({"name": rec.name, "serving": serving}))
        assert len(second.leases.chains) == len(first.composed)
        assert not newcomer.done() and all(busy == cap for busy, cap in occupancy(second))
        second.leases.release(held[0].lease_id)
        await asyncio.sleep(0.01)
        assert newcomer.done()

    asyncio.run(main())


def _free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_client_retries_while_the_orchestrator_is_down_and_gives_up_after_its_bound(tmp_path: Path) -> None:
    async def main() -> None:
        port = _free_port()
        url = f"http://127.0.0.1:{port}"
        async with OrchestratorClient(url, unreachable_wait_s=0.5) as oc:
            t0 = time.monotonic()
            with pytest.raises(OrchestratorUnreachableError, match=r"cannot reach the orchestrator .* attempts in"):
                await oc.health()
            assert 0.3 <= time.monotonic() - t0 < 10.0 and oc.retries >= 3  # 0.05 + 0.1 + 0.2 s of pauses

        clock = Clock()
        store = StateStore(tmp_path / "state.db")
        orch = await registered(clock, store)
        runner = web.AppRunner(build_app(orch))
        await runner.setup()

        async def start_late() -> None:
            await asyncio.sleep(1.0)  # the orchestrator comes up while the client is already retrying
            await web.TCPSite(runner, "127.0.0.1", port).start()

        starter = asyncio.create_task(start_late())
        try:
            async with OrchestratorClient(url, unreachable_wait_s=20.0) as oc:
                lease = await oc.lease(timeout_s=5, request_id="late")
                assert oc.retries >= 2
                again = await oc.lease(timeout_s=5, request_id="late")  # a retry of the same request
                assert again.lease_id == lease.lease_id and orch.leases.snapshot().active == 1
        finally:
            await starter
            await runner.cleanup()

    asyncio.run(main())


def test_no_lease_without_chains_times_out_as_before(tmp_path: Path) -> None:
    async def main() -> None:
        orch = restored(Clock(), StateStore(tmp_path / "state.db"), 1.0)
        with pytest.raises(LeaseTimeoutError):
            await orch.leases.acquire(timeout_s=0.05, request_id="x")
        await orch.state.durable()
        assert StateStore(tmp_path / "state.db").load().waiting == []  # it left the stored queue too

    asyncio.run(main())


def test_group_commit_batches_writes_and_keeps_their_order(tmp_path: Path) -> None:
    """Writes made while a commit runs go into the next one; after durable() the database holds them all."""

    async def main() -> None:
        clock = Clock()
        orch = await registered(clock, StateStore(tmp_path / "state.db", synchronous="full"))
        await orch.state.durable()
        group = orch.leases.journal.group
        before = group.commits
        leases = [await orch.leases.acquire(timeout_s=1, request_id=f"r{i}") for i in range(6)]
        for x in leases[:3]:
            orch.leases.release(x.lease_id)
        waiting = asyncio.create_task(orch.leases.acquire(timeout_s=60, request_id="w"))
        await asyncio.sleep(0)
        await orch.state.durable()
        assert group.commits - before < 10  # 10 writes (6 grants, 3 ends, 1 grant), fewer transactions
        got = StateStore(tmp_path / "state.db").load()
        assert [x.lease_id for x in got.leases] == [x.lease_id for x in leases[3:]] + [(await waiting).lease_id]
        assert got.waiting == [] and got.meta["next_job"] == "7"

    asyncio.run(main())


def test_cli_refuses_an_unusable_state_dir_and_routed_methods(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from petals_chain.orchestrator.cli import main

    model = ["--model-blocks", "4", "--block-bytes", "1e6", "--cache-bytes", "1e5", "--port", "0"]
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "state.sqlite3").write_bytes(b"not a database" * 200)
    assert main([*model, "--state-dir", str(junk)]) == 2
    assert "state.sqlite3: cannot open the state database" in capsys.readouterr().err
    afile = tmp_path / "a-file"
    afile.write_text("x")
    assert main([*model, "--state-dir", str(afile)]) == 2
    assert f"--state-dir {afile}: cannot create it" in capsys.readouterr().err
    assert main([*model, "--method", "bprr", "--state-dir", str(tmp_path / "s")]) == 2
    assert "--state-dir: method bprr routes each request" in capsys.readouterr().err


def test_the_api_answers_only_once_the_change_is_committed(tmp_path: Path) -> None:
    """A granted lease and a release are in the database (read through another connection) when their replies
    arrive, though the commits run in a worker thread."""

    async def main() -> None:
        orch = await registered(Clock(), StateStore(tmp_path / "state.db", synchronous="full"))
        server = LoopbackServer(build_app(orch), host="127.0.0.1")
        await server.start_server()
        reader = StateStore(tmp_path / "state.db")
        try:
            async with OrchestratorClient(str(server.make_url(""))) as oc:
                for _ in range(5):
                    lease = await oc.lease(timeout_s=5)
                    assert lease.lease_id in {x.lease_id for x in reader.load().leases}
                    await oc.release(lease.lease_id)
                    assert lease.lease_id not in {x.lease_id for x in reader.load().leases}
        finally:
            await server.close()

    asyncio.run(main())


ROLES = Credentials(client="c-tok", server="s-tok", operator="o-tok")


async def _status(http: aiohttp.ClientSession, method: str, url: str, token: str | None, body: dict | None = None,
                  **headers: str) -> tuple[int, dict]:
    """One request with an optional bearer token → (status, JSON reply)."""
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with http.request(method, url, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


def test_server_secrets_and_evictions_survive_a_restart_as_salted_hashes(tmp_path: Path) -> None:
    """Issue 23: after a restart a restored name answers only to the secret issued to it before (the store keeps a
    salted PBKDF2 hash of each, never the secret); a takeover with the server credential alone is a 403, the real
    server's heartbeat and re-registration work with its old secret, and an eviction stays in force."""

    async def main() -> None:
        db = tmp_path / "state.db"
        first = restored(Clock(), StateStore(db), 30.0)
        server = LoopbackServer(build_app(first, credentials=ROLES), host="127.0.0.1")
        await server.start_server()
        url = str(server.make_url("")).rstrip("/")
        issued = {}
        try:
            async with aiohttp.ClientSession() as http:
                for name, memory in SERVERS.items():
                    status, reply = await _status(http, "POST", url + "/servers/register", "s-tok",
                                                  {"name": name, "memory_bytes": memory, "tau_p_s": 0.01,
                                                   "tau_c_s": 0.05, "peer_id": f"peer-{name}",
                                                   "max_batch_sessions": 16})
                    assert status == 200, reply
                    issued[name] = reply["secret"]
                assert (await _status(http, "POST", url + "/servers/c/evict", "o-tok", {"reason": "bad"}))[0] == 200
        finally:
            await server.close()
        await first.state.close()

        raw = db.read_bytes() + (tmp_path / "state.db-wal").read_bytes() if (tmp_path / "state.db-wal").exists() \
            else db.read_bytes()
        assert not any(secret.encode() in raw for secret in issued.values())  # only hashes reach the disk
        stored = StateStore(db).load()
        assert set(stored.secrets) == {"a", "b"} and stored.banned == {"c": "bad"}
        salts = {h.split("$")[2] for h in stored.secrets.values()}
        assert all(h.startswith("pbkdf2_sha256$") for h in stored.secrets.values()) and len(salts) == 2

        second = restored(Clock(), StateStore(db), 30.0)
        server = LoopbackServer(build_app(second, credentials=ROLES), host="127.0.0.1")
        await server.start_server()
        url = str(server.make_url("")).rstrip("/")
        try:
            async with aiohttp.ClientSession() as http:
                assert second.registry.servers["a"].alive  # restored: counted as heard from now
                grab = {"name": "a", "memory_bytes": 9 * GB, "tau_p_s": 0.001, "tau_c_s": 0.01, "peer_id": "peer-x",
                        "max_batch_sessions": 16}
                status, reply = await _status(http, "POST", url + "/servers/register", "s-tok", grab)
                assert status == 403 and "only it may register again" in reply["error"], reply
                status, _ = await _status(http, "POST", url + "/servers/register", "s-tok", grab,
                                          **{SECRET_HEADER: issued["b"]})  # another server's secret: still no
                assert status == 403
                beat = {"name": "a", "serving": {"start": 0, "end": 0}}
                for token in ("s-tok", issued["b"], "forged"):
                    assert (await _status(http, "POST", url + "/servers/heartbeat", token, beat))[0] in (401, 403)
                assert (await _status(http, "POST", url + "/servers/a/leave", "s-tok", {}))[0] == 403
                assert second.registry.servers["a"].peer_id == "peer-a" and second.registry.servers["a"].alive
                # the real servers speak with the secrets they got before the restart
                assert (await _status(http, "POST", url + "/servers/heartbeat", issued["a"], beat))[0] == 200
                again = {"name": "b", "memory_bytes": SERVERS["b"], "tau_p_s": 0.02, "tau_c_s": 0.05,
                         "peer_id": "peer-b", "max_batch_sessions": 16}
                status, reply = await _status(http, "POST", url + "/servers/register", "s-tok", again,
                                              **{SECRET_HEADER: issued["b"]})
                assert status == 200 and reply["secret"] == issued["b"], reply
                back = {"name": "c", "memory_bytes": SERVERS["c"], "tau_p_s": 0.03, "tau_c_s": 0.05,
                        "peer_id": "peer-c", "max_batch_sessions": 16}
                status, reply = await _status(http, "POST", url + "/servers/register", "s-tok", back)
                assert status == 403 and "evicted" in reply["error"], reply
        finally:
            await server.close()
            await second.state.close()

    asyncio.run(main())
