"""Roles, per-server secrets, belief in registrations, suspects and rate limits: the probe's attacks, refused.

The HTTP tests run the real aiohttp app on loopback. The belief tests answer the orchestrator's questions about peers
from a table (:class:`TableSwarm`), so that every case is exact; the same questions asked of a real DHT are in
tests/live/test_trust_live.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp.test_utils import TestServer as LoopbackServer

from petals_chain.orchestrator.http.api import build_app
from petals_chain.orchestrator.trust.auth import Credentials, Role
from petals_chain.orchestrator.engine.config import OrchestratorConfig
from petals_chain.orchestrator.engine.core import Orchestrator
from petals_chain.orchestrator.state.registry import ClaimError, Registry
from petals_chain.orchestrator.trust.suspects import FalseReportLimiter, RateLimitedError
from petals_chain.orchestrator.trust.belief import Trust
from petals_chain.protocol.auth import SECRET_HEADER
from petals_chain.protocol.http_client import OrchestratorClient, OrchestratorError
from petals_chain.protocol.requests import HeartbeatBody, RegisterBody
from tests.orchestrator.test_orchestrator import MODEL, PAPER, run

GB = 1e9
ROLES = Credentials(client="c-tok", server="s-tok", operator="o-tok")


@contextlib.asynccontextmanager
async def serving(orch: Orchestrator, credentials: Credentials = ROLES) -> AsyncIterator[str]:
    """The real app with these credentials on a loopback port; yields its base URL."""
    server = LoopbackServer(build_app(orch, credentials=credentials, sweep_interval_s=0.05), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


class TableSwarm:
    """What a DHT would show, as a table: peers that answer, and the span each one announces and serves."""

    def __init__(self) -> None:
        self.present_peers: set[str] = set()
        self.spans: dict[str, tuple[int, int]] = {}
        self.asked: list[tuple[str, str]] = []

    async def present(self, peer_id: str) -> bool:
        self.asked.append(("present", peer_id))
        return peer_id in self.present_peers

    async def announces(self, peer_id: str, start: int, end: int) -> bool:
        span = self.spans.get(peer_id)
        return span is not None and span[0] <= start and end <= span[1]

    async def serves(self, peer_id: str, start: int, end: int) -> bool:
        self.asked.append(("serves", peer_id))
        return await self.announces(peer_id, start, end)


def _reg(name: str, peer: str | None, memory_gb: float = 8.0, tau_p_s: float = 0.1) -> RegisterBody:
    """A registration body."""
    return RegisterBody(name=name, memory_bytes=memory_gb * GB, tau_p_s=tau_p_s, tau_c_s=0.01, peer_id=peer,
                        max_batch_sessions=16)


def _assignments(orch: Orchestrator) -> dict[str, tuple[int, int]]:
    """Each live server's assigned span."""
    return {r.name: (r.assignment.start, r.assignment.end) for r in orch.registry.alive() if r.assignment}


async def _believed_pair(clock: FakeClock) -> tuple[Orchestrator, Trust, TableSwarm]:
    """Servers a and b registered, seen in the 'DHT', serving their spans: their chains are offered."""
    swarm = TableSwarm()
    trust = Trust(swarm, verify_timeout_s=10.0)
    orch = Orchestrator(Registry(MODEL), OrchestratorConfig(heartbeat_timeout_s=None, offer_when_serving=True),
                        composition_policy=PAPER, clock=clock, trust=trust)
    for name in ("a", "b"):
        swarm.present_peers.add(f"P{name}")
        await orch.register(_reg(name, f"P{name}", tau_p_s=0.1 if name == "a" else 0.2))
    assert orch.registry.composition is None  # held out until seen
    await trust.verify_once()
    for name, span in _assignments(orch).items():
        await orch.heartbeat(HeartbeatBody(name=name, serving={"start": span[0], "end": span[1]}))
    assert orch.leases.free_capacity() == 0  # they say they serve; nobody has checked yet
    for name, span in _assignments(orch).items():
        swarm.spans[f"P{name}"] = span
    await trust.verify_once()
    assert orch.leases.free_capacity() > 0
    return orch, trust, swarm


def test_invented_peer_id_never_gets_chains_and_moves_nobody() -> None:
    """A registration under a peer id no one holds stays out of the composition and is buried after the timeout."""

    async def body() -> None:
        clock = FakeClock()
        orch, trust, _ = await _believed_pair(clock)
        before, capacity, version = _assignments(orch), orch.leases.free_capacity(), orch.registry.version
        rec = await orch.register(_reg("ghost", "Pinvented", memory_gb=100.0, tau_p_s=0.01))  # huge and fast
        assert rec.pending and "Pinvented" in rec.to_json()["pending"]
        await trust.verify_once()
        assert "ghost" not in {s.name for s in orch.registry.composition.servers}
        assert {k: v for k, v in _assignments(orch).items() if k != "ghost"} == before
        assert orch.leases.free_capacity() == capacity
        assert all("ghost" not in [s.server for s in c.spans] for c in orch.leases.snapshot().chains)
        clock.now_s += 11.0
        await trust.verify_once()
        ghost = orch.registry.servers["ghost"]
        assert not ghost.alive and "never answered" in ghost.dead_reason
        assert _assignments(orch) == before and orch.leases.free_capacity() == capacity
        assert orch.registry.version >= version

    run(body())


def test_impostor_claiming_a_real_peer_id_is_refused_and_the_real_server_keeps_its_span() -> None:
    """A second name for a believed server's peer id is a 409 before anything changes."""

    async def body() -> None:
        orch, trust, _ = await _believed_pair(FakeClock())
        before, version = _assignments(orch), orch.registry.version
        with pytest.raises(ClaimError, match="belongs to server 'a'"):
            trust.admit(_reg("impostor", "Pa", memory_gb=100.0))
        assert _assignments(orch) == before and orch.registry.version == version

    run(body())


def test_a_span_claimed_but_not_served_is_never_offered_and_its_server_is_buried() -> None:
    """Heartbeats saying 'I serve 0:4' are not enough: the DHT must show it, else the server is marked dead."""

    async def body() -> None:
        clock = FakeClock()
        orch, trust, swarm = await _believed_pair(clock)
        capacity = orch.leases.free_capacity()
        swarm.present_peers.add("Pliar")
        await orch.register(_reg("liar", "Pliar", tau_p_s=0.02))  # the fastest: it gets blocks
        await trust.verify_once()  # believed present: it joins the composition
        span = _assignments(orch)["liar"]
        assert span[1] > span[0]
        await orch.heartbeat(HeartbeatBody(name="liar", serving={"start": span[0], "end": span[1]}))
        await trust.verify_once()
        assert all("liar" not in [s.server for s in c.spans] for c in orch.leases.snapshot().chains)
        clock.now_s += 11.0
        await trust.verify_once()
        assert not orch.registry.servers["liar"].alive
        assert "does not serve them" in orch.registry.servers["liar"].dead_reason
        await _wait(lambda: orch.leases.free_capacity() == capacity)

    run(body())


async def _wait(pred, timeout_s: float = 5.0) -> None:
    """Poll a condition (20 ms) with a safety cap."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.02)


def test_registration_without_peer_id_is_refused_while_verifying() -> None:
    """Nothing to look for in the DHT: a 400 naming the field."""
    trust = Trust(TableSwarm())
    Orchestrator(Registry(MODEL), OrchestratorConfig(heartbeat_timeout_s=None), composition_policy=PAPER, trust=trust)
    with pytest.raises(ValueError, match="peer_id"):
        trust.admit(_reg("x", None))


def test_false_reports_count_against_their_request_alone_and_a_confirmed_one_is_never_refused() -> None:
    """A failure report about a server that answers leaves it alive with its chains and counts against the reporting
    request (its job, kept by each replacement lease): its 4th false one is a 429. Another lease with the same label
    from the same address is not limited (issue 23: a caller could silence another by sharing its label or host), and
    the limited request's report about a server that really is gone is not refused: the server is buried."""

    async def body() -> None:
        orch, trust, swarm = await _believed_pair(FakeClock())
        capacity, version = orch.leases.free_capacity(), orch.registry.version
        async with serving(orch) as url, OrchestratorClient(url, token="c-tok") as oc:
            lease = await oc.lease(timeout_s=5, client="shared")
            for _ in range(3):
                victim = lease.spans[0].server
                new = await oc.report_failure(lease.lease_id, victim, timeout_s=5)
                assert new.replaces == lease.lease_id and orch.registry.servers[victim].alive
                lease = new
            assert orch.registry.version == version and orch.leases.free_capacity() == capacity - 1
            assert trust.false_reports == 3
            with pytest.raises(OrchestratorError) as err:
                await oc.report_failure(lease.lease_id, lease.spans[0].server, timeout_s=5)
            assert err.value.status == 429 and "false failure reports" in err.value.message
            assert orch.leases.has(lease.lease_id)  # refused: nothing changed, it still holds its lease

            for label in ("shared", None):  # the same label, or none (the default client), from the same address
                other = await oc.lease(timeout_s=5, client=label)
                replacement = await oc.report_failure(other.lease_id, other.spans[0].server, timeout_s=5)
                assert replacement.replaces == other.lease_id, label
                await oc.release(replacement.lease_id)

            victim = lease.spans[0].server
            swarm.present_peers.discard(f"P{victim}")  # it really is gone: the limited request's report is believed
            with pytest.raises(OrchestratorError) as err:  # buried; no other chain is serving yet
                await oc.report_failure(lease.lease_id, victim, timeout_s=0.5)
            assert err.value.status == 503, err.value
            assert not orch.registry.servers[victim].alive and "failure reported" in orch.registry.servers[
                victim].dead_reason

    run(body())


def test_limiter_window_slides() -> None:
    """After the window, a limited reporter may report again; bad settings are refused."""
    clock = FakeClock()
    lim = FalseReportLimiter(clock, max_false=2, window_s=10.0)
    lim.record_false("x")
    lim.record_false("x")
    with pytest.raises(RateLimitedError) as err:
        lim.check("x")
    assert 0 < err.value.retry_after_s <= 10.0
    clock.now_s += 10.5
    lim.check("x")
    with pytest.raises(ValueError):
        FalseReportLimiter(clock, max_false=0)


# ---- roles over HTTP ------------------------------------------------------------------------------


async def _call(http: aiohttp.ClientSession, method: str, url: str, token: str | None = None,
                body: dict | None = None, **headers: str) -> tuple[int, dict]:
    """One request with an optional bearer token → (status, JSON reply)."""
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with http.request(method, url, data=json.dumps(body) if body is not None else None,
                            headers={"Content-Type": "application/json", **headers}) as r:
        return r.status, await r.json()


def test_each_role_only_its_routes_and_a_server_speaks_only_for_itself() -> None:
    """Clients lease, servers join, the operator evicts/cordons; heartbeats, leaves and re-registrations need the
    server's own secret; the probe's spoofed heartbeat (serving 0:0 in another's name) is a 403 that changes nothing."""

    async def body() -> None:
        orch = Orchestrator(Registry(MODEL), OrchestratorConfig(heartbeat_timeout_s=None, offer_when_serving=True),
                            composition_policy=PAPER)
        async with serving(orch) as url, aiohttp.ClientSession() as http:
            secrets = {}
            for name, tau in (("a", 0.1), ("b", 0.2)):
                reg = {"name": name, "memory_bytes": 8 * GB, "tau_p_s": tau, "tau_c_s": 0.01, "peer_id": f"P{name}",
                       "max_batch_sessions": 16}
                assert (await _call(http, "POST", url + "/servers/register", "c-tok", reg))[0] == 403
                status, reply = await _call(http, "POST", url + "/servers/register", "s-tok", reg)
                assert status == 200 and len(reply["secret"]) >= 32
                secrets[name] = reply["secret"]
            spans = {r.name: r.assignment for r in orch.registry.alive()}
            for name, a in spans.items():
                beat = {"name": name, "serving": {"start": a.start, "end": a.end}}
                assert (await _call(http, "POST", url + "/servers/heartbeat", secrets[name], beat))[0] == 200
            capacity = orch.leases.free_capacity()
            assert capacity > 0

            spoof = {"name": "a", "serving": {"start": 0, "end": 0}}
            for token in ("s-tok", "c-tok", "o-tok", secrets["b"]):
                status, reply = await _call(http, "POST", url + "/servers/heartbeat", token, spoof)
                assert status == 403 and reply["status"] == 403 and reply["error"], (token, reply)
            assert (await _call(http, "POST", url + "/servers/heartbeat", None, spoof))[0] == 401
            assert (await _call(http, "POST", url + "/servers/heartbeat", "nonsense", spoof))[0] == 401
            assert orch.registry.servers["a"].serving == (spans["a"].start, spans["a"].end)
            assert orch.leases.free_capacity() == capacity

            # an impostor with the server credential cannot take over a live name or make it leave
            grab = {"name": "a", "memory_bytes": 90 * GB, "tau_p_s": 0.01, "tau_c_s": 0.01, "peer_id": "Px",
                    "max_batch_sessions": 16}
            status, reply = await _call(http, "POST", url + "/servers/register", "s-tok", grab)
            assert status == 403 and "only it may register again" in reply["error"]
            for token in ("s-tok", "c-tok", "o-tok", secrets["b"]):
                assert (await _call(http, "POST", url + "/servers/a/leave", token, {}))[0] == 403
            assert orch.registry.servers["a"].memory_bytes == 8 * GB and orch.registry.servers["a"].alive
            # the real one may re-register with its secret, and keeps it
            again = {"name": "a", "memory_bytes": 8 * GB, "tau_p_s": 0.1, "tau_c_s": 0.01, "peer_id": "Pa",
                     "max_batch_sessions": 16}
            status, reply = await _call(http, "POST", url + "/servers/register", "s-tok", again,
                                        **{SECRET_HEADER: secrets["a"]})
            assert status == 200 and reply["secret"] == secrets["a"]
            beat = {"name": "a", "serving": {"start": spans["a"].start, "end": spans["a"].end}}
            assert (await _call(http, "POST", url + "/servers/heartbeat", secrets["a"], beat))[0] == 200
            assert orch.leases.free_capacity() == capacity

            # clients lease; servers and the operator do not; evict/cordon are the operator's alone
            assert (await _call(http, "POST", url + "/lease", "s-tok", {"timeout_s": 1}))[0] == 403
            for token in ("c-tok", "s-tok", secrets["a"]):
                assert (await _call(http, "POST", url + "/servers/b/evict", token, {}))[0] == 403
                assert (await _call(http, "POST", url + "/servers/b/cordon", token, {}))[0] == 403
                assert (await _call(http, "POST", url + "/servers/b/drain", token, {}))[0] == 403  # a's secret: not b
                assert (await _call(http, "GET", url + "/metrics", token))[0] == 403
            assert (await _call(http, "GET", url + "/metrics", None))[0] == 401
            async with http.get(url + "/metrics", headers={"Authorization": "Bearer o-tok"}) as r:
                assert r.status == 200 and "petals_chain_queue_length" in await r.text()

            status, reply = await _call(http, "POST", url + "/servers/a/cordon", "o-tok", {"reason": "maintenance"})
            assert status == 200 and reply["cordoned"] is True
            assert all("a" not in [s.server for s in c.spans] for c in orch.leases.snapshot().chains)
            assert orch.registry.servers["a"].alive and orch.registry.servers["a"].assignment.num_blocks > 0
            assert (await _call(http, "POST", url + "/servers/a/cordon", "o-tok", {"resume": True}))[0] == 200
            assert orch.leases.free_capacity() == capacity

            status, reply = await _call(http, "POST", url + "/servers/b/evict", "o-tok", {"reason": "misbehaves"})
            assert status == 200 and reply["evicted"] is True and not orch.registry.servers["b"].alive
            back = {"name": "b", "memory_bytes": 8 * GB, "tau_p_s": 0.2, "tau_c_s": 0.01, "peer_id": "Pb",
                    "max_batch_sessions": 16}
            status, reply = await _call(http, "POST", url + "/servers/register", "s-tok", back)
            assert status == 403 and "evicted" in reply["error"]
            beat = {"name": "b"}
            assert (await _call(http, "POST", url + "/servers/heartbeat", secrets["b"], beat))[0] == 401  # revoked
            assert (await _call(http, "POST", url + "/servers/b/evict", "o-tok", {"resume": True}))[0] == 200
            assert (await _call(http, "POST", url + "/servers/register", "s-tok", back))[0] == 200

    run(body())


def test_metrics_can_be_left_open_and_the_shared_token_grants_every_role() -> None:
    """--metrics-open: /metrics for anyone; --token: one secret for client, server and operator."""

    async def body() -> None:
        orch = Orchestrator(Registry(MODEL), OrchestratorConfig(heartbeat_timeout_s=None), composition_policy=PAPER)
        creds = Credentials(client="c", operator="o", server="s", metrics_open=True)
        async with serving(orch, creds) as url, aiohttp.ClientSession() as http:
            async with http.get(url + "/metrics") as r:
                assert r.status == 200
            assert (await _call(http, "GET", url + "/chains"))[0] == 401
        shared = Credentials.shared("t")
        assert shared.roles_of("t") == set(Role)
        async with serving(orch, shared) as url, OrchestratorClient(url, token="t") as oc:
            await oc.register("a", memory_bytes=8 * GB, tau_p_s=0.1, tau_c_s=0.01, peer_id="Pa")
            await oc.heartbeat("a", serving=(0, 4))  # with the secret the client kept from the registration
            lease = await oc.lease(timeout_s=5)
            await oc.release(lease.lease_id)
            await oc.cordon("a")
            await oc.evict("a")
            assert not orch.registry.servers["a"].alive

    run(body())


def test_a_server_drains_itself_with_its_own_secret_under_role_credentials() -> None:
    """What a server does on SIGTERM/SIGINT: its client holds the server token only, and the drain goes out with the
    server's secret (with the server token it was a 403, so no server could drain itself under role credentials)."""

    async def body() -> None:
        orch = Orchestrator(Registry(MODEL), OrchestratorConfig(heartbeat_timeout_s=None, offer_when_serving=True),
                            composition_policy=PAPER)
        async with serving(orch) as url, OrchestratorClient(url, token="s-tok") as oc:
            await oc.register("a", memory_bytes=8 * GB, tau_p_s=0.1, tau_c_s=0.01, peer_id="Pa")
            status = await oc.drain("a", wait_s=5, timeout_s=5)
            assert status["server"] == "a" and status["left"], status
            assert not orch.registry.servers["a"].alive
        async with serving(orch) as url, OrchestratorClient(url, token="s-tok") as stranger:
            with pytest.raises(OrchestratorError) as err:  # the server token alone drains nobody
                await stranger.drain("a")
            assert err.value.status == 403

    run(body())


def test_credentials_resolve_from_options_then_role_variables_then_the_shared_token() -> None:
    """A role's own option wins, then its own variable, then --token / $PETALS_CHAIN_ORCH_TOKEN."""
    env = {"PETALS_CHAIN_ORCH_TOKEN": "shared", "PETALS_CHAIN_SERVER_TOKEN": "srv"}
    c = Credentials.resolve(None, operator="op", env=env)
    assert (c.client, c.server, c.operator) == ("shared", "srv", "op")
    assert not Credentials.resolve(None, env={}).enabled
    assert Credentials.resolve("", env={"PETALS_CHAIN_CLIENT_TOKEN": ""}).client is None


def test_a_planned_server_keeps_its_place_in_the_plan_while_it_proves_itself() -> None:
    """A server named in the cluster file is composed before it registers; registering does not pull it out of the
    plan (others are not reassigned), but its chains wait until it is seen serving them."""
    from petals_chain.model import ServerSpec

    async def body() -> None:
        swarm = TableSwarm()
        trust = Trust(swarm)
        orch = Orchestrator(Registry(MODEL), OrchestratorConfig(heartbeat_timeout_s=None, offer_when_serving=True),
                            composition_policy=PAPER, trust=trust)
        orch.registry.add_planned([ServerSpec("p", 8 * GB, 0.01, 0.1)])
        orch.recompose_now()
        planned = _assignments(orch)
        rec = await orch.register(_reg("p", "Pp"))
        assert not rec.pending and _assignments(orch) == planned
        span = planned["p"]
        await orch.heartbeat(HeartbeatBody(name="p", serving={"start": span[0], "end": span[1]}))
        assert orch.leases.free_capacity() == 0
        swarm.present_peers.add("Pp")
        swarm.spans["Pp"] = span
        await trust.verify_once()
        assert orch.leases.free_capacity() > 0

    run(body())
