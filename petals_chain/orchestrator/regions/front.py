"""A region-aware orchestrator: one ordinary orchestrator per region (its own servers, GBP-CR + GCA chains, JFFC
within the region) and TORTA's macro layer in front, which decides which region serves each origin's requests.

docs/torta.md, "On the swarm: regions". A server joins a region by registering with that region's orchestrator
(``/regions/NAME/...``) once the front has placed it (:meth:`RegionalOrchestrator.place`: the region it names, or
the one its RTTs to the regions' anchors cluster it into); a lease request carries its origin (or the client's RTTs
to the regions); each slot the macro layer (:class:`~petals_chain.torta.regional.RegionalMacro`) turns the regions'
queues, capacities and the origins' recent arrivals into a plan A_t, and each request is sent to a region by the
live policy (``torta`` = the OT plan, ``torta-ppo`` = that plan refined by a trained PPO policy, ``skylb``,
``rr``), then waits in that region's FIFO queue for its JFFC chain.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from petals_chain.orchestrator.engine.core import Orchestrator
from petals_chain.orchestrator.leasing.leases import Lease, UnknownLeaseError
from petals_chain.torta.regional import POLICIES, RegionalMacro, RegionError, RegionLoad, nearest, place_by_rtt, \
    rtt_vector

log = logging.getLogger(__name__)
MAX_DECISIONS = 10_000  # routing decisions kept for GET /macro (the newest)


@dataclass(frozen=True)
class Placement:
    """Where a server was placed: its region, how (``name`` given or by ``rtt``) and the RTTs it reported."""

    region: str
    by: str
    rtt_s: tuple[float, ...] | None = None


@dataclass(frozen=True)
class Decision:
    """One routed request: when, from which origin, to which region, under which policy and plan slot."""

    time_s: float
    origin: str
    region: str
    policy: str
    slot: int
    client: str | None


class RegionalOrchestrator:
    """Orchestrators per region behind the macro layer; every method is called on the event loop."""

    def __init__(self, regions: Mapping[str, Orchestrator], macro: RegionalMacro, *, policy: str = "torta",
                 clock: Callable[[], float] = time.monotonic, anchors: Mapping[str, str] | None = None,
                 dht_info: Mapping[str, Any] | None = None) -> None:
        if list(regions) != macro.names:
            raise RegionError(f"regions: {list(regions)} differ from the macro layer's {macro.names}")
        self.regions = dict(regions)
        self.macro = macro
        self.policy = self.check_policy(policy)
        self.clock = clock
        self.http_errors: dict[int, int] = {}  # the API's error middleware counts here
        self.dht_info: dict[str, Any] | None = dict(dht_info) if dht_info is not None else None  # the DHT it runs
        self.lease_region: dict[str, tuple[str, str]] = {}  # lease id -> (region, origin)
        self.decisions: list[Decision] = []
        self.plans: list[dict[str, Any]] = []  # one row per slot: slot, plan, forecast, queue, capacity
        for name in anchors or {}:
            macro.index(name, "anchors")
        self.anchors = dict(anchors or {})  # region -> URL a server measures its round trip to
        self.placements: dict[str, Placement] = {}  # server name -> where the front placed it

    def check_policy(self, policy: str) -> str:
        """A known live policy (torta-ppo only with a loaded PPO policy); RegionError naming the field otherwise."""
        if policy not in POLICIES:
            raise RegionError(f"policy: unknown {policy!r} (known: {', '.join(POLICIES)})")
        if policy == "torta-ppo" and self.macro.policy is None:
            raise RegionError("policy: torta-ppo needs a trained PPO policy (start with --ppo-checkpoint)")
        return policy

    @property
    def names(self) -> list[str]:
        """Region names in index order."""
        return self.macro.names

    # ---- state the macro layer reads ---------------------------------------------------------------

    def load(self) -> RegionLoad:
        """Per region: requests its offered chains finish per slot, queue length, free and held slots."""
        cap, queue, free, busy = (np.zeros(len(self.names)) for _ in range(4))
        for r, orch in enumerate(self.regions.values()):
            snap = orch.leases.snapshot()
            cap[r] = self.macro.slot_s * sum(c.capacity / c.service_time_s for c in snap.chains)
            queue[r] = snap.queue_length
            free[r] = orch.leases.free_capacity()
            busy[r] = sum(snap.occupancy)
        return RegionLoad(cap, queue, free, busy)

    def new_slot(self) -> np.ndarray:
        """Close the slot, compute the next plan A_t, and forget leases that ended without a release."""
        load = self.load()
        plan = self.macro.new_slot(load)
        self.plans.append({"slot": self.macro.slot, "time_s": self.clock(), "plan": plan.tolist(),
                           "prob": self.macro.prob.tolist(),
                           "ppo_plan": self.macro.ppo_plan.tolist(), "forecast": self.macro.forecast().tolist(),
                           "queue": load.queue.tolist(), "capacity_per_slot": load.capacity_per_slot.tolist()})
        del self.plans[:-MAX_DECISIONS]
        for lease_id, (region, _) in list(self.lease_region.items()):
            if not self.regions[region].leases.has(lease_id):
                del self.lease_region[lease_id]
        return plan

    async def run_slots(self) -> None:
        """Call :meth:`new_slot` every slot until cancelled."""
        while True:
            await asyncio.sleep(self.macro.slot_s)
            try:
                self.new_slot()
            except Exception:  # the slot ticker must survive anything; the old plan stays
                log.exception("macro slot failed")

    # ---- server placement -------------------------------------------------------------------------

    def registered_in(self, server: str) -> str | None:
        """The region whose orchestrator has ``server`` registered and alive (None if none has)."""
        return next((n for n, o in self.regions.items()
                     if server in o.registry.servers and o.registry.servers[server].alive), None)

    def place(self, server: str, *, region: str | None = None, rtt_s: Mapping[str, float] | None = None) -> Placement:
        """Place a server in a region: the one it names, or the one its RTTs to the anchors cluster it into
        (:func:`~petals_chain.torta.regional.place_by_rtt`). RegionError naming the field for an unknown region or a
        malformed RTT map, and for a server already registered in another region; nothing is recorded then."""
        if (region is None) == (rtt_s is None):
            raise RegionError("region: give the server's region, or its rtt_s to every region's anchor (not both)")
        if region is not None:
            self.macro.index(region, "region")
            placement = Placement(region, "name")
        else:
            v = rtt_vector(rtt_s or {}, self.names)
            placed = [(np.array(p.rtt_s), self.names.index(p.region)) for n, p in self.placements.items()
                      if p.by == "rtt" and n != server]
            r = place_by_rtt(v, 2 * self.macro.latency_s, placed)
            placement = Placement(self.names[r], "rtt", tuple(v.tolist()))
        there = self.registered_in(server)
        if there is not None and there != placement.region:
            raise RegionError(f"region: server {server!r} is registered in region {there!r}; it must leave there "
                              f"before it joins {placement.region!r}")
        self.placements[server] = placement
        log.info("server %r placed in region %r (by %s)", server, placement.region, placement.by)
        return placement

    def regions_json(self) -> dict[str, Any]:
        """Every region with its anchor, servers and the URL prefix its servers use; the inter-region RTTs."""
        return {"regions": [{"name": n, "path": f"/regions/{n}", "anchor": self.anchors.get(n),
                             "servers": sorted(o.registry.servers)} for n, o in self.regions.items()],
                "rtt_s": (2 * self.macro.latency_s).tolist(),
                "placements": {k: p.__dict__ for k, p in self.placements.items()}}

    # ---- leases -----------------------------------------------------------------------------------

    def origin_of(self, origin: str | None, rtt_s: Mapping[str, float] | None) -> str:
        """The request's origin region: given, or the region of the smallest round trip the client measured."""
        if origin is not None:
            self.macro.index(origin, "origin")
            return origin
        if rtt_s:
            return nearest(dict(rtt_s), self.names)
        raise RegionError("origin: give the client's origin region, or its rtt_s to the regions")

    async def acquire(self, origin: str, *, timeout_s: float, ttl_s: float | None = None,
                      client: str | None = None) -> tuple[str, Lease]:
        """Route one request of ``origin`` to a region by the current policy and wait there for a chain."""
        o = self.macro.index(origin, "origin")
        region = self.names[self.macro.choose(o, self.policy, self.load())]
        self.decisions.append(Decision(self.clock(), origin, region, self.policy, self.macro.slot, client))
        del self.decisions[:-MAX_DECISIONS]
        lease = await self.regions[region].lease(timeout_s=timeout_s, ttl_s=ttl_s, client=client)
        self.lease_region[lease.lease_id] = (region, origin)
        return region, lease

    def region_of(self, lease_id: str) -> tuple[str, str]:
        """(region, origin) of a lease granted here; UnknownLeaseError otherwise."""
        try:
            return self.lease_region[lease_id]
        except KeyError:
            raise UnknownLeaseError(f"unknown lease {lease_id!r}") from None

    def renew(self, lease_id: str, ttl_s: float | None = None) -> tuple[str, str, Lease]:
        """Extend a lease's TTL in its region; return (region, origin, lease)."""
        region, origin = self.region_of(lease_id)
        lease, _ = self.regions[region].renew(lease_id, ttl_s)  # a region's leases do not move (JFFC, no migration)
        return region, origin, lease

    def release(self, lease_id: str) -> tuple[str, Lease, float]:
        """Give a lease's slot back to its region; return (region, lease, seconds held)."""
        region, _ = self.region_of(lease_id)
        lease, held = self.regions[region].release(lease_id)
        self.lease_region.pop(lease_id, None)
        return region, lease, held

    async def report_failure(self, lease_id: str, server: str, *, timeout_s: float,
                             ttl_s: float | None = None) -> tuple[str, Lease]:
        """A server of the lease's chain broke: its region replaces the lease (same place in line)."""
        region, origin = self.region_of(lease_id)
        lease = await self.regions[region].report_failure(lease_id, server, timeout_s=timeout_s, ttl_s=ttl_s)
        self.lease_region.pop(lease_id, None)
        self.lease_region[lease.lease_id] = (region, origin)
        return region, lease

    def lease_json(self, region: str, origin: str, lease: Lease) -> dict[str, Any]:
        """The region's lease reply plus the region that serves it and the origin it came from."""
        return {**self.regions[region].lease_json(lease), "region": region, "origin": origin}

    # ---- views ------------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """Liveness plus per-region summaries; the fields a single orchestrator's /health has, summed."""
        per = {name: orch.health() for name, orch in self.regions.items()}
        first = next(iter(per.values()))
        total = {k: sum(h[k] for h in per.values()) for k in (
            "servers_registered", "servers_alive", "chains", "chains_composed", "capacity", "free", "queue_length",
            "active_leases", "orphaned_leases")}
        return {"status": "ok", "policy": self.policy, "slot": self.macro.slot, **total,
                "composition": all(h["composition"] for h in per.values()),
                "version": sum(h["version"] for h in per.values()), "model": first["model"], "dht": self.dht_info,
                "regions": per}

    def macro_json(self, last: int = 50) -> dict[str, Any]:
        """The policy, the latest plans and routing decisions, and the per-origin share actually routed."""
        routed = np.zeros((len(self.names), len(self.names)))
        for d in self.decisions:
            routed[self.names.index(d.origin), self.names.index(d.region)] += 1
        return {"policy": self.policy, "regions": self.names, "slot": self.macro.slot, "slot_s": self.macro.slot_s,
                "plan": self.macro.plan.tolist(), "ppo_plan": self.macro.ppo_plan.tolist(), "plans": self.plans[-last:],
                "decisions": [d.__dict__ for d in self.decisions[-last:]], "routed": routed.tolist()}
