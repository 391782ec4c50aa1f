"""HTTP/JSON API of the region-aware orchestrator: each region's own API under ``/regions/NAME``, leases in front.

Routes besides every region's (``/regions/NAME/servers/register`` etc., exactly a single orchestrator's API):
GET /health · GET /ready · GET /servers (every region's records, with their region) · GET /regions (names, anchors,
servers, placements) · POST /servers/place {name, region? | rtt_s?} (which region a server joins: the one it names,
or the one its RTTs to the anchors cluster it into; it then registers under /regions/REGION) · GET /macro (policy,
plans, routing decisions) · POST /macro/policy {policy} (torta | torta-ppo | skylb | rr) · POST /macro/slot ·
POST /lease {origin? | rtt_s?, timeout_s?, ttl_s?, client?} · POST /lease/{id}/renew|release|report-failure.
The same lease routes and /health under ``/origins/ORIGIN`` take the origin from the path, so a PETALS client
given ``orchestrator=http://HOST:PORT/origins/ORIGIN`` leases for that origin unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Annotated

from aiohttp import web
from pydantic import Field, StrictFloat, StrictStr

from petals_chain import defaults
from petals_chain.orchestrator.http.api import _error_middleware, build_app
from petals_chain.orchestrator.regions.front import RegionalOrchestrator
from petals_chain.orchestrator.http.request_body import read_body
from petals_chain.protocol.fields import Body, Label, ServerName, TtlSeconds, WaitSeconds
from petals_chain.protocol.limits import DEFAULT_WAIT_S, MAX_BODY_BYTES
from petals_chain.protocol.parsing import BadRequestError
from petals_chain.protocol.requests import LeaseBody, ReleaseBody, RenewBody, ReportFailureBody
from petals_chain.torta.regional import RegionError

REGIONAL_KEY = web.AppKey("regional", RegionalOrchestrator)
SLOTS_KEY = web.AppKey("slots", asyncio.Task)
RttSeconds = Annotated[StrictFloat, Field(ge=0.0, le=3600.0, allow_inf_nan=False)]


class RegionalLeaseBody(Body):
    """POST /lease at the front: a lease body plus the client's origin region, or its RTTs to the regions."""

    timeout_s: WaitSeconds = DEFAULT_WAIT_S
    ttl_s: TtlSeconds | None = None
    client: Label | None = None
    origin: Annotated[StrictStr, Field(min_length=1, max_length=128)] | None = None
    rtt_s: dict[str, RttSeconds] | None = None


class PlaceBody(Body):
    """POST /servers/place: a server's name and its region, or its measured RTTs to every region's anchor."""

    name: ServerName
    region: Annotated[StrictStr, Field(min_length=1, max_length=128)] | None = None
    rtt_s: dict[str, RttSeconds] | None = None


class PolicyBody(Body):
    """POST /macro/policy: the live policy that routes requests to regions from now on."""

    policy: StrictStr


def _region_errors() -> Callable:
    """RegionError (an unknown origin, policy, or RTT map) → 400 naming its field."""

    @web.middleware
    async def middleware(request: web.Request, handler: Callable) -> web.StreamResponse:
        try:
            return await handler(request)
        except RegionError as exc:
            raise BadRequestError(str(exc), [str(exc).split(":", 1)[0]]) from None

    return middleware


def _reg(request: web.Request) -> RegionalOrchestrator:
    """The regional orchestrator behind the app."""
    return request.app[REGIONAL_KEY]


async def _health(request: web.Request) -> web.Response:
    """GET /health: per-region summaries and their sums."""
    return web.json_response(_reg(request).health())


async def _ready(request: web.Request) -> web.Response:
    """GET /ready: 200 once every region offers a chain, else 503 naming the regions without one."""
    h = _reg(request).health()
    missing = [n for n, r in h["regions"].items() if r["chains"] == 0]
    reply = {"ready": not missing, "chains": h["chains"], "capacity": h["capacity"]}
    if missing:
        return web.json_response({**reply, "status": 503, "error": f"not ready: no chain offered in {missing}"},
                                 status=503)
    return web.json_response(reply)


async def _servers(request: web.Request) -> web.Response:
    """GET /servers: every region's records, each with its region."""
    reg = _reg(request)
    servers = [{**rec.to_json(), "region": name} for name, orch in reg.regions.items()
               for rec in orch.registry.servers.values()]
    version = sum(o.registry.version for o in reg.regions.values())
    return web.json_response({"version": version, "servers": servers})


async def _regions(request: web.Request) -> web.Response:
    """GET /regions: names, anchors, servers and placements of every region, and the inter-region RTTs."""
    return web.json_response(_reg(request).regions_json())


async def _place(request: web.Request) -> web.Response:
    """POST /servers/place: the region a server joins (named, or clustered from its RTTs) and its URL prefix."""
    body = await read_body(request, PlaceBody)
    p = _reg(request).place(body.name, region=body.region, rtt_s=body.rtt_s)
    return web.json_response({"name": body.name, "region": p.region, "by": p.by, "path": f"/regions/{p.region}",
                              "rtt_s": p.rtt_s})


async def _macro(request: web.Request) -> web.Response:
    """GET /macro: the policy, the latest plans and routing decisions."""
    return web.json_response(_reg(request).macro_json())


async def _set_policy(request: web.Request) -> web.Response:
    """POST /macro/policy: switch the live policy."""
    reg = _reg(request)
    body = await read_body(request, PolicyBody)
    reg.policy = reg.check_policy(body.policy)
    return web.json_response({"policy": reg.policy})


async def _new_slot(request: web.Request) -> web.Response:
    """POST /macro/slot: close the slot now and answer the new plan."""
    reg = _reg(request)
    plan = reg.new_slot()
    return web.json_response({"slot": reg.macro.slot, "plan": plan.tolist()})


async def _swarm(request: web.Request) -> web.Response:
    """GET /swarm (or /origins/O/swarm): the DHT's initial peers and prefix and the model, as a single orchestrator
    answers it, so a client of any origin needs only the front's URL."""
    reg = _reg(request)
    first = next(iter(reg.regions.values()))
    dht, model = reg.dht_info or {}, first.registry.model
    return web.json_response({"initial_peers": dht.get("initial_peers") or [], "dht_prefix": dht.get("dht_prefix"),
                              "model": {"name": model.name, "num_blocks": model.num_blocks,
                                        **(first.model_source or {})}})


async def _lease(request: web.Request) -> web.Response:
    """POST /lease (or /origins/O/lease): route the request to a region, long-poll there for a chain."""
    reg = _reg(request)
    path_origin = request.match_info.get("origin")
    if path_origin is not None:
        body = await read_body(request, LeaseBody, required=False)
        origin = reg.origin_of(path_origin, None)
    else:
        body = await read_body(request, RegionalLeaseBody, required=False)
        origin = reg.origin_of(body.origin, body.rtt_s)
    region, lease = await reg.acquire(origin, timeout_s=body.timeout_s, ttl_s=body.ttl_s, client=body.client)
    return web.json_response(reg.lease_json(region, origin, lease))


async def _renew(request: web.Request) -> web.Response:
    """POST /lease/{id}/renew: extend the TTL in the lease's region."""
    reg = _reg(request)
    body = await read_body(request, RenewBody, required=False)
    region, origin, lease = reg.renew(request.match_info["lease_id"], body.ttl_s)
    return web.json_response(reg.lease_json(region, origin, lease))


async def _release(request: web.Request) -> web.Response:
    """POST /lease/{id}/release: give the slot back to its region."""
    reg = _reg(request)
    await read_body(request, ReleaseBody, required=False)
    region, lease, held = reg.release(request.match_info["lease_id"])
    return web.json_response({"lease_id": lease.lease_id, "released": True, "held_s": held, "region": region})


async def _report_failure(request: web.Request) -> web.Response:
    """POST /lease/{id}/report-failure: the lease's region replaces it."""
    reg = _reg(request)
    body = await read_body(request, ReportFailureBody)
    _, origin = reg.region_of(request.match_info["lease_id"])
    region, lease = await reg.report_failure(request.match_info["lease_id"], body.server, timeout_s=body.timeout_s,
                                             ttl_s=body.ttl_s)
    return web.json_response(reg.lease_json(region, origin, lease))


def build_regional_app(reg: RegionalOrchestrator, *, token: str | None = None, run_slots: bool = True,
                       sweep_interval_s: float = defaults.SWEEP_INTERVAL_S) -> web.Application:
    """The front app (lease routing, macro views) with every region's own app mounted under /regions/NAME."""
    from petals_chain.orchestrator.http.api import _auth_middleware
    from petals_chain.orchestrator.trust.auth import Credentials, Guard

    # one token for every role (the regional front has no per-role credentials yet): its routes are all allowed
    guard = Guard(Credentials.shared(token))
    app = web.Application(middlewares=[_error_middleware(reg), _auth_middleware(guard), _region_errors()],
                          client_max_size=MAX_BODY_BYTES)
    app[REGIONAL_KEY] = reg
    for prefix in ("", "/origins/{origin}"):
        app.router.add_get(prefix + "/health", _health)
        app.router.add_get(prefix + "/swarm", _swarm)
        app.router.add_post(prefix + "/lease", _lease)
        app.router.add_post(prefix + "/lease/{lease_id}/renew", _renew)
        app.router.add_post(prefix + "/lease/{lease_id}/release", _release)
        app.router.add_post(prefix + "/lease/{lease_id}/report-failure", _report_failure)
    app.router.add_get("/ready", _ready)
    app.router.add_get("/servers", _servers)
    app.router.add_post("/servers/place", _place)
    app.router.add_get("/regions", _regions)
    app.router.add_get("/macro", _macro)
    app.router.add_post("/macro/policy", _set_policy)
    app.router.add_post("/macro/slot", _new_slot)
    for name, orch in reg.regions.items():
        app.add_subapp(f"/regions/{name}/", build_app(orch, token=token, sweep_interval_s=sweep_interval_s))

    async def start_slots(app: web.Application) -> None:
        """Start the macro layer's slot ticker."""
        if run_slots:
            app[SLOTS_KEY] = asyncio.create_task(reg.run_slots())

    async def stop_slots(app: web.Application) -> None:
        """Stop the slot ticker."""
        if SLOTS_KEY in app:
            app[SLOTS_KEY].cancel()

    app.on_startup.append(start_slots)
    app.on_shutdown.append(stop_slots)
    return app
