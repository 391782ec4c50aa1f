"""BPRR's WS-RR routing as an orchestrator lease manager: a route per request over the placement, cache-aware.

A drop-in for :class:`~petals_chain.orchestrator.leasing.leases.LeaseManager` (same API, used by the orchestrator
app) that ignores fixed chains. The routing itself is :class:`petals_chain.dispatch.ws_rr.WsRr`, the one
WS-RR policy the simulator's BPRR (:func:`petals_chain.sim.baselines.simulate_bprr`, ``estimate="mean"``)
drives too: per lease request, on arrival, Dijkstra over the placement's feasible-edge DAG with edge cost
``w_j(m) + τc_j + τp_j·m`` (``w_j(m)`` the believed wait until ``m`` of server j's ``M̃_j`` cache slots are
free), committed at once; the scheduler believes each job ends ``T_route`` after it starts and learns real
starts and ends as they happen. A committed request is granted its lease when it heads the FIFO of committed
requests at each of its servers and every one has ``m_ij`` free slots; its slots are taken only then.

This module only connects that policy to leases: the clock, the asyncio futures of waiting clients, lease
ids, expiry and counters. A lease is granted at the instant the policy starts its job and its release
(or expiry) is the job's departure; a client that gives up while waiting withdraws its request.
"""

from __future__ import annotations

import asyncio
import secrets
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from petals_chain import defaults
from petals_chain.compose.routes import RouteGraph
from petals_chain.dispatch.ws_rr import WsRr
from petals_chain.model import Composition, InfeasibleError
from petals_chain.orchestrator.engine.chains import ChainInfo
from petals_chain.orchestrator.leasing.policy import LeaseCapabilities
from petals_chain.orchestrator.leasing.leases import (
    Lease,
    LeaseManager,
    LeaseSnapshot,
    LeaseTimeoutError,
    QueueFullError,
    _Waiter,
)
from petals_chain.protocol.hop import Hop


@dataclass
class _Request(_Waiter):
    """A request committed to a route (waiting or in service): a waiter with its routing epoch and chain."""

    epoch: int = 0
    chain: ChainInfo | None = None  # its route, once committed


class WsRrLeaseManager(LeaseManager):
    """Leases whose chain is a per-request WS-RR route over the current placement (see the module docstring)."""

    capabilities: ClassVar[LeaseCapabilities] = LeaseCapabilities(routes_over_placement=True, fixed_chains=False)

    def __init__(self, *, default_ttl_s: float = defaults.LEASE_TTL_S, max_waiting: int = defaults.MAX_WAITING,
                 clock: Callable[[], float] | None = None) -> None:
        kwargs: dict[str, Any] = {"default_ttl_s": default_ttl_s, "max_waiting": max_waiting}
        if clock is not None:
            kwargs["clock"] = clock
        super().__init__(**kwargs)
        self._graph: RouteGraph | None = None
        self._ws: WsRr | None = None  # the policy of the current placement (epoch)
        self._names: list[str] = []
        self._requests: dict[int, _Request] = {}  # job -> request, waiting or in service (any epoch)
        self._by_lease: dict[str, int] = {}

    # ---- the placement ----------------------------------------------------------------------------------------

    def set_composition(self, composition: Composition | None, version: int) -> None:
        """Route over ``composition``'s placement from now on (M̃_j slots per server); earlier routes keep theirs.

        Leases granted on the old placement stay valid until released but free nothing on the new one;
        requests still waiting are routed again on the new placement, in their commit order."""
        graph = None if composition is None else RouteGraph.build(composition.servers, composition.model,
                                                                   composition.placement)
        self._version = version
        self._epoch += 1
        waiting = [self._requests[j] for j in self._ws.queued_jobs()] if self._ws is not None else []
        if composition is None:
            self._graph = self._ws = None
            for req in waiting:
                del self._requests[req.job]
                if not req.future.done():
                    req.future.set_exception(LeaseTimeoutError("no placement to route over"))
            return
        self._graph = graph
        self._ws = WsRr(graph)
        self._names = [composition.servers[int(j)].name for j in graph.index]
        now = self.clock()
        for req in waiting:
            try:
                self._commit(req, now)
            except InfeasibleError as exc:  # no route fits this placement: the request cannot wait for one
                del self._requests[req.job]
                if not req.future.done():
                    req.future.set_exception(LeaseTimeoutError(str(exc)))
        self._grant(self._ws.start_ready(now), now)

    def set_chains(self, chains: Any, version: int) -> None:
        """Fixed chains do not apply to WS-RR (routes are per request); only the version is kept."""
        self._version = version

    # ---- the policy's decisions as leases ---------------------------------------------------------------------

    def _commit(self, req: _Request, now: float) -> None:
        """Have the policy route and commit ``req`` now; its lease's chain is that route."""
        assert self._ws is not None
        hops = self._ws.commit(req.job, now)
        req.chain = self._chain_info(req.job, hops, self._ws.route_time_s(req.job))
        req.epoch = self._epoch
        self._requests[req.job] = req

    def _chain_info(self, job: int, hops: list[tuple[int, int]], route_s: float) -> ChainInfo:
        """The route as named PETALS spans (0-indexed, end exclusive): m blocks ending at the server's last one."""
        assert self._graph is not None
        spans = []
        for q, m in hops:
            end = int(self._graph.end[q]) - 1
            spans.append(Hop(self._names[q], end - m, end))
        return ChainInfo(tuple(spans), 1, route_s, f"v{self._version}.r{job}")

    def _grant(self, starts: list[int], now: float) -> None:
        """Grant a lease to every job the policy started, in its order; a start for a vanished client is handed
        straight back to the policy (a departure at the same instant)."""
        assert self._ws is not None or not starts
        work = deque(starts)
        while work:
            job = work.popleft()
            req = self._requests[job]
            if req.future.done():  # its client left while it waited: it never holds the slots
                del self._requests[job]
                work.extend(self._ws.on_departure(job, now))
                continue
            lease = Lease(lease_id=f"L{job}-{secrets.token_hex(6)}", job=job, chain=req.chain, chain_index=0,
                          epoch=req.epoch, version=self._version, granted_s=now, expires_s=now + req.ttl_s,
                          ttl_s=req.ttl_s, waited_s=now - req.arrival_s, client=req.client, replaces=req.replaces)
            self._leases[lease.lease_id] = lease
            self._by_lease[lease.lease_id] = job
            self.counters.granted += 1
            self.wait_hist.observe(lease.waited_s)
            req.future.set_result(lease)

    # ---- the LeaseManager API ---------------------------------------------------------------------------------

    async def acquire(self, *, timeout_s: float, ttl_s: float | None = None, client: str | None = None,
                      replaces: str | None = None, resume_job: int | None = None,
                      request_id: str | None = None) -> Lease:
        """Route and commit the request, then wait (at most timeout_s) until it may start on its route.

        BPRR has no failover of its own, so a replacement (``resume_job``) is routed like a new request; nor is its
        state kept across restarts, so ``request_id`` (a retry's handle) is accepted and not looked up."""
        if self.queue_length() >= self.max_waiting:
            raise QueueFullError(f"{self.queue_length()} requests already wait (max_waiting={self.max_waiting})")
        if self._ws is None:
            raise LeaseTimeoutError("WS-RR: no placement yet (no composition)")
        job = self._next_job
        self._next_job += 1
        self.counters.requested += 1
        now = self.clock()
        future = asyncio.get_running_loop().create_future()
        req = _Request(job, future, now, ttl_s or self.default_ttl_s, client, replaces)
        self._commit(req, now)
        self._grant(self._ws.start_ready(now), now)
        if not future.done():
            try:
                await asyncio.wait({future}, timeout=timeout_s)
            except asyncio.CancelledError:
                self._give_up(req, cancelled=True)
                raise
        if future.done() and not future.cancelled():
            return future.result()
        self._give_up(req, cancelled=False)
        raise LeaseTimeoutError(f"no route became free within timeout_s={timeout_s:g}")

    def _give_up(self, req: _Request, *, cancelled: bool) -> None:
        """The client is gone: hand back a lease granted meanwhile, or withdraw the request from the FIFO."""
        if req.future.done() and not req.future.cancelled() and req.future.exception() is None:
            self.counters.abandoned += 1
            self._end(req.future.result(), record=False)
            return
        starts: list[int] = []
        now = self.clock()
        if self._ws is not None and req.epoch == self._epoch and self._ws.is_waiting(req.job):
            del self._requests[req.job]
            starts = self._ws.cancel(req.job, now)
        req.future.cancel()
        if cancelled:
            self.counters.cancelled += 1
        else:
            self.counters.timed_out += 1
        self._grant(starts, now)

    def _end(self, lease: Lease, *, record: bool) -> None:
        """A lease ends (released, expired or abandoned): its job departs; start whoever can."""
        now = self.clock()
        self._leases.pop(lease.lease_id, None)
        if record:
            self.service_hist.observe(now - lease.granted_s)
        job = self._by_lease.pop(lease.lease_id, None)
        req = self._requests.pop(job, None) if job is not None else None
        if req is None:
            return
        if self._ws is not None and req.epoch == self._epoch:
            self._grant(self._ws.on_departure(job, now), now)
        else:
            self.counters.orphans_released += 1

    def fail_waiters(self) -> None:
        """Shutdown: wake every waiting request."""
        if self._ws is None:
            return
        for job in self._ws.withdraw_all(self.clock()):
            req = self._requests.pop(job)
            if not req.future.done():
                req.future.set_exception(LeaseTimeoutError("the orchestrator is shutting down"))

    def queue_length(self) -> int:
        """Committed requests not started yet."""
        return self._ws.queue_length() if self._ws is not None else 0

    def queued(self) -> list[tuple[int, float, str | None]]:
        """Waiting requests in commit order: (job, seconds waited so far, client label)."""
        if self._ws is None:
            return []
        now = self.clock()
        return [(j, now - self._requests[j].arrival_s, self._requests[j].client) for j in self._ws.queued_jobs()]

    def free_capacity(self) -> int:
        """Free cache slots (block-jobs) over all servers of the placement."""
        return int(self._ws.free.sum()) if self._ws is not None else 0

    def snapshot(self) -> LeaseSnapshot:
        """Per server of the placement: slots in use and M̃_j (reported as one 'chain' per server)."""
        if self._graph is None or self._ws is None:
            return LeaseSnapshot(self._version, 0, len(self._leases), 0, [], [], [])
        caps = [int(x) for x in self._graph.local_slots]
        used = self._ws.occupancy()
        chains = [ChainInfo((Hop(n, int(a) - 1, int(e) - 1),), c, 1.0, f"server.{n}")
                  for n, a, e, c in zip(self._names, self._graph.first, self._graph.end, caps)]
        return LeaseSnapshot(self._version, self._ws.queue_length(), len(self._leases), 0, used, caps, chains)
