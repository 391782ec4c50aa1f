"""Keep an orchestrator's state across its own restart: restore it from a StateStore, then journal every change.

:meth:`Persistence.restore` loads the store into a fresh Orchestrator (the servers as they were, so the recomputed
composition is the one the swarm serves; the leases still held; the queue in its order) and makes the lease manager
and the orchestrator write each change through. What the store does not hold comes back from the swarm: liveness and
served spans from heartbeats, lease expiry clocks from renewals (docs/orchestrator.md, "Restart").

:class:`GroupCommit` batches the writes: a thread commits everything written since its last commit in one
transaction while the event loop goes on, and the API answers a request only once what it changed is committed
(``Persistence.durable``), so no client ever holds a lease the store does not know.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Protocol

from petals_chain.orchestrator.engine.chains import ChainInfo
from petals_chain.orchestrator.leasing.leases import Lease, _Waiter
from petals_chain.orchestrator.state.registry import Assignment, ServerRecord
from petals_chain.orchestrator.state.store import (
    Statements,
    StateStore,
    StoredLease,
    StoredServer,
    StoredWaiter,
    StoreError,
)
from petals_chain.protocol.hop import Hop

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from petals_chain.model import ServerSpec
    from petals_chain.orchestrator.leasing.leases import LeaseManager
    from petals_chain.orchestrator.state.registry import Registry
    from petals_chain.orchestrator.trust.auth import Guard

log = logging.getLogger(__name__)


class Restorable(Protocol):
    """What persistence restores into and journals from (the engine satisfies it; this module never imports it)."""

    registry: Registry
    leases: LeaseManager
    pinned: Mapping[str, ServerSpec]
    clock: Callable[[], float]

    def recompose_now(self, keep_held: bool = False) -> int:
        """Recompose synchronously for the restored servers; return the version installed."""


def _stored_server(rec: ServerRecord) -> StoredServer:
    """A registry record as the store keeps it."""

    def span(a: Assignment | None) -> tuple[int, int, int] | None:
        return None if a is None else (a.start, a.end, a.version)

    stated = rec.max_batch_sessions is not None  # registered itself, saying what it enforces
    facts = {"batch_slowdown": list(rec.batch_slowdown), "max_batch_sessions": rec.max_batch_sessions,
             "device": rec.device} if stated else None
    return StoredServer(rec.name, rec.memory_bytes, rec.tau_p_s, rec.tau_c_s, rec.peer_id, rec.address,
                        rec.last_heartbeat_s is None, rec.alive, rec.dead_reason, span(rec.assignment),
                        span(rec.previous_assignment), facts)


def _stored_lease(lease: Lease) -> StoredLease:
    """A lease as the store keeps it."""
    return StoredLease(lease.lease_id, lease.job, lease.request_id, chain_json(lease.chain), lease.version,
                       lease.ttl_s, lease.waited_s, lease.client, lease.replaces)


def chain_json(chain: ChainInfo) -> dict:
    """A chain as the store keeps it with a lease: hops, capacity, service time, id."""
    return {"spans": [list(k) for k in chain.key], "capacity": chain.capacity,
            "service_time_s": chain.service_time_s, "chain_id": chain.chain_id}


def chain_from_json(d: dict) -> ChainInfo:
    """The ChainInfo of a stored lease (matched to the offered chains by its hops, as after any recomposition)."""
    spans = tuple(Hop(str(s), int(a), int(b)) for s, a, b in d["spans"])
    return ChainInfo(spans, int(d["capacity"]), float(d["service_time_s"]), str(d["chain_id"]))


class GroupCommit:
    """Commits a store's writes in batches from a worker thread, in order; ``durable()`` waits for the ones so far."""

    def __init__(self, store: StateStore) -> None:
        self.store = store
        self._pending: Statements = []
        self._written = 0  # writes handed over so far
        self._committed = 0  # writes committed so far
        self._flusher: asyncio.Task | None = None
        self.commits = 0
        store.sink = self.add

    def add(self, statements: Statements) -> None:
        """Take one write (on the event loop); a commit of it starts soon."""
        self._pending.extend(statements)
        self._written += 1
        if self._flusher is None:
            self._flusher = asyncio.get_running_loop().create_task(self._flush())

    async def _flush(self) -> None:
        """Commit batch after batch until nothing is pending (one worker thread at a time)."""
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                batch, upto = self._pending, self._written
                self._pending = []
                try:
                    await loop.run_in_executor(None, self.store.commit, batch)
                except BaseException:
                    self._pending = batch + self._pending  # not committed: the next flush tries it again
                    raise
                self._committed = upto
                self.commits += 1
        finally:
            self._flusher = None

    async def durable(self) -> None:
        """Return once every write handed over before this call is committed."""
        target = self._written
        while self._committed < target:
            flusher = self._flusher
            if flusher is None:  # a commit failed (the error went to its waiter): try again
                self._flusher = flusher = asyncio.get_running_loop().create_task(self._flush())
            await asyncio.shield(flusher)

    async def drain(self) -> None:
        """Commit what is pending and stop taking writes (before closing the store)."""
        await self.durable()
        self.store.sink = None


class Persistence:
    """The journal of one orchestrator: every lease, queue and registry change goes to the store as it happens.

    Built on a store before the orchestrator (its stored named values, e.g. the DHT's addresses, are read at once)
    and handed to it, which binds it; :meth:`restore` then loads the store into the orchestrator and starts the
    journal. With ``group_commit`` writes are batched (:class:`GroupCommit`) and :meth:`durable` waits for them;
    without, each write is committed as it is made.
    """

    def __init__(self, store: StateStore, *, group_commit: bool = True) -> None:
        self.store = store
        self._loaded = store.load()
        self.meta: dict[str, str] = dict(self._loaded.meta)  # the stored named values as loaded at the restart
        self.group_commit = group_commit
        self.group: GroupCommit | None = None
        self.attached = False  # journaling (from restore() until detach())

    def bind(self, orch: Restorable) -> None:
        """Serve ``orch`` (its constructor calls this once)."""
        self.orch = orch

    # ---- the orchestrator's hooks ---------------------------------------------------------------

    def on_change(self) -> None:
        """After a registration or a recomposition: save the registry (once journaling)."""
        if self.attached:
            self.save_registry()

    async def durable(self) -> None:
        """Return once what was written so far is committed (at once without group commit)."""
        if self.group is not None:
            await self.group.durable()

    # ---- LeaseJournal ---------------------------------------------------------------------------

    def queued(self, w: _Waiter, next_job: int) -> None:
        """A request waits: keep its place in line."""
        arrival = time.time() - (self.orch.clock() - w.arrival_s)
        self.store.queued(StoredWaiter(w.job, w.request_id, w.ttl_s, w.client, w.replaces, arrival), next_job)

    def left_queue(self, job: int) -> None:
        """A waiting request gave up."""
        self.store.left_queue(job)

    def granted(self, lease: Lease, next_job: int) -> None:
        """A lease was granted (its request leaves the queue in the same transaction)."""
        self.store.granted(_stored_lease(lease), next_job)

    def renewed(self, lease: Lease) -> None:
        """A renewal changed the TTL."""
        self.store.renewed(lease.lease_id, lease.ttl_s)

    def ended(self, lease: Lease) -> None:
        """A lease ended."""
        self.store.ended(lease.lease_id)

    # ---- server secrets and evictions (auth.SecretJournal) ----------------------------------------

    def keep_guard(self, guard: Guard) -> None:
        """Give ``guard`` the secrets (salted hashes) and evictions kept before the restart, and keep its changes."""
        guard.keep(self, self._loaded.secrets, self._loaded.banned)
        if self._loaded.secrets or self._loaded.banned:
            log.warning("restored %d server secrets (salted hashes) and %d evictions from %s",
                        len(self._loaded.secrets), len(self._loaded.banned), self.store.path)

    def secret_stored(self, name: str, hashed: str) -> None:
        """A server got a new secret: keep its salted hash."""
        self.store.put_secret(name, hashed)

    def secret_revoked(self, name: str) -> None:
        """A server's secret was revoked."""
        self.store.delete_secret(name)

    def ban_changed(self, name: str, reason: str | None) -> None:
        """An eviction (or its end)."""
        self.store.set_banned(name, reason)

    # ---- registry -------------------------------------------------------------------------------

    def save_registry(self) -> None:
        """Every server record and the composition version (after a registration or a recomposition)."""
        reg = self.orch.registry
        self.store.put_servers([_stored_server(r) for r in reg.servers.values()], {"version": str(reg.version)})

    def detach(self) -> None:
        """Stop journaling (a clean shutdown: waiters woken then are not taken out of the stored queue)."""
        if self.attached:
            self.orch.leases.journal = None
        self.attached = False

    async def close(self) -> None:
        """Stop journaling, commit what is pending and close the store."""
        self.detach()
        if self.group is not None:
            await self.group.drain()
            self.group = None
        self.store.close()

    def restore(self, *, attach_grace_s: float) -> None:
        """Restore the bound orchestrator (fresh, on a running event loop) from the store and journal into it from
        now on.

        Restored servers count as heard from now (a dead one is expired by the heartbeat timeout as usual) and serve
        nothing until their heartbeats say so; restored leases expire one TTL from now unless renewed; restored
        waiting requests keep their order and are dropped after ``attach_grace_s`` unless their clients come back
        for them (POST /lease with the same request_id).
        """
        asyncio.get_running_loop()  # the waiters' futures need it
        orch, store, state = self.orch, self.store, self._loaded
        reg = orch.registry
        now = orch.clock()
        if state.servers:
            # σ and τp(b): what the server stated when it registered (stored), else the cluster file this
            # orchestrator was started with; a pinned server keeps the file's, as before the restart
            serial = {name: (rec.serial_fraction, rec.batch_slowdown) for name, rec in reg.servers.items()}
            serial |= {s.name: (0.0, tuple(s.facts["batch_slowdown"])) for s in state.servers if s.facts}
            serial |= {name: (spec.serial_fraction, spec.batch_slowdown) for name, spec in orch.pinned.items()}
            reg.servers.clear()
            for s in state.servers:
                facts = s.facts or {}
                rec = ServerRecord(s.name, s.memory_bytes, s.tau_p_s, s.tau_c_s, s.peer_id, s.address,
                                   None if s.planned else now, s.alive, s.dead_reason,
                                   serial_fraction=serial.get(s.name, (0.0, ()))[0],
                                   batch_slowdown=serial.get(s.name, (0.0, ()))[1],
                                   max_batch_sessions=facts.get("max_batch_sessions"), device=facts.get("device"))
                if s.assignment is not None:
                    rec.assignment = Assignment(s.name, *s.assignment)
                if s.previous_assignment is not None:
                    rec.previous_assignment = Assignment(s.name, *s.previous_assignment)
                reg.servers[s.name] = rec
            reg.version = max(reg.version, int(state.meta.get("version", "0")))
            reg.generation += 1
            orch.recompose_now(keep_held=True)  # what the swarm served before the restart, unless worse
        leases = []
        for x in state.leases:
            if x.ttl_s <= 0:
                raise StoreError(f"{store.path}: lease {x.lease_id} has ttl_s {x.ttl_s}")
            leases.append(Lease(x.lease_id, x.job, chain_from_json(x.chain), None, -1, x.version, now,
                                now + x.ttl_s, x.ttl_s, x.waited_s, x.client, x.replaces, x.request_id))
        loop = asyncio.get_running_loop()
        waiters = [
            _Waiter(w.job, loop.create_future(), now - max(0.0, time.time() - w.arrival_unix_s), w.ttl_s, w.client,
                    w.replaces, w.request_id, now + attach_grace_s)
            for w in state.waiting
        ]
        orch.leases.restore(leases, waiters, int(state.meta.get("next_job", "0")))
        if self.group_commit:
            self.group = GroupCommit(store)
        orch.leases.journal = self
        self.attached = True
        self.save_registry()
        # Restoring may already have granted slots to restored requests (chains offered at once): store the result.
        lm = orch.leases
        now_unix = time.time()
        store.replace_leases_and_queue(
            [_stored_lease(x) for x in lm.leases()],
            [StoredWaiter(w.job, w.request_id, w.ttl_s, w.client, w.replaces, now_unix - (now - w.arrival_s))
             for w in waiters if w.job in lm._waiting],
            lm._next_job)
        if state.servers or leases or waiters:
            log.warning("restored from %s: %d servers, %d leases, %d waiting requests (composition v%d)", store.path,
                        len(state.servers), len(leases), len(waiters), reg.version)
