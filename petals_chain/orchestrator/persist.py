"""Keep an orchestrator's state across its own restart: restore it from a StateStore, then journal every change.

:func:`attach_state` loads the store into a fresh Orchestrator (the servers as they were, so the recomputed
composition is the one the swarm serves; the leases still held; the queue in its order) and makes the lease manager
and the orchestrator write each change through. What the store does not hold comes back from the swarm: liveness and
served spans from heartbeats, lease expiry clocks from renewals (docs/orchestrator.md, "Restart").
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from petals_chain.orchestrator.chains import ChainInfo, SpanInfo
from petals_chain.orchestrator.core import Orchestrator
from petals_chain.orchestrator.leases import Lease, _Waiter
from petals_chain.orchestrator.registry import Assignment, ServerRecord
from petals_chain.orchestrator.store import StateStore, StoredLease, StoredServer, StoredWaiter, StoreError

log = logging.getLogger(__name__)


def _stored_server(rec: ServerRecord) -> StoredServer:
    """A registry record as the store keeps it."""

    def span(a: Assignment | None) -> tuple[int, int, int] | None:
        return None if a is None else (a.start, a.end, a.version)

    return StoredServer(rec.name, rec.memory_bytes, rec.tau_p_s, rec.tau_c_s, rec.peer_id, rec.address,
                        rec.last_heartbeat_s is None, rec.alive, rec.dead_reason, span(rec.assignment),
                        span(rec.previous_assignment))


def chain_json(chain: ChainInfo) -> dict:
    """A chain as the store keeps it with a lease: hops, capacity, service time, id."""
    return {"spans": [list(k) for k in chain.key], "capacity": chain.capacity,
            "service_time_s": chain.service_time_s, "chain_id": chain.chain_id}


def chain_from_json(d: dict) -> ChainInfo:
    """The ChainInfo of a stored lease (matched to the offered chains by its hops, as after any recomposition)."""
    spans = tuple(SpanInfo(str(s), int(a), int(b)) for s, a, b in d["spans"])
    return ChainInfo(spans, int(d["capacity"]), float(d["service_time_s"]), str(d["chain_id"]))


@dataclass
class Persistence:
    """The journal of one orchestrator: every lease, queue and registry change goes to the store as it happens."""

    orch: Orchestrator
    store: StateStore

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
        self.store.granted(StoredLease(lease.lease_id, lease.job, lease.request_id, chain_json(lease.chain),
                                       lease.version, lease.ttl_s, lease.waited_s, lease.client, lease.replaces),
                           next_job)

    def renewed(self, lease: Lease) -> None:
        """A renewal changed the TTL."""
        self.store.renewed(lease.lease_id, lease.ttl_s)

    def ended(self, lease: Lease) -> None:
        """A lease ended."""
        self.store.ended(lease.lease_id)

    # ---- registry -------------------------------------------------------------------------------

    def save_registry(self) -> None:
        """Every server record and the composition version (after a registration or a recomposition)."""
        reg = self.orch.registry
        self.store.put_servers([_stored_server(r) for r in reg.servers.values()], {"version": str(reg.version)})

    def detach(self) -> None:
        """Stop journaling (a clean shutdown: waiters woken then are not taken out of the stored queue)."""
        self.orch.leases.journal = None
        self.orch.on_change = None


def attach_state(orch: Orchestrator, store: StateStore, *, attach_grace_s: float) -> Persistence:
    """Restore ``orch`` (fresh, on a running event loop) from ``store`` and journal into it from now on.

    Restored servers count as heard from now (a dead one is expired by the heartbeat timeout as usual) and serve
    nothing until their heartbeats say so; restored leases expire one TTL from now unless renewed; restored waiting
    requests keep their order and are dropped after ``attach_grace_s`` unless their clients come back for them
    (POST /lease with the same request_id).
    """
    asyncio.get_running_loop()  # the waiters' futures need it
    state = store.load()
    reg = orch.registry
    now = orch.clock()
    if state.servers:
        reg.servers.clear()
        for s in state.servers:
            rec = ServerRecord(s.name, s.memory_bytes, s.tau_p_s, s.tau_c_s, s.peer_id, s.address,
                               None if s.planned else now, s.alive, s.dead_reason)
            if s.assignment is not None:
                rec.assignment = Assignment(s.name, *s.assignment)
            if s.previous_assignment is not None:
                rec.previous_assignment = Assignment(s.name, *s.previous_assignment)
            reg.servers[s.name] = rec
        reg.version = max(reg.version, int(state.meta.get("version", "0")))
        reg.generation += 1
        orch.recompose_now()
    leases = []
    for x in state.leases:
        if x.ttl_s <= 0:
            raise StoreError(f"{store.path}: lease {x.lease_id} has ttl_s {x.ttl_s}")
        leases.append(Lease(x.lease_id, x.job, chain_from_json(x.chain), None, -1, x.version, now, now + x.ttl_s,
                            x.ttl_s, x.waited_s, x.client, x.replaces, x.request_id))
    loop = asyncio.get_running_loop()
    waiters = [
        _Waiter(w.job, loop.create_future(), now - max(0.0, time.time() - w.arrival_unix_s), w.ttl_s, w.client,
                w.replaces, w.request_id, now + attach_grace_s)
        for w in state.waiting
    ]
    orch.leases.restore(leases, waiters, int(state.meta.get("next_job", "0")))
    p = Persistence(orch, store)
    orch.leases.journal = p
    orch.on_change = p.save_registry
    p.save_registry()
    if state.servers or leases or waiters:
        log.warning("restored from %s: %d servers, %d leases, %d waiting requests (composition v%d)", store.path,
                    len(state.servers), len(leases), len(waiters), reg.version)
    return p
