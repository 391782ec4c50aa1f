"""The orchestrator's live page: GET /dashboard (one offline HTML file) and GET /dashboard.json (what it draws).

The page polls /dashboard.json every 1.5 s and draws the block map (one row per server, its assigned span coloured by
its state, as PETALS' health monitor draws a swarm), the chains with capacity c_k and occupancy, the central queue,
the last finished leases with their waiting and holding times, and the Theorem 3.7 bounds on the mean response time
of the current composition (computed by :func:`petals_chain.analysis.bounds.theorem37_bounds`, never re-derived).
Everything is read from the orchestrator's state at request time, as /metrics does; nothing is counted twice.

The HTML carries no data, so it is served without credentials; with a token, the page reads it from the URL fragment
(``/dashboard#token=T``, never sent to the server) and sends it with each poll of /dashboard.json.
"""

from __future__ import annotations

import math
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING, Any

from aiohttp import web

from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.model import span_json
from petals_chain.orchestrator.engine.chains import ChainInfo
from petals_chain.orchestrator.engine.metrics import SERVER_STATES, cache_slots_by_server, server_state

if TYPE_CHECKING:
    from petals_chain.orchestrator.engine.core import Orchestrator

PAGE_PATH = "/dashboard"
STATE_PATH = "/dashboard.json"
QUEUE_HEAD = 20  # waiting requests listed on the page (the length counts them all)
# The page loads nothing from elsewhere: scripts, styles and data all come from the orchestrator itself.
_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
        "img-src 'self' data:")


@lru_cache(maxsize=1)
def page_html() -> str:
    """The page itself (petals_chain/orchestrator/http/static/dashboard.html), read once."""
    return (resources.files("petals_chain.orchestrator.http") / "static" / "dashboard.html").read_text(encoding="utf-8")


def bounds_json(chains: list[ChainInfo], arrival_rate_per_s: float) -> dict[str, Any]:
    """Theorem 3.7 lower/upper bounds for these chains at λ, as strict JSON (null bounds when unstable or empty)."""
    total = sum(c.capacity * c.rate_per_s for c in chains)
    out: dict[str, Any] = {"chains": len(chains), "total_rate_per_s": total, "lower_s": None, "upper_s": None,
                           "stable": False}
    if not chains:
        out["why"] = "no chains"
        return out
    b = theorem37_bounds([c.rate_per_s for c in chains], [c.capacity for c in chains], arrival_rate_per_s)
    if not (math.isfinite(b.lower_s) and math.isfinite(b.upper_s)):
        out["why"] = f"arrival rate {arrival_rate_per_s:g}/s >= total service rate {total:g}/s: no steady state"
        return out
    out.update(lower_s=b.lower_s, upper_s=b.upper_s, stable=True)
    return out


def _slots_in_use(orch: Orchestrator) -> dict[str, int]:
    """Cache slots (one block for one job) held by active leases, per server."""
    used: dict[str, int] = {}
    for lease in orch.leases.leases():
        for span in lease.chain.spans:
            used[span.server] = used.get(span.server, 0) + span.end - span.start
    return used


def _servers(orch: Orchestrator) -> list[dict[str, Any]]:
    """Every registry record with its state, its assigned and served spans and its cache slots."""
    slots = cache_slots_by_server(orch.registry.composition)
    used = _slots_in_use(orch)
    out = []
    for rec in orch.registry.servers.values():
        a = rec.assignment
        out.append({
            "name": rec.name,
            "state": server_state(rec),
            "alive": rec.alive,
            "dead_reason": rec.dead_reason or None,
            "peer_id": rec.peer_id,
            "assignment": span_json(a.start, a.end) if a is not None and a.num_blocks > 0 else None,
            "previous": (span_json(rec.previous_assignment.start, rec.previous_assignment.end)
                         if rec.previous_assignment is not None and rec.previous_assignment.num_blocks > 0 else None),
            "serving": span_json(*rec.serving) if rec.serving is not None and rec.serving[1] > rec.serving[0]
            else None,
            "memory_bytes": rec.memory_bytes,
            "tau_p_s": rec.tau_p_s,
            "tau_c_s": rec.tau_c_s,
            "cache_slots": slots.get(rec.name, 0),
            "cache_slots_in_use": used.get(rec.name, 0),
        })
    return out


def _chain_row(chain: ChainInfo, busy: int, offered: bool) -> dict[str, Any]:
    """One row of the chains table."""
    return {
        "chain_id": chain.chain_id,
        "spans": [{"server": s.server, "start": s.start, "end": s.end} for s in chain.spans],
        "capacity": chain.capacity,
        "busy": busy,
        "service_time_s": chain.service_time_s,
        "offered": offered,
    }


def routes_per_request(orch: Orchestrator) -> bool:
    """Whether the lease manager routes each request over the placement (WS-RR) instead of offering fixed chains."""
    return orch.leases.capabilities.routes_over_placement


def _chains(orch: Orchestrator) -> tuple[list[dict[str, Any]], list[ChainInfo]]:
    """The chains table and the chains offered now.

    Fixed chains (JFFC): every composed chain, offered or not, with its occupancy. Routes per request (WS-RR): what
    /chains lists, one row per server of the placement with its cache slots M~_j in use; no fixed chain is offered.
    """
    snap = orch.leases.snapshot()
    if routes_per_request(orch):  # a route's time is known per request only
        return [{**_chain_row(c, z, True), "service_time_s": None} for c, z in zip(snap.chains, snap.occupancy)], []
    busy = {id(c): z for c, z in zip(snap.chains, snap.occupancy)}  # offered chains are the composed objects
    rows = [_chain_row(c, busy.get(id(c), 0), id(c) in busy) for c in orch.composed]
    return rows, [c for c in orch.composed if id(c) in busy]


def dashboard_state(orch: Orchestrator) -> dict[str, Any]:
    """Everything the live page draws, read from the orchestrator now (strict JSON: no NaN or Infinity)."""
    now = orch.clock()
    snap = orch.leases.snapshot()
    chains, offered = _chains(orch)
    recent = orch.leases.recent.newest_first()
    lam = orch.composition_policy.arrival_rate
    comp = orch.registry.composition
    cnt = orch.leases.counters
    offered_bounds = bounds_json(offered, lam)
    if routes_per_request(orch):
        offered_bounds["why"] = "routes per request (WS-RR): Theorem 3.7 bounds JFFC over fixed chains"
    return {
        "version": orch.registry.version,
        "uptime_s": now - orch.started_s,
        "model": {"name": orch.registry.model.name, "num_blocks": orch.registry.model.num_blocks},
        "c": comp.c if comp is not None else None,
        "composition_error": orch.registry.error,
        "arrival_rate_per_s": lam,
        "routing": "ws-rr" if routes_per_request(orch) else "jffc",
        "target_load": orch.composition_policy.target_load,
        "states": list(SERVER_STATES),
        "servers": _servers(orch),
        "chains": chains,
        "totals": {
            "capacity": sum(snap.capacities),
            "busy": sum(snap.occupancy),
            "free": orch.leases.free_capacity(),
            "active_leases": snap.active,
            "orphaned_leases": snap.orphaned,
        },
        "queue": {
            "length": snap.queue_length,
            "head": [{"job": j, "waited_s": w, "client": c} for j, w, c in orch.leases.queued()[:QUEUE_HEAD]],
        },
        "recent": [f.to_json(now) for f in recent],
        "recent_mean": {
            "count": len(recent),
            "waited_s": sum(f.waited_s for f in recent) / len(recent) if recent else None,
            "held_s": sum(f.held_s for f in recent) / len(recent) if recent else None,
        },
        "counters": {"requested": cnt.requested, "granted": cnt.granted, "released": cnt.released,
                     "expired": cnt.expired, "failed": cnt.failed, "timed_out": cnt.timed_out},
        "bounds": {
            "composed": bounds_json(orch.composed, lam),  # the composition as planned
            "offered": offered_bounds,  # the chains a request can be given now
        },
    }


async def page(request: web.Request) -> web.Response:
    """GET /dashboard: the page (it fetches its data itself)."""
    return web.Response(text=page_html(), content_type="text/html", charset="utf-8",
                        headers={"Cache-Control": "no-store", "Content-Security-Policy": _CSP})


def state_handler(orch_key: web.AppKey) -> Any:
    """GET /dashboard.json for the orchestrator stored under ``orch_key`` in the app."""

    async def handler(request: web.Request) -> web.Response:
        """GET /dashboard.json: :func:`dashboard_state` of the orchestrator."""
        return web.json_response(dashboard_state(request.app[orch_key]), headers={"Cache-Control": "no-store"})

    return handler


def add_routes(app: web.Application, orch_key: web.AppKey) -> None:
    """Add GET /dashboard and GET /dashboard.json to the orchestrator's app."""
    app.router.add_get(PAGE_PATH, page)
    app.router.add_get(STATE_PATH, state_handler(orch_key))
