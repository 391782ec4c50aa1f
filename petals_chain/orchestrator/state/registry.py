"""The orchestrator's table of live servers and the composition installed for them.

Servers register with their memory budget and measured times (τp per block, τc from the RTT); every change to the
set of live servers bumps ``generation``, which calls for a recomposition. The orchestrator computes it with its
:class:`~petals_chain.orchestrator.engine.composition.CompositionPolicy` from :meth:`Registry.snapshot` and installs it
here (:meth:`Registry.apply`) with a new version number, from which each server's blocks are derived as a 0-indexed
half-open PETALS span ``start:end``, written ``{"start": S, "end": E}`` in every JSON body (docs/model.md,
"Conventions").
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from petals_chain import defaults
from petals_chain.model import Composition, ModelSpec, ServerSpec, SpecError, check_batch_slowdown, span_json, span_text
from petals_chain.protocol.limits import MAX_TIME_S

# A single machine with more than this much accelerator memory is a typo (1 PB default).
MAX_MEMORY_BYTES = defaults.MAX_MEMORY_BYTES
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


class RegistryError(SpecError):
    """A registration or heartbeat is invalid; the message names the field and what would be right."""


class UnknownServerError(KeyError):
    """A request names a server that never registered."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown server"


class ClaimError(ValueError):
    """A server claims to serve blocks the orchestrator did not give it."""


class ServerDeadError(ValueError):
    """A heartbeat from a server the orchestrator has marked dead; it must register again."""


@dataclass(frozen=True)
class Assignment:
    """The blocks one server must hold: PETALS span ``start:end`` (0-indexed, end exclusive)."""

    server: str
    start: int
    end: int
    version: int

    @property
    def num_blocks(self) -> int:
        """Blocks held (0: none)."""
        return self.end - self.start

    def to_json(self) -> dict[str, Any]:
        """JSON form for the HTTP API."""
        return {
            "server": self.server,
            "start": self.start,
            "end": self.end,
            "num_blocks": self.num_blocks,
            "version": self.version,
        }


@dataclass
class ServerRecord:
    """What the orchestrator knows about one server."""

    name: str
    memory_bytes: float
    tau_p_s: float
    tau_c_s: float
    peer_id: str | None = None
    address: str | None = None
    last_heartbeat_s: float | None = None  # None: planned (from a cluster file), never expires
    alive: bool = True
    dead_reason: str = ""
    assignment: Assignment | None = None
    previous_assignment: Assignment | None = None
    serving: tuple[int, int] | None = None
    pending: str = ""  # why it is held out of the composition (not yet seen in the DHT), "" once believed
    serial_fraction: float = 0.0  # from a cluster file (compose/serial.py); servers do not measure it themselves
    # τp(b)/τp(1) for b = 1..B: as the server registered it (B its batching limit), or from a pinned cluster file
    batch_slowdown: tuple[float, ...] = ()
    max_batch_sessions: int | None = None  # the most sessions the server batches in one step, as it registered
    device: str | None = None  # the device the server emulates, as it registered

    def spec(self) -> ServerSpec:
        """The ServerSpec the composition algorithms see."""
        return ServerSpec(self.name, self.memory_bytes, self.tau_c_s, self.tau_p_s, self.serial_fraction,
                          self.batch_slowdown)

    def to_json(self) -> dict[str, Any]:
        """JSON form for the HTTP API."""
        return {
            "name": self.name,
            "peer_id": self.peer_id,
            "address": self.address,
            "memory_bytes": self.memory_bytes,
            "tau_p_s": self.tau_p_s,
            "tau_c_s": self.tau_c_s,
            "serial_fraction": self.serial_fraction,
            "batch_slowdown": list(self.batch_slowdown),
            "max_batch_sessions": self.max_batch_sessions,
            "device": self.device,
            "alive": self.alive,
            "dead_reason": self.dead_reason or None,
            "assignment": self.assignment.to_json() if self.assignment else None,
            "serving": span_json(*self.serving) if self.serving else None,
            "pending": self.pending or None,
        }


def check_name(value: Any, field_name: str = "name") -> str:
    """A server name: 1-128 characters of [A-Za-z0-9._:-], usable in URLs and metric labels."""
    if not isinstance(value, str) or not _NAME_RE.match(value):
        raise RegistryError(
            f"field '{field_name}' must be 1-128 characters of letters, digits, '.', '_', ':' or '-' "
            f"(starting with a letter or digit), got {value!r}"
        )
    return value


def check_number(value: Any, field_name: str, *, low: float, high: float, allow_low: bool) -> float:
    """A finite real number in (low, high] or [low, high]; the error names the field and the range."""
    # An int is finite however large (math.isfinite would overflow converting it); the range check below catches it.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float)
                                                                          and not math.isfinite(value)):
        raise RegistryError(f"field '{field_name}' must be a finite number, got {value!r}")
    too_low = value < low if allow_low else value <= low
    if too_low or value > high:
        bracket = "[" if allow_low else "("
        raise RegistryError(f"field '{field_name}' must be in {bracket}{low:g}, {high:g}], got {value!r}")
    return float(value)


def _optional_str(value: Any, field_name: str, max_len: int = 512) -> str | None:
    """None, or a non-empty string of at most max_len characters."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > max_len:
        raise RegistryError(f"field '{field_name}' must be a non-empty string of at most {max_len} characters")
    return value


class Registry:
    """Live servers, the installed composition, its version and each server's assignment (the table only: what
    to compose and for which load is the orchestrator's :class:`CompositionPolicy`)."""

    def __init__(self, model: ModelSpec, *, max_memory_bytes: float = MAX_MEMORY_BYTES) -> None:
        self.model = model
        self.max_memory_bytes = max_memory_bytes
        self.servers: dict[str, ServerRecord] = {}
        self.composition: Composition | None = None
        self.version = 0
        self.error: str | None = None  # why the last recomposition gave no composition
        self.generation = 0  # bumps on every change that calls for a recomposition
        # With ``hold_new`` a server that registers anew (new name, a dead one back, another peer id) is held out of
        # the composition (``pending``) until the orchestrator has seen its peer in the DHT (trust/belief.py).
        self.hold_new = False

    # ---- validation -------------------------------------------------------------------------

    def check_memory(self, memory_bytes: Any) -> float:
        """Memory budget in bytes: finite, enough for one block plus one cache slot, not absurd."""
        need = self.model.block_bytes + self.model.cache_bytes
        value = check_number(memory_bytes, "memory_bytes", low=0.0, high=self.max_memory_bytes, allow_low=False)
        if value < need:
            raise RegistryError(
                f"field 'memory_bytes' = {value:g} cannot hold one block ({self.model.block_bytes:g} B) plus one "
                f"cache slot ({self.model.cache_bytes:g} B); it must be >= {need:g}"
            )
        return value

    # ---- membership ---------------------------------------------------------------------------

    def register(
        self,
        name: Any,
        memory_bytes: Any,
        tau_p_s: Any,
        tau_c_s: Any,
        *,
        now_s: float,
        peer_id: Any = None,
        address: Any = None,
        batch_slowdown: tuple[float, ...] | None = None,
        max_batch_sessions: int | None = None,
        device: str | None = None,
    ) -> tuple[ServerRecord, bool]:
        """Add or refresh a server; return (record, whether the composition must be recomputed).

        ``batch_slowdown`` (None: keep the record's) is the server's g(b) table, which the composition reads;
        ``max_batch_sessions`` and ``device`` are recorded as the server stated them. Everything is validated before
        anything changes, so a bad registration leaves the registry exactly as it was.
        """
        name = check_name(name)
        memory = self.check_memory(memory_bytes)
        tp = check_number(tau_p_s, "tau_p_s", low=0.0, high=MAX_TIME_S, allow_low=False)
        tc = check_number(tau_c_s, "tau_c_s", low=0.0, high=MAX_TIME_S, allow_low=True)
        peer = _optional_str(peer_id, "peer_id")
        addr = _optional_str(address, "address")
        if batch_slowdown is not None:
            check_batch_slowdown("registration", tuple(batch_slowdown))
        rec = self.servers.get(name)
        if rec is None:
            rec = ServerRecord(name, memory, tp, tc, peer, addr, now_s)
            if batch_slowdown is not None:
                rec.batch_slowdown = tuple(batch_slowdown)
            self.servers[name] = rec
            changed = True
            if self.hold_new:
                rec.pending = f"waiting to see peer {peer} in the DHT"
        else:
            # A planned server (from a cluster file, never registered) keeps its place in the plan; the trust layer
            # still offers its chains only once it is seen serving them.
            held = (self.hold_new and not rec.pending and rec.last_heartbeat_s is not None
                    and (not rec.alive or rec.peer_id != peer))
            if held:
                rec.pending = f"waiting to see peer {peer} in the DHT"
            changed = (
                held
                or not rec.alive
                or rec.memory_bytes != memory
                or not math.isclose(rec.tau_p_s, tp, rel_tol=defaults.RECOMPOSE_REL_TOL)
                or not math.isclose(rec.tau_c_s, tc, rel_tol=defaults.RECOMPOSE_REL_TOL,
                                    abs_tol=defaults.RECOMPOSE_ABS_TOL_S)
            )
            if batch_slowdown is not None and tuple(batch_slowdown) != rec.batch_slowdown:
                rec.batch_slowdown = tuple(batch_slowdown)  # a server restarted with another batching limit
                changed = True
            rec.memory_bytes, rec.peer_id, rec.address, rec.last_heartbeat_s = memory, peer, addr, now_s
            if changed:
                rec.tau_p_s, rec.tau_c_s = tp, tc
            rec.alive, rec.dead_reason = True, ""
            rec.serving = None  # a server (re)registers before it loads anything; its heartbeats say when it serves
        rec.max_batch_sessions, rec.device = max_batch_sessions, device
        if changed:
            self.generation += 1
        return rec, changed

    def add_planned(self, specs: Sequence[ServerSpec]) -> None:
        """Servers known from a cluster file: alive, never expired, until they register themselves."""
        for s in specs:
            check_name(s.name, "servers[].name")
            self.check_memory(s.memory_bytes)
        for s in specs:
            self.servers[s.name] = ServerRecord(s.name, s.memory_bytes, s.tau_p_s, s.tau_c_s,
                                                serial_fraction=s.serial_fraction, batch_slowdown=s.batch_slowdown)
        self.generation += 1

    def get(self, name: str) -> ServerRecord:
        """The record of a registered server, or UnknownServerError."""
        rec = self.servers.get(name)
        if rec is None:
            raise UnknownServerError(f"unknown server {name!r}: it has not registered")
        return rec

    def heartbeat(
        self,
        name: Any,
        *,
        now_s: float,
        serving: Any = None,
        tau_p_s: Any = None,
        tau_c_s: Any = None,
        keep_times: bool = False,
    ) -> tuple[ServerRecord, bool]:
        """Record that a server is alive and what it serves; return (record, recomposition needed).

        ``serving`` is the PETALS span ``{"start": S, "end": E}`` it currently holds; it must be its current or
        its previous assignment (a server still reloading), else ClaimError and nothing changes.
        With ``keep_times`` (a server whose times the operator pinned) the reported τ are checked but not taken.
        """
        name = check_name(name)
        rec = self.get(name)
        if not rec.alive:
            raise ServerDeadError(f"server {name!r} was marked dead ({rec.dead_reason}); register again")
        span = self._check_claim(rec, serving)
        tp = None if tau_p_s is None else check_number(tau_p_s, "tau_p_s", low=0.0, high=MAX_TIME_S, allow_low=False)
        tc = None if tau_c_s is None else check_number(tau_c_s, "tau_c_s", low=0.0, high=MAX_TIME_S, allow_low=True)
        rec.last_heartbeat_s = now_s
        rec.serving = span
        changed = False
        if keep_times:
            tp = tc = None
        if tp is not None and not math.isclose(rec.tau_p_s, tp, rel_tol=defaults.RECOMPOSE_REL_TOL):
            rec.tau_p_s, changed = tp, True
        if tc is not None and not math.isclose(rec.tau_c_s, tc, rel_tol=defaults.RECOMPOSE_REL_TOL,
                                               abs_tol=defaults.RECOMPOSE_ABS_TOL_S):
            rec.tau_c_s, changed = tc, True
        if changed:
            self.generation += 1
        return rec, changed

    def _check_claim(self, rec: ServerRecord, serving: Any) -> tuple[int, int] | None:
        """Validate a claimed span ``{"start": S, "end": E}`` against the server's current and previous assignments."""
        if serving is None:
            return None
        ok_shape = (
            isinstance(serving, dict)
            and set(serving) == {"start", "end"}
            and all(isinstance(v, int) and not isinstance(v, bool) for v in serving.values())
        )
        if not ok_shape:
            raise RegistryError(
                f"field 'serving' must be {{\"start\": S, \"end\": E}} (two integers), got {serving!r}"
            )
        start, end = serving["start"], serving["end"]
        if not 0 <= start <= end <= self.model.num_blocks:
            raise RegistryError(
                f"field 'serving' = {start}:{end} is not a span within 0:{self.model.num_blocks}"
            )
        if start == end:
            return (start, end)  # holds nothing yet: always allowed
        allowed = [a for a in (rec.assignment, rec.previous_assignment) if a is not None and a.num_blocks > 0]
        if not any((a.start, a.end) == (start, end) for a in allowed):
            given = ", ".join(f"{span_text(a.start, a.end)} (v{a.version})" for a in allowed) or "no blocks"
            raise ClaimError(
                f"server {rec.name!r} claims blocks {span_text(start, end)} but was given {given}; "
                "load the assigned span (GET /servers/{name}/assignment)"
            )
        return (start, end)

    def believe(self, name: str) -> bool:
        """A pending server has been seen in the DHT: it joins the next composition; True if it was pending."""
        rec = self.get(name)
        if not rec.pending:
            return False
        rec.pending = ""
        if rec.alive:
            self.generation += 1
        return True

    def mark_dead(self, name: str, reason: str) -> bool:
        """Mark a server dead (it will be left out of the next composition); True if it was alive."""
        rec = self.get(name)
        if not rec.alive:
            return False
        rec.alive, rec.dead_reason, rec.serving = False, reason, None
        self.generation += 1
        return True

    def expire(self, now_s: float, timeout_s: float) -> list[str]:
        """Mark dead every registered server whose last heartbeat is older than timeout_s."""
        gone = [
            r.name
            for r in self.servers.values()
            if r.alive and r.last_heartbeat_s is not None and now_s - r.last_heartbeat_s > timeout_s
        ]
        for name in gone:
            self.mark_dead(name, f"no heartbeat for {timeout_s:g} s")
        return gone

    def alive(self) -> list[ServerRecord]:
        """Live servers in registration order."""
        return [r for r in self.servers.values() if r.alive]

    def peer_id(self, name: str) -> str | None:
        """The PETALS peer id a server registered with (None for a planned server)."""
        rec = self.servers.get(name)
        return rec.peer_id if rec else None

    # ---- the installed composition ----------------------------------------------------------

    def snapshot(self) -> tuple[int, tuple[ServerSpec, ...]]:
        """(generation, specs of the live servers): the input of one recomposition."""
        return self.generation, tuple(r.spec() for r in self.alive() if not r.pending)

    def held_spans(self) -> dict[str, tuple[int, int]]:
        """Each server's assigned PETALS span (start, end), for those given blocks: what they hold or are loading."""
        return {r.name: (r.assignment.start, r.assignment.end) for r in self.servers.values()
                if r.assignment is not None and r.assignment.num_blocks > 0}

    def assign_unplaced(self) -> None:
        """Give every server that has no assignment yet an empty one at the current version (a recomposition that
        was computed but not installed, because the installed one was kept, still answers a newcomer: no blocks)."""
        for rec in self.servers.values():
            if rec.assignment is None:
                rec.assignment = Assignment(rec.name, 0, 0, self.version)

    def apply(self, composition: Composition | None, error: str | None = None) -> int:
        """Install a composition (or None with the reason); bump the version, derive assignments."""
        if composition is not None:
            unknown = [s.name for s in composition.servers if s.name not in self.servers]
            if unknown:
                raise RegistryError(f"composition names servers that never registered: {unknown}")
            if composition.model.num_blocks != self.model.num_blocks:
                raise RegistryError(
                    f"composition is for {composition.model.num_blocks} blocks, the registry's model has "
                    f"{self.model.num_blocks}"
                )
        self.version += 1
        self.composition, self.error = composition, error
        placed: dict[str, tuple[int, int]] = {}
        if composition is not None:
            for j, s in enumerate(composition.servers):
                placed[s.name] = composition.placement.span(j)
        for rec in self.servers.values():
            span = placed.get(rec.name, (0, 0))
            new = Assignment(rec.name, span[0], span[1], self.version)
            if rec.assignment is not None and (rec.assignment.start, rec.assignment.end) != span:
                rec.previous_assignment = rec.assignment
            rec.assignment = new
        return self.version
