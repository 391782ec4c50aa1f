"""Leases over server chains, dispatched by JFFC with one central FIFO queue.

A lease is one JFFC job: it holds one slot of one chain from the moment it is
granted until it is released, expires (its client stopped renewing), or is
replaced after a reported failure. Waiting requests are asyncio futures kept in
arrival order by the policy's queue; a request whose client gives up is taken
out of that queue, so no slot is ever handed to nobody and capacity never leaks.

One module although it is long: LeaseManager is one state machine (every method changes the waiting map, the policy
and the leases together, and WsRrLeaseManager overrides its internals), and the small records around it (Lease,
LeaseCounters, TimeHistogram, LeaseSnapshot) are made and read through it alone.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import secrets
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

from petals_chain import defaults
from petals_chain.dispatch.base import Start
from petals_chain.model import Composition, SpecError
from petals_chain.orchestrator.engine.chains import ChainInfo
from petals_chain.orchestrator.leasing.policy import JFFC_POLICY, ChainDispatcher, LeaseCapabilities, LeasePolicy
from petals_chain.orchestrator.leasing.recent import RecentLeases

# Histogram bucket upper bounds (seconds) for waiting and lease-held times.
TIME_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)


class UnknownLeaseError(KeyError):
    """A request names a lease that does not exist (never granted, released or expired)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown lease"


class LeaseTimeoutError(TimeoutError):
    """No chain became free within the time the client was willing to wait."""


class QueueFullError(RuntimeError):
    """The central queue already holds the maximum number of waiting requests."""


class TimeHistogram:
    """Counts of durations in seconds per bucket (the last one open-ended), with their sum: a Prometheus histogram
    once :mod:`petals_chain.orchestrator.engine.metrics` makes the counts cumulative."""

    def __init__(self, buckets_s: Sequence[float] = TIME_BUCKETS_S) -> None:
        self.buckets_s = tuple(sorted(buckets_s))
        self.counts = [0] * (len(self.buckets_s) + 1)  # last one: +Inf
        self.sum_s = 0.0
        self.count = 0

    def observe(self, value_s: float) -> None:
        """Add one observation."""
        i = 0
        while i < len(self.buckets_s) and value_s > self.buckets_s[i]:
            i += 1
        self.counts[i] += 1
        self.sum_s += value_s
        self.count += 1


@dataclass
class LeaseCounters:
    """Monotone event counts, exported as Prometheus counters."""

    requested: int = 0
    granted: int = 0
    released: int = 0
    expired: int = 0
    abandoned: int = 0  # granted while the client was already gone: handed straight back
    cancelled: int = 0  # client gave up (disconnect) while waiting
    timed_out: int = 0  # waited past its timeout_s
    failed: int = 0  # released because the client reported a failed server
    orphans_released: int = 0  # released leases whose chain no longer existed


@dataclass
class Lease:
    """One granted slot on one chain; ``chain_index`` is None once its chain left the composition."""

    lease_id: str
    job: int
    chain: ChainInfo
    chain_index: int | None
    epoch: int
    version: int
    granted_s: float
    expires_s: float
    ttl_s: float
    waited_s: float
    client: str | None = None
    replaces: str | None = None
    request_id: str | None = None  # the client's handle for its request: a retry of it finds this lease

    @property
    def chain_id(self) -> str:
        """The id of the chain it was granted on."""
        return self.chain.chain_id


@dataclass
class _Waiter:
    """A request waiting for a slot: its future is resolved with the Lease when one is granted."""

    job: int
    future: asyncio.Future
    arrival_s: float
    ttl_s: float
    client: str | None
    replaces: str | None
    request_id: str | None = None
    attach_by_s: float | None = None  # restored after a restart: dropped unless its client re-attaches by then


class LeaseJournal(Protocol):
    """Where a LeaseManager records what must survive a restart (:mod:`petals_chain.orchestrator.state.persist`)."""

    def queued(self, w: _Waiter, next_job: int) -> None:
        """A request waits in the queue."""

    def left_queue(self, job: int) -> None:
        """A waiting request gave up."""

    def granted(self, lease: Lease, next_job: int) -> None:
        """A request got its lease (and left the queue)."""

    def renewed(self, lease: Lease) -> None:
        """A lease's TTL changed."""

    def ended(self, lease: Lease) -> None:
        """A lease ended (released, expired, abandoned, replaced)."""


@dataclass
class LeaseSnapshot:
    """Gauges at one instant, for /health, /chains and /metrics."""

    version: int
    queue_length: int
    active: int
    orphaned: int
    occupancy: list[int]
    capacities: list[int]
    chains: list[ChainInfo] = field(default_factory=list)


class LeaseManager:
    """Grants, renews, releases and expires leases; its policy (JFFC by default) picks the chain, a FIFO queue holds
    the rest."""

    capabilities: ClassVar[LeaseCapabilities] = LeaseCapabilities()  # slots of fixed chains, nothing more

    def __init__(
        self,
        *,
        policy: LeasePolicy = JFFC_POLICY,
        default_ttl_s: float = defaults.LEASE_TTL_S,
        max_waiting: int = defaults.MAX_WAITING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (isinstance(default_ttl_s, (int, float)) and math.isfinite(default_ttl_s) and default_ttl_s > 0):
            raise SpecError(f"leases: field 'default_ttl_s' must be a finite number > 0, got {default_ttl_s!r}")
        if isinstance(max_waiting, bool) or not isinstance(max_waiting, int) or max_waiting < 0:
            raise SpecError(f"leases: field 'max_waiting' must be an integer >= 0, got {max_waiting!r}")
        self.policy = policy  # which chain a waiting request gets (lease_policy.py)
        self.default_ttl_s = default_ttl_s
        self.max_waiting = max_waiting
        self.clock = clock
        self.counters = LeaseCounters()
        self.wait_hist = TimeHistogram()
        self.service_hist = TimeHistogram()
        self.recent = RecentLeases()  # the last leases that ended, one by one, for the live page
        self._policy: ChainDispatcher | None = None  # the policy's decision over the chains offered now
        self._chains: list[ChainInfo] = []
        self._version = 0
        self._epoch = 0
        self._leases: dict[str, Lease] = {}
        self._waiting: dict[int, _Waiter] = {}
        self._parked: deque[int] = deque()  # jobs waiting while there are no chains at all
        self._next_job = 0
        self.journal: LeaseJournal | None = None  # set when the orchestrator keeps its state across restarts
        self._lease_by_request: dict[str, str] = {}  # request id -> lease id
        self._restored_by_request: dict[str, int] = {}  # request id -> job of a restored, not re-attached waiter

    # ---- chains ---------------------------------------------------------------------------------

    def set_chains(self, chains: Sequence[ChainInfo] | None, version: int) -> None:
        """Switch to a new set of chains (a recomposition); keep leases and the waiting order.

        A lease whose chain (same servers, same spans) is still there keeps a slot of it; one whose
        chain is gone stays valid until released but its slot is never offered again. Waiting
        requests are offered the new chains in their original arrival order.
        """
        waiting = sorted(list(self._policy.queued_jobs() if self._policy else []) + list(self._parked))
        self._parked.clear()
        self._epoch += 1
        self._version = version
        self._chains = list(chains or [])
        self._policy = self._new_policy() if self._chains else None
        index = {}
        for k, c in enumerate(self._chains):
            index.setdefault(c.key, k)
        for lease in sorted(self._leases.values(), key=lambda x: x.job):
            k = index.get(lease.chain.key)
            if self._policy is not None and k is not None and self._carry(k, lease):
                lease.chain_index, lease.epoch = k, self._epoch
            else:
                lease.chain_index = None
        now = self.clock()
        for job in waiting:
            if self._policy is None:
                self._parked.append(job)
            else:
                self._start_all(self._policy.on_arrival(job, now), now)

    def set_composition(self, composition: Composition | None, version: int) -> None:
        """Told each composition installed; a manager that routes over the placement (``capabilities``) uses it, one
        that offers fixed chains gets them through :meth:`set_chains` instead."""

    def _new_policy(self) -> ChainDispatcher:
        """The policy's dispatcher over the chains offered now (JFFC by default; a migrating manager may pack)."""
        return self.policy.dispatcher([c.rate_per_s for c in self._chains], [c.capacity for c in self._chains])

    def _carry(self, k: int, lease: Lease) -> bool:
        """A lease carried over a recomposition takes a slot of its chain, index ``k`` now; False if full."""
        return self._policy.occupy(k)

    @property
    def version(self) -> int:
        """Version of the composition whose chains are offered now."""
        return self._version

    @property
    def chains(self) -> list[ChainInfo]:
        """The chains offered now, in JFFC index order."""
        return list(self._chains)

    # ---- leasing --------------------------------------------------------------------------------

    async def acquire(
        self,
        *,
        timeout_s: float,
        ttl_s: float | None = None,
        client: str | None = None,
        replaces: str | None = None,
        resume_job: int | None = None,
        request_id: str | None = None,
    ) -> Lease:
        """Wait (at most timeout_s) for a slot on the fastest free chain and return the lease.

        ``resume_job`` (the job of a lease whose chain broke) keeps that job's place in line: it takes a
        free chain at once or waits ahead of every request that arrived after it, never behind them.
        ``request_id`` (the client's handle, the same on its retries) finds the lease already granted to that
        request, or the place in line it held before a restart, instead of queueing it again.
        Raises LeaseTimeoutError after timeout_s and QueueFullError when too many already wait;
        if the calling task is cancelled (the client went away) the request leaves the queue.
        """
        if request_id is not None:
            held = self._lease_by_request.get(request_id)
            if held is not None and held in self._leases:
                return self._leases[held]
            job = self._restored_by_request.pop(request_id, None)
            if job is not None and job in self._waiting:
                w = self._waiting[job]
                w.attach_by_s = None  # its client is back: it waits like any request
                return await self._await(w, timeout_s)
        if resume_job is None and len(self._waiting) >= self.max_waiting:
            raise QueueFullError(f"{len(self._waiting)} requests already wait (max_waiting={self.max_waiting})")
        if resume_job is not None and (resume_job in self._waiting or resume_job >= self._next_job
                                       or any(x.job == resume_job for x in self._leases.values())):
            raise ValueError(f"job {resume_job} cannot resume: it is unknown, waiting or still holds a lease")
        now = self.clock()
        if resume_job is None:
            job = self._next_job
            self._next_job += 1
        else:
            job = resume_job
        self.counters.requested += 1
        w = _Waiter(job, asyncio.get_running_loop().create_future(), now, ttl_s or self.default_ttl_s, client, replaces,
                    request_id)
        self._waiting[job] = w
        if self._policy is None:
            bisect.insort(self._parked, job)
        elif resume_job is not None:
            self._start_all(self._policy.on_resume(job, now), now)
        else:
            self._start_all(self._policy.on_arrival(job, now), now)
        if self.journal is not None and not w.future.done():
            self.journal.queued(w, self._next_job)
        return await self._await(w, timeout_s)

    async def _await(self, w: _Waiter, timeout_s: float) -> Lease:
        """Wait for the waiter's grant (at most timeout_s); leave the queue on timeout or cancellation."""
        if not w.future.done():
            try:
                await asyncio.wait({w.future}, timeout=timeout_s)
            except asyncio.CancelledError:
                self._abandon(w, cancelled=True)
                raise
        if w.future.done() and not w.future.cancelled():
            return w.future.result()
        self._abandon(w, cancelled=False)
        raise LeaseTimeoutError(f"no chain became free within timeout_s={timeout_s:g}")

    def _abandon(self, w: _Waiter, *, cancelled: bool) -> None:
        """The waiter's client is gone: return a slot granted meanwhile, or leave the queue."""
        if w.future.done() and not w.future.cancelled() and w.future.exception() is None:
            lease: Lease = w.future.result()
            self.counters.abandoned += 1
            self._end(lease, record=False)
            return
        if self._waiting.pop(w.job, None) is not None and self.journal is not None:
            self.journal.left_queue(w.job)
        if w.request_id is not None:
            self._restored_by_request.pop(w.request_id, None)
        if not (self._policy is not None and self._policy.cancel(w.job)):
            try:
                self._parked.remove(w.job)
            except ValueError:
                pass
        w.future.cancel()
        if cancelled:
            self.counters.cancelled += 1
        else:
            self.counters.timed_out += 1

    def _start_all(self, starts: list[Start], now: float) -> None:
        """Grant the slots the policy handed out; a slot handed to a vanished waiter goes back."""
        work = list(starts)
        while work:
            st = work.pop()
            w = self._waiting.pop(st.job, None)
            if w is None or w.future.done():
                assert self._policy is not None
                work.extend(self._policy.on_departure(st.job, st.chain, now))
                continue
            chain = self._chains[st.chain]
            waited = now - w.arrival_s
            lease = Lease(
                lease_id=f"L{st.job}-{secrets.token_hex(6)}",  # unguessable handle, not a model input
                job=st.job,
                chain=chain,
                chain_index=st.chain,
                epoch=self._epoch,
                version=self._version,
                granted_s=now,
                expires_s=now + w.ttl_s,
                ttl_s=w.ttl_s,
                waited_s=waited,
                client=w.client,
                replaces=w.replaces,
                request_id=w.request_id,
            )
            self._leases[lease.lease_id] = lease
            if w.request_id is not None:
                self._lease_by_request[w.request_id] = lease.lease_id
                self._restored_by_request.pop(w.request_id, None)
            if self.journal is not None:
                self.journal.granted(lease, self._next_job)
            self.counters.granted += 1
            self.wait_hist.observe(waited)
            w.future.set_result(lease)

    def get(self, lease_id: str) -> Lease:
        """The active lease with this id, or UnknownLeaseError."""
        lease = self._leases.get(lease_id)
        if lease is None:
            raise UnknownLeaseError(f"unknown lease {lease_id!r} (never granted, already released, or expired)")
        return lease

    def has(self, lease_id: str) -> bool:
        """Whether a lease with this id is active."""
        return lease_id in self._leases

    def renew(self, lease_id: str, ttl_s: float | None = None) -> Lease:
        """Extend a lease: it now expires ttl_s (default: its own TTL) from now."""
        lease = self.get(lease_id)
        if ttl_s is not None and ttl_s != lease.ttl_s:
            lease.ttl_s = ttl_s
            if self.journal is not None:
                self.journal.renewed(lease)
        lease.expires_s = self.clock() + lease.ttl_s
        return lease

    def release(self, lease_id: str, *, failed: bool = False) -> Lease:
        """End a lease; its slot goes to the head of the queue (or back to the free chains)."""
        lease = self.get(lease_id)
        if failed:
            self.counters.failed += 1
        else:
            self.counters.released += 1
        self.recent.add(lease, self.clock(), "failed" if failed else "released")
        self._end(lease, record=True)
        return lease

    def _end(self, lease: Lease, *, record: bool) -> None:
        """Drop the lease and free its slot if its chain is still offered."""
        now = self.clock()
        if self._leases.pop(lease.lease_id, None) is not None and self.journal is not None:
            self.journal.ended(lease)
        if lease.request_id is not None and self._lease_by_request.get(lease.request_id) == lease.lease_id:
            del self._lease_by_request[lease.request_id]
        if record:
            self.service_hist.observe(now - lease.granted_s)
        if lease.chain_index is None or lease.epoch != self._epoch or self._policy is None:
            self.counters.orphans_released += 1
            return
        self._start_all(self._policy.on_departure(lease.job, lease.chain_index, now), now)

    def expire_due(self, now: float | None = None) -> list[Lease]:
        """Release every lease whose client stopped renewing it; return them."""
        now = self.clock() if now is None else now
        due = [x for x in self._leases.values() if x.expires_s <= now]
        for lease in due:
            self.counters.expired += 1
            self.recent.add(lease, now, "expired")
            self._end(lease, record=True)
        for w in [x for x in self._waiting.values() if x.attach_by_s is not None and x.attach_by_s <= now]:
            self._abandon(w, cancelled=True)  # restored, and its client never came back for it
        return due

    def restore(self, leases: Sequence[Lease], waiters: Sequence[_Waiter], next_job: int) -> None:
        """Take back the leases and the queue kept across a restart (into an empty manager, on the event loop).

        Leases take their chains' slots first (by job, when their chains are offered again), then the waiting
        requests are offered the chains in their original order; the journal is not written for any of this.
        """
        if self._leases or self._waiting:
            raise RuntimeError("restore() needs a lease manager with no leases and no waiting requests")
        journal, self.journal = self.journal, None
        try:
            for lease in leases:
                lease.chain_index, lease.epoch = None, -1
                self._leases[lease.lease_id] = lease
                if lease.request_id is not None:
                    self._lease_by_request[lease.request_id] = lease.lease_id
            for w in waiters:
                self._waiting[w.job] = w
                self._parked.append(w.job)
                if w.request_id is not None:
                    self._restored_by_request[w.request_id] = w.job
            jobs = [x.job for x in leases] + [w.job for w in waiters]
            self._next_job = max([next_job, self._next_job, *(j + 1 for j in jobs)])
            self.set_chains(self._chains or None, self._version)
        finally:
            self.journal = journal

    def next_expiry_in_s(self) -> float:
        """Seconds until the earliest lease expires (inf if none)."""
        if not self._leases:
            return math.inf
        return min(x.expires_s for x in self._leases.values()) - self.clock()

    def fail_waiters(self) -> None:
        """Shutdown: wake every waiting request with a timeout error."""
        for w in list(self._waiting.values()):
            if not w.future.done():
                w.future.set_exception(LeaseTimeoutError("the orchestrator is shutting down"))
        self._waiting.clear()
        self._parked.clear()

    # ---- views ----------------------------------------------------------------------------------

    def leases(self) -> list[Lease]:
        """Active leases, oldest first."""
        return sorted(self._leases.values(), key=lambda x: x.job)

    def queued(self) -> list[tuple[int, float, str | None]]:
        """Waiting requests head first: (job, seconds waited so far, client label)."""
        now = self.clock()
        jobs = list(self._policy.queued_jobs() if self._policy else []) + list(self._parked)
        return [(j, now - self._waiting[j].arrival_s, self._waiting[j].client) for j in jobs if j in self._waiting]

    def queue_length(self) -> int:
        """Requests waiting now (in the JFFC queue or parked without chains)."""
        return (self._policy.queue_length() if self._policy else 0) + len(self._parked)

    def snapshot(self) -> LeaseSnapshot:
        """Queue length, active and orphaned leases, per-chain occupancy and capacity."""
        occ = self._policy.occupancy() if self._policy else []
        orphaned = sum(1 for x in self._leases.values() if x.chain_index is None)
        return LeaseSnapshot(
            version=self._version,
            queue_length=self.queue_length(),
            active=len(self._leases),
            orphaned=orphaned,
            occupancy=occ,
            capacities=[c.capacity for c in self._chains],
            chains=list(self._chains),
        )

    def free_capacity(self) -> int:
        """Slots free right now across all offered chains."""
        if self._policy is None:
            return 0
        return sum(c - b for c, b in zip(self._policy.capacities, self._policy.occupancy()))

    def describe(self, lease: Lease) -> dict[str, Any]:
        """The parts of a lease that do not depend on the registry (timing and chain id)."""
        return {
            "lease_id": lease.lease_id,
            "chain_id": lease.chain_id,
            "version": lease.version,
            "ttl_s": lease.ttl_s,
            "expires_in_s": max(0.0, lease.expires_s - self.clock()),
            "waited_s": lease.waited_s,
            "replaces": lease.replaces,
            "current": lease.chain_index is not None,
        }
