"""A PETALS server whose blocks come from the orchestrator, its KV cache sized per docs/model.md, "Cache slots".

``OrchestratedServer`` subclasses petals' ``Server`` at its two documented plug-in
points: ``_choose_blocks`` waits for the span the orchestrator assigned (instead of
petals' own balancing) and ``_should_choose_other_blocks`` says "reload" when the
assignment changes. A heartbeat thread reports the span actually served, so the
orchestrator can refuse a server that claims blocks it was not given. The cache gets
exactly ``M̃_j = ⌊(M_j − s_m·m_j)/s_c⌋`` block-job slots, so ``s_m·m_j + s_c·M̃_j ≤ M_j``. Its connection
handlers can also hand a live session's KV cache to another server (``kv_handler.py``).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

from petals.server.server import Server

from petals_chain import defaults
from petals_chain.checkpoint.sizing import BlockSizes
from petals_chain.model import SpecError, span_text
from petals_chain.protocol.blocking import BlockingOrchestrator
from petals_chain.protocol.http_client import OrchestratorError
from petals_chain.protocol.messages import DRAINED_REASON
from petals_chain.protocol.replies import AssignmentInfo
from petals_chain.server.batching import BatchingConfig, install_batching
from petals_chain.server.kv_arena import ArenaLayout, install_kv_arena
from petals_chain.server.kv_handler import install_kv_transfer
from petals_chain.service_time import Workload, tau_c

log = logging.getLogger(__name__)


class ClaimRefusedError(RuntimeError):
    """The orchestrator refused the span this server claims to serve (409): it was not given those blocks."""


class RegistrationError(RuntimeError):
    """The orchestrator rejected this server's registration (bad budget, name, or model mismatch)."""


class _StopRequested(Exception):
    """Raised inside ``run()`` to leave the serving loop when shutdown was requested while idle."""


@dataclass(frozen=True)
class ServerProfile:
    """What a server tells the orchestrator about itself: name, budget, measured times."""

    name: str
    memory_bytes: float
    tau_p_s: float
    tau_c_s: float
    rtt_s: float
    max_batch_sessions: int = defaults.MAX_BATCH_SESSIONS
    """The most sessions one step batches (``--max-batch-sessions``; 1: PETALS' pool, one at a time)."""
    batch_slowdown: tuple[float, ...] | None = None
    """g(b) = τp(b)/τp(1) for b = 1..max_batch_sessions where the server knows it (an emulated device's)."""
    device: str | None = None
    """The device it emulates (``--emulate-device``), if any."""


def measure_rtt_s(orch: BlockingOrchestrator, samples: int = 5) -> float:
    """Median round trip of GET /health to the orchestrator, seconds (after one warm-up request)."""

    orch.run(lambda c: c.health(), timeout_s=defaults.CALL_TIMEOUT_S)
    rtts = []
    for _ in range(samples):
        t0 = time.perf_counter()
        orch.run(lambda c: c.health(), timeout_s=defaults.CALL_TIMEOUT_S)
        rtts.append(time.perf_counter() - t0)
    return statistics.median(rtts)


def check_against_orchestrator(health: dict[str, Any], sizes: BlockSizes) -> None:
    """SpecError if the orchestrator composes for a different model than this server's checkpoint."""
    model = health.get("model") or {}
    problems = []
    if model.get("num_blocks") not in (None, sizes.num_blocks):
        problems.append(f"{model['num_blocks']} blocks there, {sizes.num_blocks} here")
    for key, mine in (("block_bytes", sizes.block_bytes), ("cache_bytes", sizes.cache_bytes)):
        theirs = model.get(key)
        if theirs is not None and abs(float(theirs) - mine) > 1e-6 * max(mine, 1):
            problems.append(f"{key} {float(theirs):.0f} there, {mine} here")
    if problems:
        raise SpecError(
            f"the orchestrator composes for model {model.get('name')!r} but this checkpoint differs: "
            f"{'; '.join(problems)} (same model, --torch_dtype, --quant_type and --max-length on both sides?)"
        )


class OrchestratedServer(Server):
    """petals' Server serving exactly the span the orchestrator assigns; reloads when it changes."""

    def __init__(
        self,
        *,
        orchestrator: BlockingOrchestrator,
        profile: ServerProfile,
        sizes: BlockSizes,
        fixed_span: tuple[int, int] | None = None,
        heartbeat_period_s: float = defaults.HEARTBEAT_PERIOD_S,
        settle_s: float = defaults.SETTLE_S,
        batching: BatchingConfig | None = None,
        **server_kwargs: Any,
    ) -> None:
        self.orch = orchestrator
        self.profile = profile
        self.sizes = sizes
        self.fixed_span = fixed_span
        self.heartbeat_period_s = heartbeat_period_s
        self.settle_s = settle_s
        self._assignment: AssignmentInfo | None = None
        self._chosen: tuple[int, int] | None = None
        self._pending: tuple[tuple[int, int], float] | None = None  # (new span, first seen) while debouncing
        self._fatal: BaseException | None = None
        self._hb_stop = threading.Event()
        self._hb_thread: threading.Thread | None = None
        self.cache_slots = 0
        install_kv_transfer()  # our handlers: petals' rpcs plus the KV-cache export/import (server/kv_handler.py)
        self.batching = batching if batching is not None else BatchingConfig()
        install_batching(self.batching)  # sessions' steps run together (server/batching.py); 1 session: petals' pool
        # One placeholder block: the real span (and cache size) is set in _choose_blocks, once assigned.
        server_kwargs.setdefault("mean_balance_check_period", max(0.5, heartbeat_period_s / 2))
        super().__init__(num_blocks=1, inference_max_length=sizes.max_length, **server_kwargs)
        self._await_reachability_probe()
        self.peer_id = self.dht.peer_id.to_base58()
        self.visible_maddrs = [str(m) for m in self.dht.get_visible_maddrs()]

    def _await_reachability_probe(self, timeout_s: float = 30.0) -> None:
        """Wait until petals' reachability service has started its probe p2pd: a shutdown requested earlier is
        lost by petals, and that p2pd would outlive the server."""
        rp = self.reachability_protocol
        deadline = time.monotonic() + timeout_s
        while rp is not None and getattr(rp, "probe", None) is None and time.monotonic() < deadline:
            time.sleep(0.05)

    # ---- orchestrator link ----------------------------------------------------------------------

    def register(self) -> AssignmentInfo | None:
        """Register (budget, measured τp and τc, peer id, address); RegistrationError if refused."""
        p = self.profile
        address = self.visible_maddrs[0] if self.visible_maddrs else None

        try:
            a = self.orch.run(lambda c: c.register(p.name, memory_bytes=p.memory_bytes, tau_p_s=p.tau_p_s,
                                                   tau_c_s=p.tau_c_s, peer_id=self.peer_id, address=address,
                                                   max_batch_sessions=p.max_batch_sessions,
                                                   batch_slowdown=p.batch_slowdown, device=p.device),
                              timeout_s=60.0)
        except OrchestratorError as exc:
            raise RegistrationError(f"the orchestrator refused to register server {p.name!r}: {exc.message}") from None
        self._set_assignment(a)
        log.info("registered %r (peer %s): M=%.3g B, tau_p=%.4f s/block, tau_c=%.4f s; assignment %s",
                 p.name, self.peer_id, p.memory_bytes, p.tau_p_s, p.tau_c_s, _span_text(a))
        return a

    def _set_assignment(self, a: AssignmentInfo | None) -> None:
        """Remember the latest assignment (log when its span changed)."""
        old = self._assignment
        self._assignment = a
        if a is not None and old is not None and (old.start, old.end) != (a.start, a.end):
            log.info("assignment changed: %s -> %s", _span_text(old), _span_text(a))

    def serving(self) -> tuple[int, int]:
        """The span served right now: the chosen one once its container is ready, else nothing."""
        mc = self.module_container
        if self._chosen is not None and mc is not None and mc.is_alive() and mc.ready.is_set():
            return self._chosen
        start = self._chosen[0] if self._chosen else 0
        return (start, start)

    def heartbeat_once(self, serving: tuple[int, int] | None = None) -> AssignmentInfo | None:
        """Report liveness and the span served; re-register if the orchestrator forgot or buried us."""
        span = self.serving() if serving is None else serving

        try:
            a = self.orch.run(lambda c: c.heartbeat(self.profile.name, serving=span), timeout_s=defaults.CALL_TIMEOUT_S)
        except OrchestratorError as exc:
            if exc.status == 410 and f"({DRAINED_REASON}" in exc.message:  # drained: our sessions moved, we leave
                log.info("the orchestrator drained this server: leaving")
                self._hb_stop.set()
                self.stop.set()
                return None
            if exc.status in (401, 404, 410):  # orchestrator restarted (forgot us or our secret), or buried us
                log.warning("orchestrator answered %s (%s); registering again", exc.status, exc.message)
                return self.register()
            if exc.status == 409:
                raise ClaimRefusedError(exc.message) from None
            raise
        self._set_assignment(a)
        return a

    def _heartbeat_loop(self) -> None:
        """Heartbeat every heartbeat_period_s until shutdown; a refused claim stops the server."""
        while not self._hb_stop.wait(self.heartbeat_period_s):
            try:
                self.heartbeat_once()
            except ClaimRefusedError as exc:
                if self.fixed_span is not None:
                    self._fail(exc)
                    return
                log.warning("%s; reloading the assigned span", exc)
                try:
                    self._set_assignment(self.orch.run(lambda c: c.assignment(self.profile.name),
                                                       timeout_s=defaults.CALL_TIMEOUT_S))
                except Exception as exc2:  # next heartbeat will try again
                    log.warning("fetching the assignment failed: %s", exc2)
            except Exception as exc:  # orchestrator down for a moment: keep serving, keep trying
                log.warning("heartbeat to %s failed: %s", self.orch.url, exc)

    def _fail(self, exc: BaseException) -> None:
        """Stop serving because of ``exc`` (re-raised from run())."""
        log.error("%s", exc)
        self._fatal = exc
        self.stop.set()

    def start_heartbeats(self) -> None:
        """Start the heartbeat thread (after a successful registration)."""
        self._hb_thread = threading.Thread(target=self._heartbeat_loop, name="orchestrator-heartbeat", daemon=True)
        self._hb_thread.start()

    # ---- petals plug-in points ------------------------------------------------------------------

    def _choose_blocks(self) -> list[int]:
        """Wait for a non-empty assignment (or check the fixed span with the orchestrator); size the cache."""
        if self.fixed_span is not None:
            span = self.fixed_span
            self.heartbeat_once(serving=span)  # raises ClaimRefusedError unless the orchestrator gave us exactly this
        else:
            span = self._wait_for_assignment()
        m = span[1] - span[0]
        self.cache_slots = self.sizes.cache_slots(self.profile.memory_bytes, m)
        if self.cache_slots < 1:
            raise SpecError(
                f"server {self.profile.name!r}: budget {self.profile.memory_bytes:.4g} B holds {m} blocks "
                f"({self.sizes.block_bytes * m:.4g} B) but no cache slot of {self.sizes.cache_bytes} B"
            )
        self.num_blocks = m
        self.attn_cache_bytes = self.cache_slots * self.sizes.cache_alloc_bytes
        install_kv_arena(ArenaLayout(  # c sessions' rows per block, each of --max-length tokens (server/kv_arena.py)
            rows=self.cache_slots // m, pairs=m, length=self.sizes.max_length,
            mode=self.batching.kv_arena if self.batching.enabled and self.cache_slots >= m else "off"))
        self._chosen = span
        used = self.sizes.block_bytes * m + self.cache_slots * self.sizes.cache_bytes
        log.info(
            "serving blocks %s (%d blocks): %d cache slots = %.1f jobs of %d tokens on every block; "
            "s_m*m + s_c*slots = %.4g B <= M = %.4g B",
            span_text(*span), m, self.cache_slots, self.cache_slots / m, self.sizes.max_length, used,
            self.profile.memory_bytes,
        )
        return list(range(span[0], span[1]))

    def _wait_for_assignment(self, poll_s: float = 0.5) -> tuple[int, int]:
        """Poll until the assignment is non-empty and unchanged for settle_s (servers join in bursts)."""
        last: tuple[int, int] | None = None
        since = time.monotonic()
        while True:
            if self.stop.is_set():
                raise _StopRequested()
            try:
                self.heartbeat_once()
            except Exception as exc:  # orchestrator briefly unreachable: keep the last known assignment
                log.warning("polling the assignment failed: %s", exc)
            a = self._assignment
            key = (a.start, a.end) if a is not None and a.end > a.start else None
            now = time.monotonic()
            if key != last:
                last, since = key, now
            elif key is not None and now - since >= self.settle_s:
                return key
            self.stop.wait(poll_s)

    def _should_choose_other_blocks(self) -> bool:
        """Reload when the orchestrator's assignment differs from the span being served (or on a fatal error)."""
        if self._fatal is not None:
            return True
        if self.fixed_span is not None:
            return False
        a = self._assignment
        if a is None or self._chosen is None:
            return False
        target = (a.start, a.end)
        if target == self._chosen:
            self._pending = None
            return False
        # Debounce: a server joining and leaving at once (or a burst of joins) must not make us drop
        # the sessions we are serving; reload only for an assignment that stayed put for settle_s.
        now = time.monotonic()
        if self._pending is None or self._pending[0] != target:
            self._pending = (target, now)
            return False
        if now - self._pending[1] < self.settle_s:
            return False
        log.info("reassigned: %s -> %s; reloading", span_text(*self._chosen), _span_text(a))
        self._pending = None
        return True

    def run(self) -> None:
        """Serve until shutdown; re-raise a fatal error (such as a refused claim) from the heartbeat thread."""
        try:
            super().run()
        except _StopRequested:
            pass
        if self._fatal is not None:
            raise self._fatal

    def drain_self(self, timeout_s: float) -> dict[str, Any] | None:
        """Ask the orchestrator to move every session off this server and wait (at most timeout_s) until it has;
        we keep serving meanwhile. Returns the drain's status (None if the orchestrator could not be asked)."""
        name = self.profile.name
        log.info("draining %s: waiting up to %g s for its sessions to move", name, timeout_s)
        try:
            status = self.orch.run(lambda c: c.drain(name, wait_s=timeout_s, timeout_s=timeout_s),
                                   timeout_s=timeout_s + defaults.CALL_TIMEOUT_S)
        except Exception as exc:  # leave anyway: sessions then fail over
            log.warning("could not drain %s: %s", name, exc)
            return None
        log.info("drained %s: %s", name, status)
        return status

    def shutdown(self, timeout: float | None = 5, *, leave_reason: str | None = "shutting down") -> None:
        """Tell the orchestrator we leave (so it stops offering our chains at once), then stop petals' server."""
        self._hb_stop.set()
        if leave_reason is not None:
            try:
                self.orch.run(lambda c: c.leave(self.profile.name, leave_reason), timeout_s=10.0)
            except Exception as exc:  # the orchestrator may already be gone
                log.warning("could not tell the orchestrator that %r leaves: %s", self.profile.name, exc)
        super().shutdown(timeout)


def _span_text(a: AssignmentInfo | None) -> str:
    """'start:end (vN)' or 'none yet'."""
    if a is None:
        return "none yet"
    return f"{span_text(a.start, a.end)} (v{a.version})" if a.end > a.start else f"no blocks (v{a.version})"


def profile_server(
    orch: BlockingOrchestrator, name: str, memory_bytes: float, tau_p_s: float, workload: Workload, *,
    max_batch_sessions: int = defaults.MAX_BATCH_SESSIONS, batch_slowdown: tuple[float, ...] | None = None,
    device: str | None = None,
) -> ServerProfile:
    """The server's figures: τp as measured, τc = l_out · (RTT + overhead) from the measured RTT, and what it
    enforces (its batching limit, its g(b) where known, the device it emulates)."""
    rtt = measure_rtt_s(orch)
    return ServerProfile(name, memory_bytes, tau_p_s, tau_c(rtt, workload), rtt, max_batch_sessions,
                         batch_slowdown, device)
