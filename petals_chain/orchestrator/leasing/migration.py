"""Leases that move: the orchestrator decides migrations and the lease holder carries them out at a step boundary.

A move reserves a slot first (a lease on the target chain, granted to the same client) and only then tells the
holder, in the reply to its next renew (``"migrate_to"``). The holder moves its session there and says so
(``POST /lease/{id}/migrated``: the old lease ends and its slot is freed) or says it could not
(``POST /lease/{id}/migration-failed``: the reservation ends, the old lease stays, and it is never picked again).
So a slot is never booked twice and the old one is freed only once the move succeeded. docs/migration.md.

Three reasons to move: JFFC with migration (``migration="jffc"``: when a slot of chain k frees up and nobody
waits, the longest-resident session of the slowest busy chain slower than k moves to k, the decision
:func:`~petals_chain.kernels.dispatch_rules.migration_source` that the simulator's kernel makes too); consolidation
(``migration="mell"``: sessions packed by Mell's scheduler, :mod:`petals_chain.mell.live`;
``"worst-fit"`` packs without moving, its baseline); and a drain (every session on a server's chains asks for a
slot elsewhere, at the head of the queue when none is free).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from petals_chain.kernels.dispatch_rules import migration_source, speed_order
from petals_chain.model import SpecError
from petals_chain.orchestrator.engine.chains import ChainInfo
from petals_chain.orchestrator.leasing.policy import LeaseCapabilities
from petals_chain.orchestrator.leasing.leases import Lease, LeaseManager, TimeHistogram, UnknownLeaseError, _Waiter
from petals_chain.orchestrator.leasing.policies import LEASE_POLICIES, LivePolicy

MIGRATION_POLICIES = LEASE_POLICIES.names("migration")  # read from the registry (leasing/policies.py)
REASONS = ("jffc", "drain", "consolidate")  # why a move was decided (a packer's moves consolidate)
UNKNOWN_MODE = "unknown"  # a holder that did not say


class NoMoveError(UnknownLeaseError):
    """A migration route names a lease that has no move pending."""


@dataclass
class PendingMove:
    """Lease ``source`` is to move: to the reserved lease ``target`` (None while it waits for a slot)."""

    source: str
    reason: str  # one of REASONS
    target: str | None = None
    waiter_job: int | None = None


@dataclass
class MigrationCounters:
    """Monotone counts of moves, in total and by (event, reason, mode) for /metrics, and the move times the holders
    reported, by mode."""

    offered: int = 0  # a target slot was reserved and offered to the holder
    completed: int = 0
    failed: int = 0  # the holder could not move; it stays where it was (its switch rolled back)
    dropped: int = 0  # the source ended (finished, expired) before it moved
    by_label: Counter = field(default_factory=Counter)  # (event, reason, mode) -> count; mode "" where none applies
    seconds: dict[str, TimeHistogram] = field(default_factory=dict)  # mode -> reported move times

    def count(self, event: str, reason: str, mode: str = "") -> None:
        """One ``event`` (offered, completed, failed, dropped) of a move decided for ``reason``."""
        setattr(self, event, getattr(self, event) + 1)
        self.by_label[(event, reason, mode)] += 1

    def observe(self, mode: str, seconds: float) -> None:
        """A move time a holder reported."""
        self.seconds.setdefault(mode, TimeHistogram()).observe(seconds)


class MigratingLeaseManager(LeaseManager):
    """JFFC leases plus moves between chains: JFFC with migration (optional) and drains."""

    capabilities: ClassVar[LeaseCapabilities] = LeaseCapabilities(moves_sessions=True)

    def __init__(self, *, migration: str = "none", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.set_policy(migration)
        self.moves = MigrationCounters()
        self._moves: dict[str, PendingMove] = {}  # by source lease id
        self._target_of: dict[str, str] = {}  # reserved lease id -> source lease id
        self._stay: set[str] = set()  # leases whose move failed: never picked again
        self._rates = np.zeros(0)
        self._by_rank = np.zeros(0, dtype=np.int64)

    # ---- chains ---------------------------------------------------------------------------------

    def set_chains(self, chains: list[ChainInfo] | None, version: int) -> None:
        """As LeaseManager's; also keep the chains' speed order for the JFFC-migration decision."""
        super().set_chains(chains, version)
        self._rates = np.array([c.rate_per_s for c in self._chains], dtype=np.float64)
        self._by_rank = speed_order(self._rates)[0] if self._chains else np.zeros(0, dtype=np.int64)

    # ---- the holder's side ----------------------------------------------------------------------

    def offer(self, lease_id: str) -> Lease | None:
        """The reserved lease ``lease_id`` should move to, if one is ready."""
        move = self._moves.get(lease_id)
        if move is None or move.target is None:
            return None
        return self._leases.get(move.target)

    def pending(self, lease_id: str) -> bool:
        """Whether ``lease_id`` has a move decided (reserved or still waiting for a slot)."""
        return lease_id in self._moves

    def renew(self, lease_id: str, ttl_s: float | None = None) -> Lease:
        """Extend a lease and the reservation made for it (both expire together)."""
        lease = super().renew(lease_id, ttl_s)
        target = self.offer(lease_id)
        if target is not None:
            target.ttl_s, target.expires_s = lease.ttl_s, lease.expires_s
        return lease

    def complete(self, lease_id: str, mode: str | None = None, seconds: float | None = None) -> Lease:
        """The holder of ``lease_id`` now runs on the reserved lease: end the old one (its slot is freed now).
        ``mode`` and ``seconds``: how it moved and how long that held its session, as it reports them."""
        source = self.get(lease_id)
        move = self._moves.get(lease_id)
        if move is None or move.target is None:
            raise NoMoveError(f"lease {lease_id!r} has no move offered")
        del self._moves[lease_id]
        self._target_of.pop(move.target, None)
        target = self._leases[move.target]
        self.moves.count("completed", move.reason, mode or UNKNOWN_MODE)
        if seconds is not None:
            self.moves.observe(mode or UNKNOWN_MODE, seconds)
        self.counters.released += 1
        if self.packing:  # the packer already has the job at the target: the old lease just goes
            self._leases.pop(source.lease_id, None)
            self.service_hist.observe(self.clock() - source.granted_s)
            if source.chain_index is not None:
                self._start_all(self._policy.unhold(source.chain_index), self.clock())
        else:
            self._end(source, record=True)
        return target

    def fail(self, lease_id: str, mode: str | None = None) -> Lease:
        """The holder of ``lease_id`` could not move (in ``mode``): drop the reservation; the lease stays and is not
        picked again."""
        source = self.get(lease_id)
        move = self._moves.get(lease_id)
        if move is None:
            raise NoMoveError(f"lease {lease_id!r} has no move pending")
        self.moves.count("failed", move.reason, mode or UNKNOWN_MODE)
        self._stay.add(lease_id)
        if self.packing and move.target is not None:  # the packer books the job back where it runs
            self._moves.pop(lease_id, None)
            self._target_of.pop(move.target, None)
            self._leases.pop(move.target, None)
            if source.chain_index is not None:
                self._policy.pin(source.job, source.chain_index)
                self._start_all(self._policy.unhold(source.chain_index), self.clock())
            return source
        self._drop(move)
        return source

    # ---- deciding moves -------------------------------------------------------------------------

    def drain(self, server: str) -> int:
        """Ask a slot elsewhere for every lease whose chain runs through ``server`` (the caller has stopped offering
        that server's chains); a lease that must wait keeps its place in line. Returns how many leases are on it."""
        if self.packing:
            raise SpecError(f"leases: a drain needs JFFC leases; sessions are packed by {self.migration!r} now")
        for target_id, source_id in list(self._target_of.items()):
            target = self._leases.get(target_id)
            if target is not None and any(s.server == server for s in target.chain.spans):
                self._drop(self._moves[source_id])  # a move onto the leaving server is off
        on = self.leases_on(server)
        for lease in on:
            if lease.lease_id not in self._moves:  # a pending move left now goes elsewhere already
                self._request_slot(lease)
        return len(on)

    def leases_on(self, server: str) -> list[Lease]:
        """Active leases (reservations excluded) whose chain runs through ``server``."""
        return [x for x in self.leases() if x.lease_id not in self._target_of
                and any(s.server == server for s in x.chain.spans)]

    def _request_slot(self, lease: Lease) -> None:
        """Queue a drain move for ``lease``: a slot at once if one is free, else ahead of later arrivals."""
        self._stay.discard(lease.lease_id)
        move = PendingMove(lease.lease_id, "drain", waiter_job=lease.job)
        self._moves[lease.lease_id] = move
        now = self.clock()
        fut = asyncio.get_running_loop().create_future()
        self._waiting[lease.job] = _Waiter(lease.job, fut, now, lease.ttl_s, lease.client, None)
        fut.add_done_callback(lambda f, m=move: self._granted(m, f))
        if self._policy is None:
            self._parked.append(lease.job)
        else:
            self._start_all(self._policy.on_resume(lease.job, now), now)

    def _granted(self, move: PendingMove, fut: asyncio.Future) -> None:
        """A drain move's slot was granted: it becomes the move's reservation (or goes back if the move is gone)."""
        if fut.cancelled() or fut.exception() is not None:
            return
        target: Lease = fut.result()
        if self._moves.get(move.source) is not move:
            self._end(target, record=False)
            return
        move.waiter_job = None
        self._reserved(move, target)

    def _reserved(self, move: PendingMove, target: Lease) -> None:
        """Record ``target`` as the slot ``move`` goes to."""
        move.target = target.lease_id
        self._target_of[target.lease_id] = move.source
        source = self._leases.get(move.source)
        if source is not None:
            target.ttl_s, target.expires_s = source.ttl_s, source.expires_s
        self.moves.count("offered", move.reason)

    def _drop(self, move: PendingMove) -> None:
        """Forget a move: give back its reservation, or leave the queue if it still waits."""
        self._moves.pop(move.source, None)
        if move.waiter_job is not None:
            w = self._waiting.pop(move.waiter_job, None)
            if not (self._policy is not None and self._policy.cancel(move.waiter_job)):
                try:
                    self._parked.remove(move.waiter_job)
                except ValueError:
                    pass
            if w is not None and not w.future.done():
                w.future.cancel()
        if move.target is not None:
            self._target_of.pop(move.target, None)
            target = self._leases.get(move.target)
            if target is not None:
                self._end(target, record=False)

    def _end(self, lease: Lease, *, record: bool) -> None:
        """As LeaseManager's; a source that ends drops its move, and a freed slot may take a slower chain's job.
        Idempotent: a reservation that went with its source is not ended twice (expire_due lists both)."""
        if lease.lease_id not in self._leases:
            return
        move = self._moves.pop(lease.lease_id, None)
        source = self._target_of.pop(lease.lease_id, None)
        if source is not None:  # a reservation ended on its own (expired with its source): the move is off
            self._moves.pop(source, None)
        self._stay.discard(lease.lease_id)
        k, epoch = lease.chain_index, lease.epoch
        super()._end(lease, record=record)
        if move is not None:
            self.moves.count("dropped", move.reason)
            self._drop(move)
            if self.packing and k is not None and epoch == self._epoch:
                self._start_all(self._policy.unhold(k), self.clock())
        if self.migration == "jffc" and k is not None and epoch == self._epoch:
            self._jffc_move(k)

    def _jffc_move(self, k: int) -> None:
        """JFFC with migration after a slot of chain ``k`` freed up: reserve it for the longest-resident session
        of the slowest busy chain that is strictly slower than k, if nobody waits (Theorem 3.7's lower bound)."""
        if self._policy is None or self._policy.queue_length() or self._parked:
            return
        if self._policy.occupancy()[k] >= self._policy.capacities[k]:
            return
        movable = [x for x in self._leases.values() if x.chain_index is not None and x.epoch == self._epoch
                   and x.lease_id not in self._moves and x.lease_id not in self._target_of
                   and x.lease_id not in self._stay]
        busy = np.zeros(len(self._chains), dtype=np.int64)
        for x in movable:
            busy[x.chain_index] += 1
        s = migration_source(busy, self._rates, self._by_rank, k)
        if s < 0:
            return
        mover = min((x for x in movable if x.chain_index == s), key=lambda x: (x.granted_s, x.job))
        if not self._policy.occupy(k):
            return
        now = self.clock()
        target = Lease(lease_id=f"L{mover.job}-m{self.moves.offered}-{_token()}", job=mover.job,
                       chain=self._chains[k], chain_index=k, epoch=self._epoch, version=self._version,
                       granted_s=now, expires_s=mover.expires_s, ttl_s=mover.ttl_s, waited_s=0.0,
                       client=mover.client, replaces=None)
        self._leases[target.lease_id] = target
        self.counters.granted += 1
        move = PendingMove(mover.lease_id, "jffc")
        self._moves[mover.lease_id] = move
        self._reserved(move, target)

    def set_policy(self, migration: str, *, field_name: str = "migration") -> None:
        """Switch the migration policy (a name of the registry's ``migration`` role; an unknown one is refused naming
        ``field_name``); moves already decided go on. A packer is switched to or from only while no session runs (its
        scheduler must have seen every placement)."""
        entry = LEASE_POLICIES.get("migration", migration, field_name=field_name)
        old: LivePolicy | None = getattr(self, "_migration", None)
        repack = old is not None and (entry.capabilities.packs or old.capabilities.packs) and entry != old
        if repack and (self._leases or self._waiting):
            raise SpecError(f"leases: field 'migration': cannot switch {old.name!r} -> {migration!r} while "
                            f"{len(self._leases)} leases are held and {len(self._waiting)} requests wait")
        self._migration = entry
        if repack and self._chains:
            self.set_chains(self._chains, self._version)

    @property
    def packing(self) -> bool:
        """Whether sessions are placed by a bin-packing scheduler (consolidation) rather than JFFC."""
        return self._migration.capabilities.packs

    @property
    def migration(self) -> str:
        """The migration policy's name (one of :data:`MIGRATION_POLICIES`)."""
        return self._migration.name

    def _new_policy(self) -> Any:
        """The manager's policy (JFFC), or the packer's over the same chains."""
        if self.packing:
            return self._migration.chains.dispatcher([c.rate_per_s for c in self._chains],
                                                             [c.capacity for c in self._chains])
        return super()._new_policy()

    def _carry(self, k: int, lease: Lease) -> bool:
        """As LeaseManager's; a packer records the lease's job on its chain."""
        if self.packing:
            return self._policy.occupy(k, lease.job)
        return super()._carry(k, lease)

    def _start_all(self, starts: list[Any], now: float) -> None:
        """Grant the starts to waiters; a start that moves a running job (a packer's) becomes a reserved move."""
        plain = [st for st in starts if st.migrated_from is None]
        super()._start_all(plain, now)
        for st in starts:
            if st.migrated_from is not None:
                self._packer_move(st.job, st.chain, now)

    def _packer_move(self, job: int, chain: int, now: float) -> None:
        """The packer moved ``job`` to ``chain`` in its books: reserve it there and offer the move to the holder."""
        source = next((x for x in self._leases.values() if x.job == job and x.lease_id not in self._target_of), None)
        if source is None:
            return
        old = self._moves.pop(source.lease_id, None)
        if old is not None and old.target is not None:  # moved again before it moved: the first reservation goes
            self._target_of.pop(old.target, None)
            gone = self._leases.pop(old.target, None)
            if gone is not None:
                self.moves.count("dropped", old.reason)
        if source.chain_index == chain or self._policy.room(chain) < 0:
            # back where it runs, or its target's cache is still held by a session moving away: it stays
            if source.chain_index is not None:
                self._policy.pin(job, source.chain_index)
            if old is not None and source.chain_index is not None:
                self._start_all(self._policy.unhold(source.chain_index), now)
            return
        if old is None and source.chain_index is not None:
            self._policy.hold(source.chain_index)  # its cache stays there until the move ends
        target = Lease(lease_id=f"L{job}-p{self.moves.offered}-{_token()}", job=job, chain=self._chains[chain],
                       chain_index=chain, epoch=self._epoch, version=self._version, granted_s=now,
                       expires_s=source.expires_s, ttl_s=source.ttl_s, waited_s=0.0, client=source.client)
        self._leases[target.lease_id] = target
        self.counters.granted += 1
        move = PendingMove(source.lease_id, "consolidate")
        self._moves[source.lease_id] = move
        self._reserved(move, target)

    def reserved(self) -> int:
        """Slots held now by reservations for moves (offered, not yet taken or given back)."""
        return len(self._target_of)

    def migration_json(self) -> dict[str, Any]:
        """Counts and the moves pending now, for GET /migrations."""
        return {
            "policy": self.migration,
            "offered": self.moves.offered,
            "completed": self.moves.completed,
            "failed": self.moves.failed,
            "dropped": self.moves.dropped,
            "reserved": self.reserved(),
            "pending": [{"lease_id": m.source, "reason": m.reason, "target": m.target} for m in self._moves.values()],
        }


def _token() -> str:
    """An unguessable suffix for a reserved lease id."""
    import secrets

    return secrets.token_hex(6)
