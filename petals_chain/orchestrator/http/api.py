"""The orchestrator's HTTP/JSON API over aiohttp: routes, JSON errors, the bearer token, the sweeper, serve().

:func:`build_app` exposes an :class:`~petals_chain.orchestrator.engine.core.Orchestrator`. Request bodies are the
pydantic
models of :mod:`petals_chain.protocol.requests`; bad input is answered with a JSON error naming the field
(``{"error": ..., "status": 400, "fields": [...]}``) and never changes state, so a running swarm is unaffected by a
misbehaving caller. /metrics is rendered by prometheus_client from the orchestrator's own registry
(:mod:`petals_chain.orchestrator.engine.metrics`), as OpenMetrics when the scraper asks for it.

Routes (JSON unless noted; who may call each: :data:`petals_chain.orchestrator.trust.auth.POLICY`, docs/trust.md,
"Roles"):
GET /health (liveness: 200 while the process answers) · GET /ready (readiness: 200 once at least one chain is offered,
503 until then, for a load balancer or Kubernetes) · GET /metrics (Prometheus text) · GET /chains · GET /queue ·
GET /servers · GET /dashboard (the live page, HTML; open: it holds no data) · GET /dashboard.json (what it draws) ·
GET /swarm (what a client needs to join: the DHT's initial peers and prefix, the model) ·
POST /servers/register {name, memory_bytes, tau_p_s, tau_c_s, peer_id?, address?} (answers the server's ``secret``) ·
POST /servers/heartbeat {name, serving?: {start, end}, tau_p_s?, tau_c_s?} · GET /servers/{name}/assignment ·
POST /servers/{name}/leave {reason?} · POST /servers/{name}/evict {reason?, resume?} ·
POST /servers/{name}/cordon {reason?, resume?} (no new leases through it) ·
POST /servers/{name}/drain {wait_s?, timeout_s?} (move its sessions off, then it leaves) · GET /servers/{name}/drain ·
POST /lease {timeout_s?, ttl_s?, client?, request_id?} (long-polls; 503 on timeout; a retry with the same
request_id gets the lease already granted to it or its old place in line) · POST /lease/{id}/renew {ttl_s?} ·
POST /lease/{id}/release · POST /lease/{id}/report-failure {server, timeout_s?, ttl_s?} (a replacement lease) ·
POST /lease/{id}/migrated · POST /lease/{id}/migration-failed · GET|POST /migrations {policy} (docs/migration.md) ·
GET /policies (the registry of live lease policies and those in use).
Errors: 400 malformed/invalid field, 401 missing or unknown token, 403 not this caller's to do, 404 unknown
lease/server, 409 block claim not given or peer id held by another server, 410 heartbeat from a server marked dead,
413 body too large, 429 too many false failure reports, 503 no chain within timeout_s or queue full.
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import ssl
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from petals_chain import defaults
from petals_chain.model import SpecError
from petals_chain.orchestrator.http import dashboard
from petals_chain.orchestrator.trust.auth import (
    OPEN_ROUTES,
    Caller,
    Credentials,
    ForbiddenError,
    Guard,
    UnauthorizedError,
)
from petals_chain.orchestrator.engine.core import Orchestrator
from petals_chain.orchestrator.leasing.leases import LeaseTimeoutError, QueueFullError, UnknownLeaseError
from petals_chain.orchestrator.state.registry import (
    ClaimError,
    ServerDeadError,
    ServerRecord,
    UnknownServerError,
    check_name,
)
from petals_chain.orchestrator.http.request_body import read_body
from petals_chain.orchestrator.trust.suspects import RateLimitedError
from petals_chain.protocol import json_codec
from petals_chain.protocol.auth import SECRET_HEADER
from petals_chain.protocol.limits import MAX_BODY_BYTES
from petals_chain.protocol.parsing import BadRequestError
from petals_chain.protocol.requests import (
    CordonBody,
    DrainBody,
    HeartbeatBody,
    LeaseBody,
    LeaveBody,
    MigratedBody,
    MigrationFailedBody,
    MigrationPolicyBody,
    RegisterBody,
    ReleaseBody,
    RenewBody,
    ReportFailureBody,
    WidthBody,
)

log = logging.getLogger(__name__)

ORCH_KEY = web.AppKey("orchestrator", Orchestrator)
SWEEPER_KEY = web.AppKey("sweeper", asyncio.Task)
VERIFIER_KEY = web.AppKey("verifier", asyncio.Task)
GUARD_KEY = web.AppKey("guard", Guard)
_STATUS_FOR: tuple[tuple[type[BaseException], int], ...] = (
    (BadRequestError, 400),
    (UnknownLeaseError, 404),
    (UnknownServerError, 404),
    (ClaimError, 409),
    (ServerDeadError, 410),
    (SpecError, 400),  # RegistryError is a SpecError
    (UnauthorizedError, 401),
    (ForbiddenError, 403),
    (RateLimitedError, 429),
    (LeaseTimeoutError, 503),
    (QueueFullError, 503),
)


def _json(data: Any, status: int = 200) -> web.Response:
    """A JSON response."""
    return web.json_response(data, status=status)


def _lease_reply(data: dict[str, Any]) -> web.Response:
    """A lease or a release as JSON: the hot path, written by orjson (its values are strings, integers, finite
    floats, lists and dicts: :mod:`~petals_chain.protocol.json_codec`)."""
    return web.Response(body=json_codec.dumps(data), content_type="application/json", charset="utf-8")


def _error_reply(orch: Orchestrator, request: web.Request, exc: Exception) -> web.StreamResponse:
    """A known exception or one of aiohttp's own errors (status ≥ 400) as JSON ``{"error": ..., "status": ...}``
    (re-raised: an aiohttp exception below 400, a redirect)."""
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        status, message, fields = exc.status, exc.reason, []
        if isinstance(exc, web.HTTPRequestEntityTooLarge):
            message = f"request body too large: at most {MAX_BODY_BYTES} bytes"
    else:  # mapped below; unknown ones are a 500 with the message
        fields = exc.fields if isinstance(exc, BadRequestError) else []
        for cls, code in _STATUS_FOR:
            if isinstance(exc, cls):
                status, message = code, str(exc)
                break
        else:
            log.exception("unhandled error on %s %s", request.method, request.path, exc_info=exc)
            status, message = 500, f"internal error: {type(exc).__name__}: {exc}"
    orch.http_errors[status] = orch.http_errors.get(status, 0) + 1
    reply: dict[str, Any] = {"error": message, "status": status}
    if fields:
        reply["fields"] = fields
    resp = _json(reply, status)
    if status == 401:
        resp.headers["WWW-Authenticate"] = "Bearer"
    return resp


def _error_middleware(orch: Orchestrator) -> Callable:
    """Turn known exceptions and aiohttp's own errors into JSON (:func:`_error_reply`)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Callable) -> web.StreamResponse:
        try:
            return await handler(request)
        except Exception as exc:
            return _error_reply(orch, request, exc)

    return middleware


def _api_middleware(orch: Orchestrator, guard: Guard) -> Callable:
    """The orchestrator's one middleware: credentials (:func:`_authorize`), the handler, then the answer only once
    what the request changed is committed to the state store (--state-dir; group commit), errors as JSON
    (:func:`_error_reply`), in one layer rather than three (one call and frame per request instead of three; the
    gain is within run-to-run noise: results/bench/orchestrator-middleware-ab.txt)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Callable) -> web.StreamResponse:
        try:
            await _authorize(guard, request)
            resp = await handler(request)
            if orch.state is not None:
                await orch.state.durable()
            return resp
        except Exception as exc:
            return _error_reply(orch, request, exc)

    return middleware


OPEN_PATHS = OPEN_ROUTES  # probes of orchestration tools and the live page's HTML, which carry no credentials
CALLER_KEY = web.RequestKey("caller", Caller)  # the request's Caller, set by the auth middleware


async def _named_server(request: web.Request) -> str | None:
    """The ``name`` a request body speaks for, if it has one (read before the handler validates the body: aiohttp
    keeps the bytes for it); None for a body that is not a JSON object with a string name."""
    try:
        body = json.loads(await request.read())
    except (ValueError, UnicodeDecodeError):
        return None
    name = body.get("name") if isinstance(body, dict) else None
    return name if isinstance(name, str) else None


async def _authorize(guard: Guard, request: web.Request) -> None:
    """Check a request against the roles' policy (:mod:`petals_chain.orchestrator.trust.auth`) and record its Caller;
    nothing for a request that matched no route or method (its handler answers 404/405)."""
    if getattr(request.match_info, "http_exception", None) is not None:
        return
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else request.path
    if route == "/servers/heartbeat" and guard.enabled:  # the name is in the body: the handler checks it too
        named = await _named_server(request) if "Authorization" in request.headers else None
        caller = guard.caller(request, named)
        if caller.server is None:
            raise (UnauthorizedError if not caller.roles else ForbiddenError)(
                "a heartbeat needs the server's own secret (issued when it registered)")
    else:
        caller = guard.authorize(request, route, request.match_info.get("name"))
    request[CALLER_KEY] = caller


def _auth_middleware(guard: Guard) -> Callable:
    """Check every request against the roles' policy before its handler (:func:`_authorize`)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Callable) -> web.StreamResponse:
        await _authorize(guard, request)
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


async def _ready(request: web.Request) -> web.Response:
    """GET /ready: 200 once at least one chain is offered (a lease can be granted), else 503 saying what is missing.

    Not counted as an HTTP error: a probe polls it while the swarm starts.
    """
    h = request.app[ORCH_KEY].health()
    reply = {"ready": h["chains"] > 0, "chains": h["chains"], "capacity": h["capacity"], "version": h["version"]}
    if reply["ready"]:
        return _json(reply)
    if h["chains_composed"]:
        why = f"{h['chains_composed']} chains composed, their servers still loading their blocks"
    elif h["composition_error"]:
        why = f"no composition: {h['composition_error']}"
    else:
        why = f"no composition yet ({h['servers_alive']} servers alive)"
    return _json({**reply, "status": 503, "error": f"not ready: no chain offered; {why}"}, status=503)


async def _swarm(request: web.Request) -> web.Response:
    """GET /swarm: the DHT's initial peers and prefix and the model served, so a client needs only the URL."""
    orch = request.app[ORCH_KEY]
    dht, model = orch.dht_info or {}, orch.registry.model
    return _json({"initial_peers": dht.get("initial_peers") or [], "dht_prefix": dht.get("dht_prefix"),
                  "model": {"name": model.name, "num_blocks": model.num_blocks, **(orch.model_source or {})}})


async def _metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text (or OpenMetrics, if the Accept header asks for it)."""
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    return web.Response(body=encode(request.app[ORCH_KEY].metrics), headers={"Content-Type": content_type})


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
    """POST /servers/register: add or refresh a server; answers with its assignment and its own secret."""
    orch, guard = request.app[ORCH_KEY], request.app[GUARD_KEY]
    body = await read_body(request, RegisterBody)
    known = orch.registry.servers.get(body.name)
    guard.check_reregistration(request, body.name, known is not None and known.alive)
    same = known is not None and known.alive and guard.secrets.matches(body.name, request.headers.get(SECRET_HEADER))
    rec = await orch.register(body)
    reply = _server_reply(orch, rec)
    if guard.enabled:  # a fresh secret, unless the server proved it is the one holding the current one
        reply["secret"] = request.headers[SECRET_HEADER] if same else guard.secrets.issue(rec.name)
    return _json(reply)


async def _heartbeat(request: web.Request) -> web.Response:
    """POST /servers/heartbeat: liveness, served span, fresh measurements (only from the server itself)."""
    orch = request.app[ORCH_KEY]
    body = await read_body(request, HeartbeatBody)
    caller = request[CALLER_KEY]
    if request.app[GUARD_KEY].enabled and caller.server != body.name:
        raise ForbiddenError(f"heartbeat for server {body.name!r} from server {caller.server!r}: a server "
                             "speaks only for itself")
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
    body = await read_body(request, LeaveBody, required=False)
    rec = orch.registry.get(check_name(request.match_info["name"]))
    await orch.server_failed(rec.name, f"left: {body.reason}")
    return _json(_server_reply(orch, rec))


async def _evict(request: web.Request) -> web.Response:
    """POST /servers/{name}/evict (operator): mark the server dead, revoke its secret and refuse its name until the
    operator lifts the ban (``resume``); its chains go at once."""
    orch, guard = request.app[ORCH_KEY], request.app[GUARD_KEY]
    body = await read_body(request, CordonBody, required=False)
    rec = orch.registry.get(check_name(request.match_info["name"]))
    if body.resume:
        guard.unban(rec.name)
        log.warning("server %r may register again (the operator lifted its eviction)", rec.name)
    else:
        guard.ban(rec.name, body.reason)
        await orch.server_failed(rec.name, f"evicted by the operator: {body.reason}")
        log.warning("server %r evicted by the operator: %s", rec.name, body.reason)
    reply = _server_reply(orch, rec)
    reply["evicted"] = rec.name in guard.banned
    return _json(reply)


async def _cordon(request: web.Request) -> web.Response:
    """POST /servers/{name}/cordon (operator): no new leases through the server (``resume``: undo); unlike a drain
    its sessions stay and it does not leave."""
    orch = request.app[ORCH_KEY]
    body = await read_body(request, CordonBody, required=False)
    name = check_name(request.match_info["name"])
    trust = orch.trust
    if body.resume:
        trust.uncordon(name)
    else:
        trust.cordon(name, body.reason)
    reply = _server_reply(orch, orch.registry.get(name))
    reply["cordoned"] = name in trust.cordoned
    return _json(reply)


async def _drain(request: web.Request) -> web.Response:
    """POST /servers/{name}/drain: move every session off the server, then it leaves (GET: the drain's status)."""
    orch = request.app[ORCH_KEY]
    name = request.match_info["name"]
    if request.method == "GET":
        return _json(orch.drain_status(name))
    body = await read_body(request, DrainBody, required=False)
    return _json(await orch.drain(name, wait_s=body.wait_s, timeout_s=body.timeout_s))


async def _lease(request: web.Request) -> web.Response:
    """POST /lease: long-poll until the policy grants a chain."""
    orch = request.app[ORCH_KEY]
    body = await read_body(request, LeaseBody, required=False)
    lease = await orch.lease(timeout_s=body.timeout_s, ttl_s=body.ttl_s, client=body.client,
                             request_id=body.request_id, k_max=body.k_max)
    return _lease_reply(orch.lease_json(lease))


async def _renew(request: web.Request) -> web.Response:
    """POST /lease/{id}/renew: extend the TTL (and say where to move, if a move was decided)."""
    orch = request.app[ORCH_KEY]
    body = await read_body(request, RenewBody, required=False)
    lease, target = orch.renew(request.match_info["lease_id"], body.ttl_s)
    reply = orch.lease_json(lease)
    if target is not None:  # a move was decided: the holder moves at its next step boundary
        reply["migrate_to"] = orch.lease_json(target)
    return _lease_reply(reply)


async def _migrated(request: web.Request) -> web.Response:
    """POST /lease/{id}/migrated: the holder runs on the lease it was offered; the old one ends (404 if none)."""
    orch = request.app[ORCH_KEY]
    body = await read_body(request, MigratedBody, required=False)
    return _lease_reply(orch.lease_json(orch.migrated(request.match_info["lease_id"], body.mode, body.seconds)))


async def _migration_failed(request: web.Request) -> web.Response:
    """POST /lease/{id}/migration-failed: the holder could not move; it keeps this lease, the reservation ends."""
    orch = request.app[ORCH_KEY]
    body = await read_body(request, MigrationFailedBody, required=False)
    return _lease_reply(orch.lease_json(orch.migration_failed(request.match_info["lease_id"], body.mode)))


async def _migrations(request: web.Request) -> web.Response:
    """GET /migrations: the migration policy, counts and pending moves; POST {policy}: switch the policy."""
    orch = request.app[ORCH_KEY]
    if request.method == "POST":
        return _json(orch.set_migration_policy((await read_body(request, MigrationPolicyBody)).policy))
    return _json(orch.migration_json())


async def _policies(request: web.Request) -> web.Response:
    """GET /policies: every live lease policy the orchestrator knows (role, name, capabilities) and those in use."""
    return _json(request.app[ORCH_KEY].policies_json())


async def _width(request: web.Request) -> web.Response:
    """GET /width: the width policy, the measured load, the law now and the widths chosen and held; POST {policy,
    arrival_rate?}: switch the policy and measure afresh (an operator's switch, e.g. to compare policies on one
    swarm)."""
    widths = request.app[ORCH_KEY].width_manager()
    if request.method == "POST":
        body = await read_body(request, WidthBody)
        widths.set_policy(body.policy, body.arrival_rate)
    return _json(widths.to_json())


async def _release(request: web.Request) -> web.Response:
    """POST /lease/{id}/release: give the slot back."""
    orch = request.app[ORCH_KEY]
    await read_body(request, ReleaseBody, required=False)
    lease, held = orch.release(request.match_info["lease_id"])
    return _lease_reply({"lease_id": lease.lease_id, "released": True, "held_s": held})


async def _report_failure(request: web.Request) -> web.Response:
    """POST /lease/{id}/report-failure: a server broke; answers with a replacement lease."""
    orch = request.app[ORCH_KEY]
    body = await read_body(request, ReportFailureBody)
    lease = await orch.report_failure(request.match_info["lease_id"], body.server, timeout_s=body.timeout_s,
                                      ttl_s=body.ttl_s)
    return _lease_reply(orch.lease_json(lease))


def build_app(orch: Orchestrator, *, token: str | None = None, credentials: Credentials | None = None,
              sweep_interval_s: float = defaults.SWEEP_INTERVAL_S) -> web.Application:
    """The aiohttp application: routes, JSON errors, the roles' credentials (``token``: one for every role),
    background sweeper and, with a trust layer that verifies, its verification loop."""
    if credentials is None:
        credentials = Credentials.shared(token)
    elif token is not None:
        raise ValueError("give token (one for every role) or credentials, not both")
    guard = Guard(credentials)
    if orch.state is not None:  # --state-dir: secrets (salted hashes) and evictions outlive a restart
        orch.state.keep_guard(guard)
    app = web.Application(middlewares=[_api_middleware(orch, guard)], client_max_size=MAX_BODY_BYTES)
    app[ORCH_KEY] = orch
    app[GUARD_KEY] = guard
    app.router.add_get("/health", _health)
    app.router.add_get("/ready", _ready)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/chains", _chains)
    app.router.add_get("/queue", _queue)
    app.router.add_get("/servers", _servers)
    app.router.add_get("/swarm", _swarm)
    app.router.add_post("/servers/register", _register)
    app.router.add_post("/servers/heartbeat", _heartbeat)
    app.router.add_get("/servers/{name}/assignment", _assignment)
    app.router.add_post("/servers/{name}/leave", _leave)
    app.router.add_post("/servers/{name}/evict", _evict)
    app.router.add_post("/servers/{name}/cordon", _cordon)
    app.router.add_post("/servers/{name}/drain", _drain)
    app.router.add_get("/servers/{name}/drain", _drain)
    app.router.add_get("/migrations", _migrations)
    app.router.add_post("/migrations", _migrations)
    app.router.add_get("/policies", _policies)
    app.router.add_get("/width", _width)
    app.router.add_post("/width", _width)
    app.router.add_post("/lease", _lease)
    app.router.add_post("/lease/{lease_id}/renew", _renew)
    app.router.add_post("/lease/{lease_id}/release", _release)
    app.router.add_post("/lease/{lease_id}/report-failure", _report_failure)
    dashboard.add_routes(app, ORCH_KEY)
    app.router.add_post("/lease/{lease_id}/migrated", _migrated)
    app.router.add_post("/lease/{lease_id}/migration-failed", _migration_failed)

    async def start_sweeper(app: web.Application) -> None:
        """Start expiring leases and silent servers."""
        app[SWEEPER_KEY] = asyncio.create_task(orch.run_sweeper(sweep_interval_s))
        if orch.trust.verifier is not None:
            app[VERIFIER_KEY] = asyncio.create_task(orch.trust.run())

    async def stop_sweeper(app: web.Application) -> None:
        """Stop the sweeper and wake the waiters."""
        app[SWEEPER_KEY].cancel()
        if VERIFIER_KEY in app:
            app[VERIFIER_KEY].cancel()
        orch.leases.journal = None  # with --state-dir the stored queue outlives this shutdown; clients retry
        orch.leases.fail_waiters()
        orch.close()

    app.on_startup.append(start_sweeper)
    app.on_shutdown.append(stop_sweeper)
    return app


async def serve(
    app: web.Application,
    host: str,
    port: int,
    on_ready: Callable[[str, int], None] | None = None,
    stop: asyncio.Event | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> None:
    """Run the app on host:port (port 0 picks one; HTTPS with ``ssl_context``) until SIGINT/SIGTERM or ``stop``."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
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
