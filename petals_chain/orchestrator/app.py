"""The orchestrator: registry + composition + JFFC leases, and the small HTTP/JSON API over them.

``Orchestrator`` ties the pieces together (a registration or a failure leads to a
recomposition, whose chains the lease manager then offers); ``build_app`` exposes
it over aiohttp. Bad input is answered with a JSON error naming the field and
never changes state, so a running swarm is unaffected by a misbehaving caller.

Routes (JSON unless noted; with a token, all but /health need ``Authorization: Bearer T``):
GET /health · GET /metrics (Prometheus text) · GET /chains · GET /queue · GET /servers ·
POST /servers/register {name, memory_bytes, tau_p_s, tau_c_s, peer_id?, address?} ·
POST /servers/heartbeat {name, serving?: [start, end], tau_p_s?, tau_c_s?} · GET /servers/{name}/assignment ·
POST /servers/{name}/leave {reason?} ·
POST /lease {timeout_s?, ttl_s?, client?} (long-polls; 503 on timeout) · POST /lease/{id}/renew {ttl_s?} ·
POST /lease/{id}/release · POST /lease/{id}/report-failure {server, timeout_s?, ttl_s?} (a replacement lease).
Errors: 400 malformed/invalid field, 401 token, 404 unknown lease/server, 409 block claim not given,
410 heartbeat from a server marked dead, 503 no chain within timeout_s or queue full.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import signal
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from petals_chain import defaults
from petals_chain.model import Composition, ServerSpec, SpecError
from petals_chain.orchestrator.leases import (
    Lease,
    LeaseManager,
    LeaseTimeoutError,
    QueueFullError,
    TimeHistogram,
    UnknownLeaseError,
)
from petals_chain.orchestrator.registry import (
    ChainInfo,
    ClaimError,
    Registry,
    ServerDeadError,
    ServerRecord,
    UnknownServerError,
    chain_infos,
    check_name,
)

log = logging.getLogger("petals_chain.orchestrator")

DEFAULT_WAIT_S = defaults.LEASE_WAIT_S
MAX_WAIT_S = 24 * 3600.0
MAX_TTL_S = 24 * 3600.0


class BadRequestError(ValueError):
    """The request body or a field in it is malformed; the message says which and why."""


class Orchestrator:
    """Registry, composition and leases kept consistent; every method is called on the event loop."""

    def __init__(
        self,
        registry: Registry,
        *,
        lease_ttl_s: float = defaults.LEASE_TTL_S,
        heartbeat_timeout_s: float | None = defaults.HEARTBEAT_TIMEOUT_S,
        max_waiting: int = defaults.MAX_WAITING,
        clock: Callable[[], float] = time.monotonic,
        pinned: Mapping[str, ServerSpec] | None = None,
        offer_when_serving: bool = False,
    ) -> None:
        self.registry = registry
        # Servers named here keep these τp/τc whatever they report (a profile the operator trusts more than a
        # server's own measurement, e.g. one fitted offline or taken behind emulated WAN delays).
        self.pinned: dict[str, ServerSpec] = dict(pinned or {})
        # Offer a chain only once every server on it reports (by heartbeat) that it serves its span: a lease is
        # never granted on a server still loading its blocks, or one planned from a cluster file but not up yet.
        self.offer_when_serving = offer_when_serving
        self._composed: list[ChainInfo] = []  # every chain of the current composition
        self._offered: tuple[tuple[tuple[str, int, int], ...], ...] | None = None  # keys offered now
        self.leases = LeaseManager(default_ttl_s=lease_ttl_s, max_waiting=max_waiting, clock=clock)
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.clock = clock
        self.started_s = clock()
        self.recompositions = 0
        self.http_errors: dict[int, int] = {}
        self._lock = asyncio.Lock()
        self._applied_generation = -1
        self.dht_info: dict[str, Any] | None = None  # {"initial_peers": [...], "dht_prefix": ...} when it runs a DHT

    # ---- composition ----------------------------------------------------------------------------

    def install(self, composition: Composition | None, error: str | None = None) -> int:
        """Make ``composition`` current (registry assignments + offered chains); return its version."""
        version = self.registry.apply(composition, error)
        self._composed = chain_infos(composition, version) if composition is not None else []
        self._offer(force=True)
        hook = getattr(self.leases, "set_composition", None)  # a lease manager that routes over the placement
        if hook is not None:
            hook(composition, version)
        self.recompositions += 1
        return version

    def recompose_now(self) -> int:
        """Recompose synchronously (startup, tests): compute for the live servers and install."""
        gen, specs = self.registry.snapshot()
        comp, err = self.registry.try_compute(specs)
        self._applied_generation = gen
        return self.install(comp, err)

    async def recompose(self) -> None:
        """Recompose off the event loop until the composition reflects the latest registry state.

        Concurrent callers share the work; a result computed from a registry that changed
        meanwhile is thrown away and recomputed, so a dead server is never put back.
        """
        async with self._lock:
            loop = asyncio.get_running_loop()
            while self._applied_generation < self.registry.generation:
                gen, specs = self.registry.snapshot()
                comp, err = await loop.run_in_executor(None, self.registry.try_compute, specs)
                if self.registry.generation != gen:
                    continue
                self._applied_generation = gen
                self.install(comp, err)

    def _ready(self, chain: ChainInfo) -> bool:
        """Every server of the chain is alive (and, with offer_when_serving, serves its span there)."""
        for span in chain.spans:
            rec = self.registry.servers.get(span.server)
            if rec is None or not rec.alive:
                return False
            if self.offer_when_serving and not (
                rec.serving is not None and rec.serving[0] <= span.start and span.end <= rec.serving[1]
            ):
                return False
        return True

    def _offer(self, *, force: bool = False) -> None:
        """Offer the composed chains that are ready now; leases on a withdrawn chain keep their slot accounting
        and take it up again when the chain comes back (the lease manager matches chains by servers and spans)."""
        ready = [c for c in self._composed if self._ready(c)]
        keys = tuple(c.key for c in ready)
        if force or keys != self._offered:
            self._offered = keys
            self.leases.set_chains(ready or None, self.registry.version)

    # ---- servers --------------------------------------------------------------------------------

    async def register(self, body: dict[str, Any]) -> ServerRecord:
        """Register or refresh a server; recompose if the live set or its figures changed."""
        spec = self.pinned.get(body.get("name"))  # type: ignore[arg-type]
        tau_p, tau_c, memory = body.get("tau_p_s"), body.get("tau_c_s"), body.get("memory_bytes")
        if spec is not None:
            tau_p, tau_c = spec.tau_p_s, spec.tau_c_s
            if isinstance(memory, (int, float)) and math.isclose(memory, spec.memory_bytes, rel_tol=1e-6):
                memory = spec.memory_bytes  # the same budget, rounded on the way: keep the plan's exact figure
        rec, changed = self.registry.register(
            body.get("name"),
            memory,
            tau_p,
            tau_c,
            now_s=self.clock(),
            peer_id=body.get("peer_id"),
            address=body.get("address"),
        )
        if changed:
            await self.recompose()
        else:
            self._offer()  # a (re)starting server serves nothing yet: its chains wait for its heartbeat
        return rec

    async def heartbeat(self, body: dict[str, Any]) -> ServerRecord:
        """A server is alive and serves ``serving``; recompose if its measured times moved a lot (unless pinned)."""
        rec, changed = self.registry.heartbeat(
            body.get("name"),
            now_s=self.clock(),
            serving=body.get("serving"),
            tau_p_s=body.get("tau_p_s"),
            tau_c_s=body.get("tau_c_s"),
            keep_times=body.get("name") in self.pinned,  # its own figures are checked, the pinned ones kept
        )
        if changed:
            await self.recompose()
        else:
            self._offer()  # it may have finished (or started) loading its span
        return rec

    async def server_failed(self, name: str, reason: str) -> None:
        """Mark a server dead, stop offering its chains, and recompose without it."""
        if self.registry.mark_dead(name, reason):
            self._offer()  # stop offering its chains at once, before the recomposition lands
            await self.recompose()

    # ---- leases ---------------------------------------------------------------------------------

    async def report_failure(
        self, lease_id: str, server: str, *, timeout_s: float, ttl_s: float | None = None
    ) -> Lease:
        """A client's chain broke at ``server``: mark it dead, recompose, and lease a replacement chain; the
        request keeps its place in line (ahead of every request that arrived after it)."""
        lease = self.leases.get(lease_id)
        if server not in {s.server for s in lease.chain.spans}:
            on_chain = [s.server for s in lease.chain.spans]
            raise BadRequestError(f"field 'server' = {server!r} is not on lease {lease_id!r}'s chain {on_chain}")
        await self.server_failed(server, f"failure reported by lease {lease_id}")
        if self.leases.has(lease_id):  # it may have expired while we recomposed
            self.leases.release(lease_id, failed=True)
        return await self.leases.acquire(timeout_s=timeout_s, ttl_s=ttl_s or lease.ttl_s, client=lease.client,
                                         replaces=lease_id, resume_job=lease.job)  # keeps its place in line

    def lease_json(self, lease: Lease) -> dict[str, Any]:
        """A lease as the API returns it: ids, version, timing and spans with peer ids."""
        out = self.leases.describe(lease)
        out["spans"] = [
            {
                "server": s.server,
                "peer_id": self.registry.peer_id(s.server),
                "address": (self.registry.servers[s.server].address if s.server in self.registry.servers else None),
                "start": s.start,
                "end": s.end,
            }
            for s in lease.chain.spans
        ]
        return out

    # ---- housekeeping ---------------------------------------------------------------------------

    async def sweep(self) -> None:
        """Expire leases nobody renews and servers nobody hears from."""
        self.leases.expire_due()
        if self.heartbeat_timeout_s is not None:
            gone = self.registry.expire(self.clock(), self.heartbeat_timeout_s)
            if gone:
                log.warning("servers without heartbeat marked dead: %s", gone)
                self._offer()  # stop offering their chains at once, before the recomposition lands
                await self.recompose()

    async def run_sweeper(self, interval_s: float = defaults.SWEEP_INTERVAL_S) -> None:
        """Call sweep() every interval_s (or sooner, when a lease is due) until cancelled."""
        while True:
            wait = min(interval_s, max(0.01, self.leases.next_expiry_in_s()))
            await asyncio.sleep(wait)
            try:
                await self.sweep()
            except Exception:  # the sweeper must survive anything and keep freeing capacity
                log.exception("sweep failed")

    def health(self) -> dict[str, Any]:
        """Liveness plus a one-glance summary of the composition and the load."""
        snap = self.leases.snapshot()
        return {
            "status": "ok",
            "version": self.registry.version,
            "composition": self.registry.composition is not None,
            "composition_error": self.registry.error,
            "c": self.registry.composition.c if self.registry.composition is not None else None,
            "servers_registered": len(self.registry.servers),
            "servers_alive": len(self.registry.alive()),
            "chains": len(snap.capacities),
            "chains_composed": len(self._composed),  # more than "chains" while some servers still load
            "capacity": sum(snap.capacities),
            "free": self.leases.free_capacity(),
            "queue_length": snap.queue_length,
            "active_leases": snap.active,
            "orphaned_leases": snap.orphaned,
            "uptime_s": self.clock() - self.started_s,
            "model": {
                "name": self.registry.model.name,
                "num_blocks": self.registry.model.num_blocks,
                "block_bytes": self.registry.model.block_bytes,
                "cache_bytes": self.registry.model.cache_bytes,
            },
            "dht": self.dht_info,
        }


# ---- Prometheus text ----------------------------------------------------------------------------


def _histogram_lines(name: str, help_text: str, hist: TimeHistogram) -> list[str]:
    """One histogram in the Prometheus text exposition format."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
    lines += [f'{name}_bucket{{le="{le}"}} {n}' for le, n in hist.cumulative()]
    lines += [f"{name}_sum {hist.sum_s:.6f}", f"{name}_count {hist.count}"]
    return lines


def render_metrics(orch: Orchestrator) -> str:
    """All gauges, counters and histograms of the orchestrator as Prometheus text."""
    snap = orch.leases.snapshot()
    p = "petals_chain"
    gauges = [
        ("queue_length", "Requests waiting in the central FIFO queue.", snap.queue_length),
        ("active_leases", "Leases currently held.", snap.active),
        ("orphaned_leases", "Held leases whose chain left the composition (their slots are not re-offered).",
         snap.orphaned),
        ("capacity_total", "Sum of chain capacities c_k offered now.", sum(snap.capacities)),
        ("capacity_free", "Free slots across offered chains.", orch.leases.free_capacity()),
        ("chains", "Chains offered now.", len(snap.capacities)),
        ("composition_version", "Version of the current composition.", orch.registry.version),
        ("servers_alive", "Servers alive in the registry.", len(orch.registry.alive())),
    ]
    lines: list[str] = []
    for name, help_text, value in gauges:
        lines += [f"# HELP {p}_{name} {help_text}", f"# TYPE {p}_{name} gauge", f"{p}_{name} {value}"]
    lines += [f"# HELP {p}_chain_occupancy Leases in service on each chain.", f"# TYPE {p}_chain_occupancy gauge"]
    lines += [f'{p}_chain_occupancy{{chain="{c.chain_id}"}} {z}' for c, z in zip(snap.chains, snap.occupancy)]
    lines += [f"# HELP {p}_chain_capacity Capacity c_k of each chain.", f"# TYPE {p}_chain_capacity gauge"]
    lines += [f'{p}_chain_capacity{{chain="{c.chain_id}"}} {c.capacity}' for c in snap.chains]
    cnt = orch.leases.counters
    counters = [
        ("lease_requests_total", "Lease requests received.", cnt.requested),
        ("leases_granted_total", "Leases granted.", cnt.granted),
        ("leases_released_total", "Leases released by their client.", cnt.released),
        ("leases_expired_total", "Leases expired because their client stopped renewing.", cnt.expired),
        ("leases_failed_total", "Leases ended by a reported server failure.", cnt.failed),
        ("leases_abandoned_total", "Leases granted to a client that had already gone (handed back).", cnt.abandoned),
        ("lease_waits_cancelled_total", "Waiting requests whose client disconnected.", cnt.cancelled),
        ("lease_waits_timed_out_total", "Waiting requests that hit their timeout.", cnt.timed_out),
        ("recompositions_total", "Compositions installed.", orch.recompositions),
    ]
    for name, help_text, value in counters:
        lines += [f"# HELP {p}_{name} {help_text}", f"# TYPE {p}_{name} counter", f"{p}_{name} {value}"]
    lines += [f"# HELP {p}_http_errors_total HTTP error responses by status.", f"# TYPE {p}_http_errors_total counter"]
    lines += [f'{p}_http_errors_total{{status="{s}"}} {n}' for s, n in sorted(orch.http_errors.items())]
    lines += _histogram_lines(f"{p}_wait_seconds", "Time a lease request waited for a chain.", orch.leases.wait_hist)
    lines += _histogram_lines(
        f"{p}_service_seconds", "Time a lease was held (granted to release or expiry).", orch.leases.service_hist
    )
    return "\n".join(lines) + "\n"


# ---- request parsing ----------------------------------------------------------------------------


async def read_body(request: web.Request, allowed: set[str], *, required: bool = True) -> dict[str, Any]:
    """The JSON object in the request body; 400 on malformed JSON, a non-object or unknown fields."""
    raw = await request.read()
    if not raw.strip():
        if required:
            raise BadRequestError("request body must be a JSON object")
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequestError(f"malformed JSON in request body: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequestError(f"request body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequestError(f"unknown field(s) {unknown}; allowed: {sorted(allowed)}")
    return body


def seconds_field(body: dict[str, Any], name: str, default: float | None, high: float) -> float | None:
    """An optional duration in seconds: finite, > 0, at most ``high``."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BadRequestError(f"field '{name}' must be a number of seconds, got {value!r}")
    if not 0 < value <= high:
        raise BadRequestError(f"field '{name}' must be in (0, {high:g}] seconds, got {value!r}")
    return float(value)


def client_field(body: dict[str, Any]) -> str | None:
    """An optional free-text client label (at most 200 characters)."""
    value = body.get("client")
    if value is not None and (not isinstance(value, str) or len(value) > 200):
        raise BadRequestError("field 'client' must be a string of at most 200 characters")
    return value


# ---- the aiohttp application --------------------------------------------------------------------

ORCH_KEY = web.AppKey("orchestrator", Orchestrator)
SWEEPER_KEY = web.AppKey("sweeper", asyncio.Task)
_STATUS_FOR: tuple[tuple[type[BaseException], int], ...] = (
    (BadRequestError, 400),
    (UnknownLeaseError, 404),
    (UnknownServerError, 404),
    (ClaimError, 409),
    (ServerDeadError, 410),
    (SpecError, 400),  # RegistryError is a SpecError
    (LeaseTimeoutError, 503),
    (QueueFullError, 503),
)


def _json(data: Any, status: int = 200) -> web.Response:
    """A JSON response."""
    return web.json_response(data, status=status)


def _error_middleware(orch: Orchestrator) -> Callable:
    """Turn known exceptions and aiohttp's own errors into JSON ``{"error": ..., "status": ...}``."""

    @web.middleware
    async def middleware(request: web.Request, handler: Callable) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            status, message = exc.status, exc.reason
        except Exception as exc:  # mapped below; unknown ones are a 500 with the message
            for cls, code in _STATUS_FOR:
                if isinstance(exc, cls):
                    status, message = code, str(exc)
                    break
            else:
                log.exception("unhandled error on %s %s", request.method, request.path)
                status, message = 500, f"internal error: {type(exc).__name__}: {exc}"
        orch.http_errors[status] = orch.http_errors.get(status, 0) + 1
        resp = _json({"error": message, "status": status}, status)
        if status == 401:
            resp.headers["WWW-Authenticate"] = "Bearer"
        return resp

    return middleware


def _auth_middleware(token: str | None) -> Callable:
    """Require ``Authorization: Bearer <token>`` on every route but /health when a token is set."""

    @web.middleware
    async def middleware(request: web.Request, handler: Callable) -> web.StreamResponse:
        if token is not None and request.path != "/health":
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                raise web.HTTPUnauthorized(reason="missing or wrong bearer token")
        return await handler(request)

    return middleware


def _server_reply(orch: Orchestrator, rec: ServerRecord) -> dict[str, Any]:
    """What register, heartbeat and assignment answer: the record, its assignment, the version."""
    return {
        "server": rec.to_json(),
        "assignment": rec.assignment.to_json() if rec.assignment else None,
        "version": orch.registry.version,
    }


async def _health(request: web.Request) -> web.Response:
    """GET /health: liveness and a summary."""
    return _json(request.app[ORCH_KEY].health())


async def _metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text."""
    text = render_metrics(request.app[ORCH_KEY])
    return web.Response(body=text.encode(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def _chains(request: web.Request) -> web.Response:
    """GET /chains: offered chains with spans, capacity and occupancy."""
    orch = request.app[ORCH_KEY]
    snap = orch.leases.snapshot()
    chains = [
        {
            "chain_id": c.chain_id,
            "spans": [{"server": s.server, "start": s.start, "end": s.end} for s in c.spans],
            "capacity": c.capacity,
            "busy": z,
            "service_time_s": c.service_time_s,
        }
        for c, z in zip(snap.chains, snap.occupancy)
    ]
    return _json({"version": snap.version, "chains": chains, "orphaned_leases": snap.orphaned})


async def _queue(request: web.Request) -> web.Response:
    """GET /queue: length and the first 100 waiting requests."""
    orch = request.app[ORCH_KEY]
    waiting = orch.leases.queued()
    head = [{"job": j, "waited_s": w, "client": c} for j, w, c in waiting[:100]]
    return _json({"length": orch.leases.queue_length(), "head": head})


async def _servers(request: web.Request) -> web.Response:
    """GET /servers: every registry record."""
    orch = request.app[ORCH_KEY]
    return _json({"version": orch.registry.version, "servers": [r.to_json() for r in orch.registry.servers.values()]})


async def _register(request: web.Request) -> web.Response:
    """POST /servers/register: add or refresh a server; answers with its assignment."""
    orch = request.app[ORCH_KEY]
    body = await read_body(request, {"name", "memory_bytes", "tau_p_s", "tau_c_s", "peer_id", "address"})
    missing = [k for k in ("name", "memory_bytes", "tau_p_s", "tau_c_s") if k not in body]
    if missing:
        raise BadRequestError(f"missing field(s) {missing}")
    rec = await orch.register(body)
    return _json(_server_reply(orch, rec))


async def _heartbeat(request: web.Request) -> web.Response:
    """POST /servers/heartbeat: liveness, served span, fresh measurements."""
    orch = request.app[ORCH_KEY]
    body = await read_body(request, {"name", "serving", "tau_p_s", "tau_c_s"})
    if "name" not in body:
        raise BadRequestError("missing field(s) ['name']")
    rec = await orch.heartbeat(body)
    return _json(_server_reply(orch, rec))


async def _assignment(request: web.Request) -> web.Response:
    """GET /servers/{name}/assignment: the blocks the server must hold."""
    orch = request.app[ORCH_KEY]
    rec = orch.registry.get(check_name(request.match_info["name"]))
    return _json(_server_reply(orch, rec))


async def _leave(request: web.Request) -> web.Response:
    """POST /servers/{name}/leave: a server shuts down or gives up; its chains stop being offered at once."""
    orch = request.app[ORCH_KEY]
    body = await read_body(request, {"reason"}, required=False)
    reason = body.get("reason", "left")
    if not isinstance(reason, str) or len(reason) > 200:
        raise BadRequestError("field 'reason' must be a string of at most 200 characters")
    rec = orch.registry.get(check_name(request.match_info["name"]))
    await orch.server_failed(rec.name, f"left: {reason}")
    return _json(_server_reply(orch, rec))


async def _lease(request: web.Request) -> web.Response:
    """POST /lease: long-poll until JFFC grants a chain."""
    orch = request.app[ORCH_KEY]
    body = await read_body(request, {"timeout_s", "ttl_s", "client"}, required=False)
    timeout_s = seconds_field(body, "timeout_s", DEFAULT_WAIT_S, MAX_WAIT_S)
    ttl_s = seconds_field(body, "ttl_s", None, MAX_TTL_S)
    lease = await orch.leases.acquire(timeout_s=timeout_s, ttl_s=ttl_s, client=client_field(body))
    return _json(orch.lease_json(lease))


async def _renew(request: web.Request) -> web.Response:
    """POST /lease/{id}/renew: extend the TTL."""
    orch = request.app[ORCH_KEY]
    body = await read_body(request, {"ttl_s"}, required=False)
    lease = orch.leases.renew(request.match_info["lease_id"], seconds_field(body, "ttl_s", None, MAX_TTL_S))
    return _json(orch.lease_json(lease))


async def _release(request: web.Request) -> web.Response:
    """POST /lease/{id}/release: give the slot back."""
    orch = request.app[ORCH_KEY]
    await read_body(request, set(), required=False)
    lease = orch.leases.release(request.match_info["lease_id"])
    held = orch.clock() - lease.granted_s
    return _json({"lease_id": lease.lease_id, "released": True, "held_s": held})


async def _report_failure(request: web.Request) -> web.Response:
    """POST /lease/{id}/report-failure: a server broke; answers with a replacement lease."""
    orch = request.app[ORCH_KEY]
    body = await read_body(request, {"server", "timeout_s", "ttl_s"})
    server = body.get("server")
    if not isinstance(server, str):
        raise BadRequestError(f"field 'server' must be the name of a server on the lease's chain, got {server!r}")
    timeout_s = seconds_field(body, "timeout_s", DEFAULT_WAIT_S, MAX_WAIT_S)
    ttl_s = seconds_field(body, "ttl_s", None, MAX_TTL_S)
    lease = await orch.report_failure(request.match_info["lease_id"], server, timeout_s=timeout_s, ttl_s=ttl_s)
    return _json(orch.lease_json(lease))


def build_app(orch: Orchestrator, *, token: str | None = None,
              sweep_interval_s: float = defaults.SWEEP_INTERVAL_S) -> web.Application:
    """The aiohttp application: routes, JSON errors, optional bearer token, background sweeper."""
    app = web.Application(middlewares=[_error_middleware(orch), _auth_middleware(token)])
    app[ORCH_KEY] = orch
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/chains", _chains)
    app.router.add_get("/queue", _queue)
    app.router.add_get("/servers", _servers)
    app.router.add_post("/servers/register", _register)
    app.router.add_post("/servers/heartbeat", _heartbeat)
    app.router.add_get("/servers/{name}/assignment", _assignment)
    app.router.add_post("/servers/{name}/leave", _leave)
    app.router.add_post("/lease", _lease)
    app.router.add_post("/lease/{lease_id}/renew", _renew)
    app.router.add_post("/lease/{lease_id}/release", _release)
    app.router.add_post("/lease/{lease_id}/report-failure", _report_failure)

    async def start_sweeper(app: web.Application) -> None:
        """Start expiring leases and silent servers."""
        app[SWEEPER_KEY] = asyncio.create_task(orch.run_sweeper(sweep_interval_s))

    async def stop_sweeper(app: web.Application) -> None:
        """Stop the sweeper and wake the waiters."""
        app[SWEEPER_KEY].cancel()
        orch.leases.fail_waiters()

    app.on_startup.append(start_sweeper)
    app.on_shutdown.append(stop_sweeper)
    return app


async def serve(
    app: web.Application,
    host: str,
    port: int,
    on_ready: Callable[[str, int], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Run the app on host:port (port 0 picks one) until SIGINT/SIGTERM or ``stop`` is set."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    addr = runner.addresses[0]
    if on_ready is not None:
        on_ready(addr[0], addr[1])
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
