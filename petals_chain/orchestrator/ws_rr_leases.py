"""BPRR's WS-RR routing as an orchestrator lease manager: a route per request over the placement, cache-aware.

A drop-in for :class:`~petals_chain.orchestrator.leases.LeaseManager` (same API, used by the orchestrator
app) that ignores fixed chains. Per lease request, on arrival, it runs Dijkstra over the
placement's feasible-edge DAG with edge cost ``w_j(m) + τc_j + τp_j·m``, where ``w_j(m)`` is the
believed wait until ``m`` of server j's ``M̃_j`` cache slots are free (Sun et al., Performance
Evaluation 2025), and commits the request to that route at once. The scheduler does not know job
sizes: it believes each job ends ``T_route`` after it starts (learning real starts and ends as they
happen), exactly as :func:`petals_chain.sim.baselines.simulate_bprr` with ``estimate="mean"``. A
committed request is granted its lease when it heads the FIFO of committed requests at each of
its servers and every one has ``m_ij`` free slots; its slots are taken only then.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from petals_chain import defaults
from petals_chain.model import Composition, InfeasibleError
from petals_chain.orchestrator.leases import Lease, LeaseManager, LeaseSnapshot, LeaseTimeoutError, QueueFullError
from petals_chain.orchestrator.chains import ChainInfo, SpanInfo


@dataclass
class _Committed:
    """A request committed to a route: hops (local server, blocks), the slots it owns, its future and times."""

    job: int
    hops: list[tuple[int, int]]
    slots: list[np.ndarray]
    route_s: float
    chain: ChainInfo
    future: asyncio.Future
    arrival_s: float
    ttl_s: float
    client: str | None
    replaces: str | None
    started: bool = False
    epoch: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class WsRrLeaseManager(LeaseManager):
    """Leases whose chain is a per-request WS-RR route over the current placement (see the module docstring)."""

    def __init__(self, *, default_ttl_s: float = defaults.LEASE_TTL_S, max_waiting: int = defaults.MAX_WAITING,
                 clock: Callable[[], float] | None = None) -> None:
        kwargs: dict[str, Any] = {"default_ttl_s": default_ttl_s, "max_waiting": max_waiting}
        if clock is not None:
            kwargs["clock"] = clock
        super().__init__(**kwargs)
        self._graph = None
        self._names: list[str] = []
        self._belief = np.zeros((0, 0))
        self._owner = np.zeros((0, 0), dtype=np.int64)
        self._free = np.zeros(0, dtype=np.int64)
        self._committed: dict[int, _Committed] = {}  # job -> request (waiting or in service)
        self._fifo: list[int] = []  # committed jobs not started, in commit order
        self._by_lease: dict[str, int] = {}

    # ---- the placement ----------------------------------------------------------------------------------------

    def set_composition(self, composition: Composition | None, version: int) -> None:
        """Route over ``composition``'s placement from now on (M̃_j slots per server); earlier routes keep theirs."""
        from petals_chain.sim.baselines import RouteGraph

        self._version = version
        self._epoch += 1
        if composition is None:
            self._graph = None
            self._fail_waiting("no placement to route over")
            return
        graph = RouteGraph.build(composition.servers, composition.model, composition.placement)
        k = graph.index.size
        width = int(max(graph.local_slots.max(initial=0), 1))
        self._graph = graph
        self._names = [composition.servers[int(j)].name for j in graph.index]
        self._belief = np.full((k, width), np.inf)
        self._owner = np.full((k, width), -1, dtype=np.int64)
        for q in range(k):
            self._belief[q, : graph.local_slots[q]] = 0.0
        self._free = graph.local_slots.copy()
        # Requests routed on the old placement and not started yet are routed again, in their order.
        waiting = [self._committed.pop(j) for j in list(self._fifo)]
        self._fifo.clear()
        for req in waiting:
            self._commit(req.job, req.future, req.arrival_s, req.ttl_s, req.client, req.replaces)
        self._try_start(self.clock())

    def set_chains(self, chains: Any, version: int) -> None:
        """Fixed chains do not apply to WS-RR (routes are per request); only the version is kept."""
        self._version = version

    # ---- routing ----------------------------------------------------------------------------------------------

    def _route(self, now: float) -> tuple[list[tuple[int, int]], float, float]:
        """WS-RR: the min-cost route given the believed slot calendars; (hops, believed start, route time)."""
        assert self._graph is not None
        sorted_belief = np.sort(self._belief, axis=1)
        route = self._graph.route(None, sorted_belief, now)
        if route is None:
            raise InfeasibleError("WS-RR: no route through the placement fits a job")
        local = {int(j): q for q, j in enumerate(self._graph.index)}
        hops = [(local[j], m) for j, m in route]
        start = max([now] + [float(sorted_belief[q, m - 1]) for q, m in hops])
        route_s = float(sum(self._graph.tau_c[q] + self._graph.tau_p[q] * m for q, m in hops))
        return hops, start, route_s

    def _chain_info(self, job: int, hops: list[tuple[int, int]], route_s: float) -> ChainInfo:
        """The route as named PETALS spans (0-indexed, end exclusive): m blocks ending at the server's last one."""
        spans = []
        for q, m in hops:
            end = int(self._graph.end[q]) - 1
            spans.append(SpanInfo(self._names[q], end - m, end))
        return ChainInfo(tuple(spans), 1, route_s, f"v{self._version}.r{job}")

    def _commit(self, job: int, future: asyncio.Future, arrival_s: float, ttl_s: float, client: str | None,
                replaces: str | None) -> _Committed:
        """Route a request now and commit it: best-fit believed slots at every hop, FIFO order at its servers."""
        hops, start, route_s = self._route(self.clock())
        slots = []
        for q, m in hops:
            row = self._belief[q, : self._graph.local_slots[q]]
            ok = np.flatnonzero(row <= start)
            idx = ok[np.argsort(row[ok], kind="stable")[-m:]]
            self._belief[q, idx] = start + route_s
            self._owner[q, idx] = job
            slots.append(idx)
        req = _Committed(job, hops, slots, route_s, self._chain_info(job, hops, route_s), future, arrival_s, ttl_s,
                         client, replaces, epoch=self._epoch)
        self._committed[job] = req
        self._fifo.append(job)
        return req

    def _set_belief(self, req: _Committed, value: float) -> None:
        """Believed end of a request, on the slots it still owns."""
        if req.epoch != self._epoch:
            return
        for (q, _), idx in zip(req.hops, req.slots):
            mine = self._owner[q, idx] == req.job
            self._belief[q, idx[mine]] = value

    def _try_start(self, now: float) -> None:
        """Start committed requests in order: each needs to head its servers' FIFOs and m free slots at each."""
        blocked: set[int] = set()
        still: list[int] = []
        for job in self._fifo:
            req = self._committed[job]
            if any(q in blocked or self._free[q] < m for q, m in req.hops):
                blocked.update(q for q, _ in req.hops)
                still.append(job)
                continue
            if req.future.done():  # its client left while it waited: it never takes the slots
                self._drop(req)
                continue
            for q, m in req.hops:
                self._free[q] -= m
            req.started = True
            self._set_belief(req, now + req.route_s)
            lease = Lease(lease_id=f"L{job}-{secrets.token_hex(6)}", job=job,
                          chain=req.chain, chain_index=0, epoch=req.epoch, version=self._version, granted_s=now,
                          expires_s=now + req.ttl_s, ttl_s=req.ttl_s, waited_s=now - req.arrival_s,
                          client=req.client, replaces=req.replaces)
            self._leases[lease.lease_id] = lease
            self._by_lease[lease.lease_id] = job
            self.counters.granted += 1
            self.wait_hist.observe(lease.waited_s)
            req.future.set_result(lease)
        self._fifo[:] = still

    def _drop(self, req: _Committed) -> None:
        """Forget a request that never started: its believed slots become free again."""
        self._committed.pop(req.job, None)
        self._set_belief(req, self.clock())

    def _fail_waiting(self, reason: str) -> None:
        """Wake every committed-but-not-started request with a timeout error."""
        for job in list(self._fifo):
            req = self._committed.pop(job)
            if not req.future.done():
                req.future.set_exception(LeaseTimeoutError(reason))
        self._fifo.clear()

    # ---- the LeaseManager API ---------------------------------------------------------------------------------

    async def acquire(self, *, timeout_s: float, ttl_s: float | None = None, client: str | None = None,
                      replaces: str | None = None, resume_job: int | None = None) -> Lease:
        """Route and commit the request, then wait (at most timeout_s) until it may start on its route.

        BPRR has no failover of its own, so a replacement (``resume_job``) is routed like a new request."""
        if len(self._fifo) >= self.max_waiting:
            raise QueueFullError(f"{len(self._fifo)} requests already wait (max_waiting={self.max_waiting})")
        if self._graph is None:
            raise LeaseTimeoutError("WS-RR: no placement yet (no composition)")
        job = self._next_job
        self._next_job += 1
        self.counters.requested += 1
        now = self.clock()
        future = asyncio.get_running_loop().create_future()
        req = self._commit(job, future, now, ttl_s or self.default_ttl_s, client, replaces)
        self._try_start(now)
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

    def _give_up(self, req: _Committed, *, cancelled: bool) -> None:
        """The client is gone: hand back a lease granted meanwhile, or leave the FIFO."""
        if req.future.done() and not req.future.cancelled() and req.future.exception() is None:
            self.counters.abandoned += 1
            self._end(req.future.result(), record=False)
            return
        if req.job in self._fifo:
            self._fifo.remove(req.job)
            self._drop(req)
        req.future.cancel()
        if cancelled:
            self.counters.cancelled += 1
        else:
            self.counters.timed_out += 1
        self._try_start(self.clock())

    def _end(self, lease: Lease, *, record: bool) -> None:
        """A lease ends (released, expired or abandoned): free its slots, learn its real end, start who can."""
        now = self.clock()
        self._leases.pop(lease.lease_id, None)
        if record:
            self.service_hist.observe(now - lease.granted_s)
        job = self._by_lease.pop(lease.lease_id, None)
        req = self._committed.pop(job, None) if job is not None else None
        if req is None:
            return
        if req.epoch == self._epoch:
            for q, m in req.hops:
                self._free[q] += m
            self._set_belief(req, now)
        else:
            self.counters.orphans_released += 1
        self._try_start(now)

    def fail_waiters(self) -> None:
        """Shutdown: wake every waiting request."""
        self._fail_waiting("the orchestrator is shutting down")

    def queue_length(self) -> int:
        """Committed requests not started yet."""
        return len(self._fifo)

    def queued(self) -> list[tuple[int, float, str | None]]:
        """Waiting requests in commit order: (job, seconds waited so far, client label)."""
        now = self.clock()
        return [(j, now - self._committed[j].arrival_s, self._committed[j].client) for j in self._fifo]

    def free_capacity(self) -> int:
        """Free cache slots (block-jobs) over all servers of the placement."""
        return int(self._free.sum())

    def snapshot(self) -> LeaseSnapshot:
        """Per server of the placement: slots in use and M̃_j (reported as one 'chain' per server)."""
        if self._graph is None:
            return LeaseSnapshot(self._version, 0, len(self._leases), 0, [], [], [])
        caps = [int(x) for x in self._graph.local_slots]
        used = [c - int(f) for c, f in zip(caps, self._free)]
        chains = [ChainInfo((SpanInfo(n, int(a) - 1, int(e) - 1),), c, 1.0, f"server.{n}")
                  for n, a, e, c in zip(self._names, self._graph.first, self._graph.end, caps)]
        return LeaseSnapshot(self._version, len(self._fifo), len(self._leases), 0, used, caps, chains)
