"""The orchestrator's durable state in SQLite (WAL mode): servers, leases, the waiting queue and a few counters.

Only what cannot be rebuilt from the swarm is kept: who registered with which budget and times (so the composition
recomputed after a restart is the same one), every lease granted and not yet ended (so no slot is handed out twice),
every request waiting in the central queue with its place in line, and each server's secret as a salted hash and
the operator's evictions (so no restart lets another caller take a server's name). Liveness, served spans and
lease expiry clocks are rebuilt from heartbeats and renewals (docs/orchestrator.md, "Restart").

Each write is one transaction, so a process killed at any point leaves the previous or the next consistent state:
a grant removes the request from the queue and adds its lease in the same transaction. With a ``sink`` set
(:class:`petals_chain.orchestrator.state.persist.GroupCommit`), writes are handed to it instead and committed in
batches,
several writes to one transaction, in their order.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

from petals_chain.model import SpecError

Statements = list[tuple[str, tuple[Any, ...]]]

SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL")
SCHEMA_VERSION = 2  # 2: servers.facts (what a server stated about its batching), added to a version-1 file on open

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS servers (
    name TEXT PRIMARY KEY, seq INTEGER NOT NULL, memory_bytes REAL NOT NULL, tau_p_s REAL NOT NULL,
    tau_c_s REAL NOT NULL, peer_id TEXT, address TEXT, planned INTEGER NOT NULL, alive INTEGER NOT NULL,
    dead_reason TEXT NOT NULL, assignment TEXT, previous_assignment TEXT, facts TEXT);
CREATE TABLE IF NOT EXISTS leases (
    lease_id TEXT PRIMARY KEY, job INTEGER NOT NULL UNIQUE, request_id TEXT, chain TEXT NOT NULL,
    version INTEGER NOT NULL, ttl_s REAL NOT NULL, waited_s REAL NOT NULL, client TEXT, replaces TEXT);
CREATE TABLE IF NOT EXISTS waiting (
    job INTEGER PRIMARY KEY, request_id TEXT, ttl_s REAL NOT NULL, client TEXT, replaces TEXT,
    arrival_unix_s REAL NOT NULL);
CREATE TABLE IF NOT EXISTS secrets (name TEXT PRIMARY KEY, hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS banned (name TEXT PRIMARY KEY, reason TEXT NOT NULL);
"""


class StoreError(SpecError):
    """The state folder or database cannot be used (wrong schema, unreadable, bad setting); names the path."""


@dataclass(frozen=True)
class StoredServer:
    """A registry record as stored: budget, times, identity, whether it was alive, its assigned spans (or None)."""

    name: str
    memory_bytes: float
    tau_p_s: float
    tau_c_s: float
    peer_id: str | None
    address: str | None
    planned: bool
    alive: bool
    dead_reason: str
    assignment: tuple[int, int, int] | None  # (start, end, version)
    previous_assignment: tuple[int, int, int] | None
    # what the server stated when it registered: {"batch_slowdown": [...], "max_batch_sessions": B, "device": ...}
    facts: dict[str, Any] | None = None


@dataclass(frozen=True)
class StoredLease:
    """A granted lease as stored: its job (place in line), chain (hops, capacity, T_k, id) and TTL."""

    lease_id: str
    job: int
    request_id: str | None
    chain: dict[str, Any]  # {"spans": [[server, start, end], ...], "capacity", "service_time_s", "chain_id"}
    version: int
    ttl_s: float
    waited_s: float
    client: str | None
    replaces: str | None


@dataclass(frozen=True)
class StoredWaiter:
    """A request waiting in the central queue: its job number is its place in line."""

    job: int
    request_id: str | None
    ttl_s: float
    client: str | None
    replaces: str | None
    arrival_unix_s: float


@dataclass(frozen=True)
class StoredState:
    """Everything the store holds, read back in order (servers by registration, leases and waiters by job)."""

    meta: dict[str, str]
    servers: list[StoredServer]
    leases: list[StoredLease]
    waiting: list[StoredWaiter]
    secrets: dict[str, str] = field(default_factory=dict)  # server name → its secret's salted hash
    banned: dict[str, str] = field(default_factory=dict)  # server name → why the operator evicted it


def _span(value: str | None) -> tuple[int, int, int] | None:
    """A stored [start, end, version] (or NULL)."""
    return None if value is None else tuple(json.loads(value))  # type: ignore[return-value]


class StateStore:
    """One SQLite database in WAL mode; every public write is its own transaction (atomic across a crash)."""

    def __init__(self, path: str | Path, *, synchronous: str = "NORMAL") -> None:
        mode = str(synchronous).upper()
        if mode not in SYNCHRONOUS_MODES:
            raise StoreError(f"field 'synchronous' must be one of {', '.join(SYNCHRONOUS_MODES)}, got {synchronous!r}")
        self.path = Path(path)
        self.synchronous = mode
        self.sink: Callable[[Statements], None] | None = None  # set: writes go there (batched), not straight in
        try:
            self._db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={mode}")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot open the state database: {exc}") from None
        if row is None:
            self.set_meta("schema", str(SCHEMA_VERSION))
        elif row[0] == "1":  # written before servers stated their batching: the column is added, empty
            try:
                self._db.execute("ALTER TABLE servers ADD COLUMN facts TEXT")
            except sqlite3.Error as exc:
                raise StoreError(f"{self.path}: cannot upgrade the state database from schema 1: {exc}") from None
            self.set_meta("schema", str(SCHEMA_VERSION))
        elif row[0] != str(SCHEMA_VERSION):
            raise StoreError(f"{self.path}: state schema {row[0]}, this version reads {SCHEMA_VERSION}")

    def close(self) -> None:
        """Close the connection (committed writes are already in the database)."""
        self._db.close()

    def _write(self, statements: Statements) -> None:
        """One write: to the sink when one is set, else committed now as its own transaction."""
        if self.sink is not None:
            self.sink(statements)
        else:
            self.commit(statements)

    def commit(self, statements: Statements) -> None:
        """Run the statements as one transaction (from one thread at a time)."""
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in statements:
                db.execute(sql, params)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    # ---- writes ---------------------------------------------------------------------------------

    @staticmethod
    def _lease_row(lease: StoredLease) -> tuple[str, tuple[Any, ...]]:
        """The statement storing one lease."""
        return ("INSERT OR REPLACE INTO leases (lease_id, job, request_id, chain, version, ttl_s, waited_s, client, "
                "replaces) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (lease.lease_id, lease.job, lease.request_id, json.dumps(lease.chain), lease.version, lease.ttl_s,
                 lease.waited_s, lease.client, lease.replaces))

    @staticmethod
    def _waiter_row(w: StoredWaiter) -> tuple[str, tuple[Any, ...]]:
        """The statement storing one waiting request."""
        return ("INSERT OR REPLACE INTO waiting (job, request_id, ttl_s, client, replaces, arrival_unix_s) "
                "VALUES (?, ?, ?, ?, ?, ?)", (w.job, w.request_id, w.ttl_s, w.client, w.replaces, w.arrival_unix_s))

    def set_meta(self, key: str, value: str) -> None:
        """Set one named value (the composition version, the next job number, the DHT's address)."""
        self._write([("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))])

    def put_servers(self, servers: list[StoredServer], meta: dict[str, str] | None = None) -> None:
        """Insert or replace these server records (new ones go last in registration order), with meta values."""
        stmts: Statements = []
        for s in servers:
            stmts.append((
                "INSERT INTO servers (name, seq, memory_bytes, tau_p_s, tau_c_s, peer_id, address, planned, alive, "
                "dead_reason, assignment, previous_assignment, facts) VALUES (?, (SELECT COALESCE(MAX(seq), -1) + 1 "
                "FROM servers), ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET memory_bytes = "
                "excluded.memory_bytes, tau_p_s = excluded.tau_p_s, tau_c_s = excluded.tau_c_s, peer_id = "
                "excluded.peer_id, address = excluded.address, planned = excluded.planned, alive = excluded.alive, "
                "dead_reason = excluded.dead_reason, assignment = excluded.assignment, previous_assignment = "
                "excluded.previous_assignment, facts = excluded.facts",
                (s.name, s.memory_bytes, s.tau_p_s, s.tau_c_s, s.peer_id, s.address, int(s.planned), int(s.alive),
                 s.dead_reason, None if s.assignment is None else json.dumps(list(s.assignment)),
                 None if s.previous_assignment is None else json.dumps(list(s.previous_assignment)),
                 None if s.facts is None else json.dumps(s.facts)),
            ))
        for key, value in (meta or {}).items():
            stmts.append(("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value)))
        self._write(stmts)

    def put_secret(self, name: str, hashed: str) -> None:
        """Server ``name`` holds a new secret (its salted hash; the secret itself is never stored)."""
        self._write([("INSERT OR REPLACE INTO secrets (name, hash) VALUES (?, ?)", (name, hashed))])

    def delete_secret(self, name: str) -> None:
        """Server ``name`` holds no secret any more."""
        self._write([("DELETE FROM secrets WHERE name = ?", (name,))])

    def set_banned(self, name: str, reason: str | None) -> None:
        """The operator evicted ``name`` (``reason``), or lifted its eviction (None)."""
        self._write([("DELETE FROM banned WHERE name = ?", (name,))] if reason is None else
                    [("INSERT OR REPLACE INTO banned (name, reason) VALUES (?, ?)", (name, reason))])

    def queued(self, w: StoredWaiter, next_job: int) -> None:
        """A request entered the queue (or went back to it after a failure, keeping its job)."""
        self._write([
            self._waiter_row(w),
            ("INSERT OR REPLACE INTO meta (key, value) VALUES ('next_job', ?)", (str(next_job),)),
        ])

    def left_queue(self, job: int) -> None:
        """A waiting request gave up (timeout, disconnect, never re-attached)."""
        self._write([("DELETE FROM waiting WHERE job = ?", (job,))])

    def granted(self, lease: StoredLease, next_job: int) -> None:
        """A request got its slot: it leaves the queue and its lease is recorded, atomically."""
        self._write([
            ("DELETE FROM waiting WHERE job = ?", (lease.job,)),
            self._lease_row(lease),
            ("INSERT OR REPLACE INTO meta (key, value) VALUES ('next_job', ?)", (str(next_job),)),
        ])

    def replace_leases_and_queue(self, leases: list[StoredLease], waiting: list[StoredWaiter], next_job: int) -> None:
        """Make the stored leases and queue exactly these (after a restore, which may have granted some)."""
        stmts: Statements = [("DELETE FROM leases", ()), ("DELETE FROM waiting", ())]
        stmts += [self._lease_row(x) for x in leases]
        stmts += [self._waiter_row(w) for w in waiting]
        stmts.append(("INSERT OR REPLACE INTO meta (key, value) VALUES ('next_job', ?)", (str(next_job),)))
        self._write(stmts)

    def renewed(self, lease_id: str, ttl_s: float) -> None:
        """A renewal changed the lease's TTL."""
        self._write([("UPDATE leases SET ttl_s = ? WHERE lease_id = ?", (ttl_s, lease_id))])

    def ended(self, lease_id: str) -> None:
        """A lease was released, expired, abandoned or replaced: its slot is free."""
        self._write([("DELETE FROM leases WHERE lease_id = ?", (lease_id,))])

    # ---- reads ----------------------------------------------------------------------------------

    def load(self) -> StoredState:
        """Everything stored, in order."""
        db = self._db
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        servers = [
            StoredServer(r[0], r[1], r[2], r[3], r[4], r[5], bool(r[6]), bool(r[7]), r[8], _span(r[9]), _span(r[10]),
                         None if r[11] is None else json.loads(r[11]))
            for r in db.execute(
                "SELECT name, memory_bytes, tau_p_s, tau_c_s, peer_id, address, planned, alive, dead_reason, "
                "assignment, previous_assignment, facts FROM servers ORDER BY seq")
        ]
        leases = [
            StoredLease(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6], r[7], r[8])
            for r in db.execute("SELECT lease_id, job, request_id, chain, version, ttl_s, waited_s, client, replaces "
                                "FROM leases ORDER BY job")
        ]
        waiting = [
            StoredWaiter(*r)
            for r in db.execute("SELECT job, request_id, ttl_s, client, replaces, arrival_unix_s FROM waiting "
                                "ORDER BY job")
        ]
        secrets = dict(db.execute("SELECT name, hash FROM secrets").fetchall())
        banned = dict(db.execute("SELECT name, reason FROM banned").fetchall())
        return StoredState(meta, servers, leases, waiting, secrets, banned)
