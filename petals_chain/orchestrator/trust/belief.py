"""What the orchestrator believes about servers: seen in the DHT, serving what they claim, suspect, cordoned.

With a :class:`~petals_chain.orchestrator.trust.verify.PeerVerifier` (the orchestrator runs a DHT node) a registration
is not taken on the server's word: the server is held out of the composition until its peer id answers in the DHT,
and a chain through it is offered only once the DHT shows the peer announcing the span it was given and the peer
answers for it directly. A failure report makes a server *suspect*: the orchestrator probes it and marks it dead only
if the probe fails; a false report changes nothing and counts against the reporting lease (:mod:`.suspects`). The
operator's cordon withdraws a server's chains from new leases. docs/trust.md.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from petals_chain.orchestrator.state.registry import ClaimError, ServerRecord
from petals_chain.orchestrator.trust.suspects import FalseReportLimiter
from petals_chain.orchestrator.trust.verify import PeerVerifier
from petals_chain.protocol.parsing import BadRequestError
from petals_chain.protocol.requests import RegisterBody

if TYPE_CHECKING:
    from collections.abc import Callable

    from petals_chain.orchestrator.state.registry import Registry

log = logging.getLogger(__name__)

VERIFY_TIMEOUT_S = 60.0  # a server not seen in the DHT (or not serving its claimed span) this long is marked dead
VERIFY_INTERVAL_S = 1.0  # how often unverified servers are looked for


class Believer(Protocol):
    """What the trust layer acts on (the engine satisfies it; this module never imports it): the registry it holds
    new servers out of, the clock, and the three things a verdict leads to."""

    registry: Registry
    clock: Callable[[], float]

    def refresh_offer(self) -> None:
        """Offer the chains that are ready now (after a belief changed)."""

    async def recompose(self) -> None:
        """Recompose (after a held-out server is believed)."""

    async def server_failed(self, name: str, reason: str, *, wait: bool = True) -> None:
        """Mark a server dead and recompose without it."""


class Trust:
    """Belief about each server, consulted before a chain is offered (:meth:`may_offer`)."""

    def __init__(self, verifier: PeerVerifier | None = None, *,
                 verify_timeout_s: float = VERIFY_TIMEOUT_S, limiter: FalseReportLimiter | None = None) -> None:
        """Built before the orchestrator and handed to it, which binds it (:meth:`bind`); without a verifier every
        server is believed and only the operator's cordon withholds chains."""
        self.verifier = verifier
        self.verify_timeout_s = verify_timeout_s
        self._limiter = limiter
        self.verified: dict[str, tuple[str, int, int]] = {}  # name → (peer id, start, end) seen served
        self.cordoned: dict[str, str] = {}  # name → why the operator cordoned it (no new leases through it)
        self.false_reports = 0
        self._since: dict[tuple[str, str | None, int, int], float] = {}  # what awaits proof → since when
        self._checks: dict[str, asyncio.Task[bool]] = {}  # suspect → its running check (shared by reporters)

    def bind(self, orch: Believer) -> None:
        """Serve ``orch`` (its constructor calls this once): its registry holds new servers out while verifying."""
        self.orch = orch
        self.limiter = self._limiter or FalseReportLimiter(orch.clock)
        orch.registry.hold_new = self.verifier is not None

    # ---- offering ---------------------------------------------------------------------------------

    def may_offer(self, name: str, start: int, end: int) -> bool:
        """A hop start:end on ``name`` may be leased: not cordoned and, with a verifier, seen served."""
        if name in self.cordoned:
            return False
        if self.verifier is None:
            return True
        rec = self.orch.registry.servers.get(name)
        seen = self.verified.get(name)
        return (rec is not None and seen is not None and seen[0] == rec.peer_id
                and seen[1] <= start and end <= seen[2])

    def cordon(self, name: str, reason: str) -> None:
        """No new leases on chains through ``name`` (leases held now run on); it keeps its blocks. (A drain, which
        also moves the sessions off and lets the server leave, is :mod:`petals_chain.orchestrator.engine.drain`.)"""
        self.orch.registry.get(name)
        self.cordoned[name] = reason
        self.orch.refresh_offer()

    def uncordon(self, name: str) -> None:
        """Undo a cordon."""
        self.orch.registry.get(name)
        self.cordoned.pop(name, None)
        self.orch.refresh_offer()

    # ---- registration -----------------------------------------------------------------------------

    def admit(self, body: RegisterBody) -> None:
        """Refuse before anything changes: no peer id while verifying, or a peer id a believed server holds."""
        if self.verifier is None:
            return
        if body.peer_id is None:
            raise BadRequestError("missing field 'peer_id': this orchestrator believes a server only once it sees "
                                  "its peer in the DHT", ["peer_id"])
        for rec in self.orch.registry.servers.values():
            if rec.name != body.name and rec.alive and not rec.pending and rec.peer_id == body.peer_id:
                raise ClaimError(f"peer id {body.peer_id} belongs to server {rec.name!r}; a peer id is one server's")

    # ---- the verification loop --------------------------------------------------------------------

    def _overdue(self, key: tuple[str, str | None, int, int], now_s: float) -> bool:
        """Whether ``key`` has waited for proof longer than verify_timeout_s (its clock starts on first sight)."""
        return now_s - self._since.setdefault(key, now_s) > self.verify_timeout_s

    async def verify_once(self) -> None:
        """One pass: believe pending servers seen in the DHT, check claimed spans, bury what stays unproven."""
        if self.verifier is None:
            return
        now = self.orch.clock()
        registry = self.orch.registry
        dead: list[tuple[str, str]] = []
        recs = [r for r in registry.servers.values() if r.alive and r.peer_id is not None]
        # every server at once: one peer that does not answer must not hold up the others for its timeout
        outcomes = await asyncio.gather(*(self._check_pending(r, now, dead) if r.pending
                                          else self._check_span(r, now, dead) for r in recs))
        believed = any(o for r, o in zip(recs, outcomes) if o == "believed")
        offer = any(o is True for o in outcomes)
        for name, why in dead:
            log.warning("server %r marked dead: %s", name, why)
            await self.orch.server_failed(name, why)
        if believed:
            await self.orch.recompose()
        elif offer:
            self.orch.refresh_offer()
        live = {(r.name, r.peer_id) for r in registry.servers.values() if r.alive}
        self._since = {k: v for k, v in self._since.items() if (k[0], k[1]) in live}

    async def _check_pending(self, rec: ServerRecord, now_s: float, dead: list[tuple[str, str]]) -> str | None:
        """A pending server whose peer answers a DHT ping is believed ("believed"); one silent too long is buried."""
        key = (rec.name, rec.peer_id, -1, -1)
        assert rec.peer_id is not None and self.verifier is not None
        if await self.verifier.present(rec.peer_id):
            if rec.alive and rec.pending and self.orch.registry.believe(rec.name):
                self._since.pop(key, None)
                log.info("server %r believed: peer %s answers in the DHT", rec.name, rec.peer_id)
                return "believed"
        elif self._overdue(key, now_s):
            dead.append((rec.name, f"peer {rec.peer_id} never answered in the DHT"))
        return None

    async def _check_span(self, rec: ServerRecord, now_s: float, dead: list[tuple[str, str]]) -> bool:
        """If ``rec`` claims (by heartbeat) the span it was assigned, check the DHT and the peer; True if newly seen."""
        a = rec.assignment
        if a is None or a.num_blocks == 0 or rec.serving != (a.start, a.end):
            return False
        if self.verified.get(rec.name) == (rec.peer_id, a.start, a.end):
            return False
        key = (rec.name, rec.peer_id, a.start, a.end)
        assert rec.peer_id is not None
        if (await self.verifier.announces(rec.peer_id, a.start, a.end)  # type: ignore[union-attr]
                and await self.verifier.serves(rec.peer_id, a.start, a.end)):  # type: ignore[union-attr]
            self.verified[rec.name] = (rec.peer_id, a.start, a.end)
            self._since.pop(key, None)
            log.info("server %r seen serving %d:%d as peer %s", rec.name, a.start, a.end, rec.peer_id)
            return True
        if self._overdue(key, now_s):
            dead.append((rec.name, f"claims blocks {a.start}:{a.end} but peer {rec.peer_id} does not serve them"))
        return False

    async def run(self, interval_s: float = VERIFY_INTERVAL_S) -> None:
        """verify_once() every interval_s until cancelled (it survives its own errors)."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.verify_once()
            except Exception:  # keep verifying whatever one pass hit
                log.exception("verification pass failed")

    # ---- failure reports --------------------------------------------------------------------------

    async def confirm_failure(self, name: str, reporter: str) -> bool:
        """A report that ``name`` failed: probe it; True if it is really down (then the caller buries it).

        Without a verifier the report is believed (nothing to check with). Reports about one server share one probe.
        The probe always runs, so a report it confirms is never refused; a report it finds false counts against
        ``reporter`` (:func:`~petals_chain.orchestrator.trust.suspects.reporter_of`: the reporting lease's job), and one
        past that reporter's limit is refused (RateLimitedError, HTTP 429). Nobody else's reports are affected.
        """
        if self.verifier is None:
            return True
        rec = self.orch.registry.get(name)
        if not rec.alive:
            return True
        task = self._checks.get(name)
        if task is None:
            task = asyncio.ensure_future(self._probe(rec))
            self._checks[name] = task
            task.add_done_callback(lambda _t, n=name: self._checks.pop(n, None))
        down = await asyncio.shield(task)
        if not down:
            self.false_reports += 1
            self.limiter.check(reporter)  # past the limit: this false report is refused (it changed nothing)
            count = self.limiter.record_false(reporter)
            log.warning("false failure report by %s: server %r answers (%d false reports by it within %g s)",
                        reporter, name, count, self.limiter.window_s)
        return down

    async def _probe(self, rec: ServerRecord) -> bool:
        """True if the server does not answer: no DHT ping, or (holding blocks) no rpc_info for its span."""
        verifier = self.verifier
        assert verifier is not None
        if rec.peer_id is None or not await verifier.present(rec.peer_id):
            return True
        a = rec.assignment
        if a is not None and a.num_blocks > 0 and rec.serving == (a.start, a.end):
            return not await verifier.serves(rec.peer_id, a.start, a.end)
        return False
