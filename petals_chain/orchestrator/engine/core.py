"""The orchestrator's engine: the server registry, the composition and the leases kept consistent.

A registration, a heartbeat that moves a server's times, or a failure leads to a recomposition (by the
:class:`~petals_chain.orchestrator.engine.composition.CompositionPolicy` it was built with), whose chains the lease
manager then offers (only those whose servers are alive and, with ``offer_when_serving``, serve their span).

Every step of a lease runs here, in one place and one order (vLLM's ``EngineCore`` is the model): :meth:`lease`,
:meth:`renew`, :meth:`release`, :meth:`report_failure`, :meth:`migrated` and :meth:`migration_failed` call the lease
manager (the policy decides the chain; the journal it holds persists the change; its counters feed the metrics), the
width rule as an observer, and the trust layer for a failure report. Every method runs on the event loop;
:mod:`petals_chain.orchestrator.http.api` only parses a request, calls one of them and renders the reply.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from petals_chain import defaults
from petals_chain.model import Composition, ServerSpec, SpecError
from petals_chain.orchestrator.engine.chains import ChainInfo, chain_infos
from petals_chain.compose.repair import repair as repaired, restored, worth_replacing
from petals_chain.compose.stable import keep_spans
from petals_chain.orchestrator.engine.compose_runner import ComposeRunner
from petals_chain.orchestrator.engine.composition import CompositionPolicy
from petals_chain.orchestrator.engine.config import OrchestratorConfig
from petals_chain.orchestrator.engine.drain import Drains
from petals_chain.orchestrator.leasing.leases import Lease, LeaseManager
from petals_chain.orchestrator.engine.metrics import new_metrics_registry
from petals_chain.orchestrator.leasing.migration import MigratingLeaseManager
from petals_chain.orchestrator.leasing.policies import LEASE_POLICIES
from petals_chain.orchestrator.state.registry import Registry, ServerRecord
from petals_chain.orchestrator.trust.suspects import reporter_of
from petals_chain.protocol.hop import Hop
from petals_chain.protocol.limits import DRAIN_TIMEOUT_S
from petals_chain.protocol.parsing import BadRequestError
from petals_chain.protocol.replies import LeaseInfo
from petals_chain.protocol.requests import HeartbeatBody, RegisterBody
from petals_chain.orchestrator.trust.belief import Trust

if TYPE_CHECKING:
    from petals_chain.orchestrator.state.persist import Persistence
    from petals_chain.orchestrator.leasing.widths import LeaseWidths

log = logging.getLogger(__name__)


class Orchestrator:
    """Registry, composition and leases kept consistent; every method is called on the event loop."""

    def __init__(
        self,
        registry: Registry,
        config: OrchestratorConfig | None = None,
        *,
        composition_policy: CompositionPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        lease_manager: Callable[..., LeaseManager] = MigratingLeaseManager,
        trust: Trust | None = None,
        widths: LeaseWidths | None = None,
        state: Persistence | None = None,
    ) -> None:
        """``config`` holds the settings (validated), ``composition_policy`` the method's composer with the load it
        sizes the chains for (default: the command line's, ``proposed``); the collaborators are built first and
        handed in, each bound here to this orchestrator: ``trust`` (belief in servers; default: every server
        believed, none cordoned), ``widths`` (--width: the speculative width of each lease that asks for one) and
        ``state`` (--state-dir: the store it restores from and journals into)."""
        self.config = config if config is not None else OrchestratorConfig()
        self.registry = registry
        self.composition_policy = composition_policy if composition_policy is not None else CompositionPolicy()
        # Servers named here keep these τp/τc whatever they report (a profile the operator trusts more than a
        # server's own measurement, e.g. one fitted offline or taken behind emulated WAN delays).
        self.pinned: Mapping[str, ServerSpec] = self.config.pinned
        # Offer a chain only once every server on it reports (by heartbeat) that it serves its span: a lease is
        # never granted on a server still loading its blocks, or one planned from a cluster file but not up yet.
        self.offer_when_serving = self.config.offer_when_serving
        self._composed: list[ChainInfo] = []  # every chain of the current composition
        self._offered: tuple[tuple[tuple[str, int, int], ...], ...] | None = None  # keys offered now
        # JFFC over fixed chains by default; ``lease_manager`` (same keywords) may route otherwise, e.g. WS-RR.
        self.leases = lease_manager(default_ttl_s=self.config.lease_ttl_s, max_waiting=self.config.max_waiting,
                                    clock=clock)
        self.heartbeat_timeout_s = self.config.heartbeat_timeout_s
        self.clock = clock
        self.started_s = clock()
        self.recompositions = 0
        self.repairs = 0  # compositions repaired after servers left or joined (counted in recompositions too)
        self.last_repair_s = math.nan  # how long the last repair took, installing included
        self.repairs_kept = 0  # full recompositions not installed: the repaired one was within the margin
        self.composer = ComposeRunner(self.config.compose_in)
        self._background: set[asyncio.Task] = set()  # recompositions nobody waits for (after a failure report)
        self.http_errors: dict[int, int] = {}
        self._lock = asyncio.Lock()
        self._applied_generation = -1
        # servers being drained: their chains are not offered
        self.draining = Drains(registry, self.leases, reoffer=self._offer, leave=self.server_failed)
        self.trust: Trust = trust if trust is not None else Trust()
        self.trust.bind(self)
        self.widths = widths
        if widths is not None:
            widths.bind(self.leases)
        # Told after every registration and recomposition (it saves the registry), awaited before the API answers.
        self.state = state
        if state is not None:
            state.bind(self)
        # Its own Prometheus registry (several orchestrators may live in one process, as in the tests): GET /metrics
        # renders it; the collector reads the state above at every scrape.
        self.metrics: CollectorRegistry = new_metrics_registry(self)

    @property
    def dht_info(self) -> dict[str, Any] | None:
        """{"initial_peers": [...], "dht_prefix": ...} when it runs a DHT (from the config)."""
        info = self.config.dht_info
        return None if info is None else dict(info)

    @property
    def model_source(self) -> dict[str, Any] | None:
        """With --model: {"source", "torch_dtype", "quant_type", ...} (from the config)."""
        source = self.config.model_source
        return None if source is None else dict(source)

    # ---- composition ----------------------------------------------------------------------------

    def install(self, composition: Composition | None, error: str | None = None) -> int:
        """Make ``composition`` current (registry assignments + offered chains); return its version."""
        version = self.registry.apply(composition, error)
        self._composed = chain_infos(composition, version) if composition is not None else []
        self._offer(force=True)
        self.leases.set_composition(composition, version)  # used by a manager that routes over the placement
        self.recompositions += 1
        if self.state is not None:
            self.state.on_change()
        return version

    def recompose_now(self, keep_held: bool = False) -> int:
        """Recompose synchronously (startup, tests): compute for the live servers and install. With ``keep_held``
        (a restart from the store), the composition the servers' stored spans give is installed instead where the
        full one would not gain enough to send servers loading (compose/repair.py's ``restored`` and
        ``worth_replacing``): the swarm goes on serving what it served before the restart."""
        gen, specs = self.registry.snapshot()
        comp, err = self.composition_policy.try_compose(specs, self.registry.model)
        self._applied_generation = gen
        if comp is not None:
            held = self.registry.held_spans()
            comp = keep_spans(comp, held)
            if keep_held and held:
                try:
                    before = restored(comp.servers, comp.model, held, comp.c)
                except (SpecError, ValueError) as exc:
                    log.warning("the stored spans do not make a composition any more (%s): recomposing", exc)
                else:
                    if not worth_replacing(before, comp, self.composition_policy.arrival_rate):
                        comp = before
        return self.install(comp, err)

    async def recompose(self) -> None:
        """Recompose off the event loop until the composition reflects the latest registry state.

        Servers that left or joined are first repaired into the installed composition, at once and on the loop
        (:meth:`repair`). Concurrent callers share the full work; a result computed from a registry that changed
        meanwhile is thrown away and recomputed, so a dead server is never put back. A full result replaces a
        repaired composition only where compose/repair.py's ``worth_replacing`` says it gains enough.
        """
        self.repair()
        await self._recompose_fully()

    async def _recompose_fully(self) -> None:
        """The full part of :meth:`recompose` (the repair done)."""
        async with self._lock:
            while self._applied_generation < self.registry.generation:
                gen, specs = self.registry.snapshot()
                comp, err = await self.composer.compose(self.composition_policy, specs, self.registry.model)
                if self.registry.generation != gen:
                    continue
                self._applied_generation = gen
                current = self.registry.composition
                if comp is not None:  # interchangeable servers keep the blocks they hold
                    comp = keep_spans(comp, self.registry.held_spans())
                if (comp is not None and current is not None and current.meta.get("repair")
                        and not worth_replacing(current, comp, self.composition_policy.arrival_rate)):
                    self.repairs_kept += 1  # the repaired chains stay: no server is sent loading for little gain
                    self.registry.assign_unplaced()
                    continue
                self.install(comp, err)

    def repair(self) -> bool:
        """Install the composition repaired for the servers that left or joined since it was computed (each chain
        that misses a dead server kept with its leases; compose/repair.py); False if nothing to repair, repair off,
        no composition yet, or more changes than ``defaults.REPAIR_MAX_CHANGES`` (the full recomposition then does
        it all)."""
        comp = self.registry.composition
        if not self.config.repair or comp is None:
            return False
        t0 = time.perf_counter()
        live = {s.name: s for s in self.registry.snapshot()[1]}
        placed = {s.name for s in comp.servers}
        gone = [s.name for s in comp.servers if s.name not in live]
        new = [s for name, s in live.items() if name not in placed]
        if not (gone or new) or len(gone) + len(new) > defaults.REPAIR_MAX_CHANGES:
            return False
        try:
            comp = repaired(comp, gone, new)
        except (SpecError, ValueError) as exc:  # e.g. the model no longer fits: the full recomposition says why
            log.warning("repair for %d gone and %d new servers failed: %s", len(gone), len(new), exc)
            return False
        self.install(comp)
        self.repairs += 1
        self.last_repair_s = time.perf_counter() - t0
        return True

    def close(self) -> None:
        """Release what the orchestrator started outside the event loop (the composer's worker process) and cancel
        the recompositions still running in the background."""
        for task in self._background:
            task.cancel()
        self.composer.close()

    def _ready(self, chain: ChainInfo) -> bool:
        """Every server of the chain is alive (and, with offer_when_serving, serves its span there)."""
        for span in chain.spans:
            if span.server in self.draining:
                return False
            rec = self.registry.servers.get(span.server)
            if rec is None or not rec.alive:
                return False
            if not self.trust.may_offer(span.server, span.start, span.end):
                return False
            if self.offer_when_serving and not (
                rec.serving is not None and rec.serving[0] <= span.start and span.end <= rec.serving[1]
            ):
                return False
        return True

    def _offer(self, *, force: bool = False) -> None:
        """Offer the composed chains that are ready now; leases on a withdrawn chain keep their slot accounting
        and take it up again when the chain comes back (the lease manager matches chains by servers and spans)."""
        ready = [c for c in self._composed if self._ready(c)]
        keys = tuple(c.key for c in ready)
        if force or keys != self._offered:
            self._offered = keys
            self.leases.set_chains(ready or None, self.registry.version)

    def refresh_offer(self) -> None:
        """Offer what is ready now (after something outside the registry changed, e.g. trust in a server)."""
        self._offer()

    @property
    def composed(self) -> list[ChainInfo]:
        """Every chain of the current composition, in its own order (offered or not)."""
        return list(self._composed)

    # ---- servers --------------------------------------------------------------------------------

    async def register(self, body: RegisterBody) -> ServerRecord:
        """Register or refresh a server with what it states about itself (budget, times, batching limit, g(b),
        emulated device); recompose if the live set or its figures changed. A server pinned by the operator's
        cluster file keeps the file's times and g(b)."""
        self.trust.admit(body)  # refused before anything changes (a peer id another server holds, none at all)
        self.draining.forget(body.name)  # a server that comes back after a drain serves again
        spec = self.pinned.get(body.name)
        tau_p, tau_c, memory = body.tau_p_s, body.tau_c_s, body.memory_bytes
        if spec is not None:
            tau_p, tau_c = spec.tau_p_s, spec.tau_c_s
            if math.isclose(memory, spec.memory_bytes, rel_tol=1e-6):
                memory = spec.memory_bytes  # the same budget, rounded on the way: keep the plan's exact figure
        rec, changed = self.registry.register(
            body.name,
            memory,
            tau_p,
            tau_c,
            now_s=self.clock(),
            peer_id=body.peer_id,
            address=body.address,
            batch_slowdown=None if spec is not None else self._stated_slowdown(body),
            max_batch_sessions=body.max_batch_sessions,
            device=body.device,
        )
        if spec is not None and (rec.serial_fraction, rec.batch_slowdown) != (spec.serial_fraction,
                                                                             spec.batch_slowdown):
            # pinned with its times: a server does not measure its σ or τp(b)
            rec.serial_fraction, rec.batch_slowdown = spec.serial_fraction, spec.batch_slowdown
            self.registry.generation += 1
            changed = True
        if self.state is not None:
            self.state.on_change()  # its peer id or address may be new even when the composition stays
        if changed:
            await self.recompose()
        else:
            self._offer()  # a (re)starting server serves nothing yet: its chains wait for its heartbeat
        return rec

    @staticmethod
    def _stated_slowdown(body: RegisterBody) -> tuple[float, ...]:
        """The g(b) a registration states: its table, else g(b) = 1 up to its batching limit (beyond it the extra
        sessions wait for another step: ServerSpec.step_factor)."""
        return body.batch_slowdown if body.batch_slowdown is not None else (1.0,) * body.max_batch_sessions

    async def heartbeat(self, body: HeartbeatBody) -> ServerRecord:
        """A server is alive and serves ``serving``; recompose if its measured times moved a lot (unless pinned)."""
        rec, changed = self.registry.heartbeat(
            body.name,
            now_s=self.clock(),
            serving=body.serving.model_dump() if body.serving is not None else None,
            tau_p_s=body.tau_p_s,
            tau_c_s=body.tau_c_s,
            keep_times=body.name in self.pinned,  # its own figures are checked, the pinned ones kept
        )
        if changed:
            await self.recompose()
        else:
            self._offer()  # it may have finished (or started) loading its span
        return rec

    async def server_failed(self, name: str, reason: str, *, wait: bool = True) -> None:
        """Mark a server dead, stop offering its chains, and recompose without it; with ``wait=False`` only the
        repair happens before returning and the full recomposition runs in the background."""
        if self.registry.mark_dead(name, reason):
            self._offer()  # stop offering its chains at once, before the recomposition lands
            if wait:
                await self.recompose()
            else:
                self.recompose_in_background()

    def recompose_in_background(self) -> None:
        """Repair now (:meth:`repair`), and run :meth:`recompose` as a task that nobody waits for (its failure is
        logged)."""
        self.repair()
        task = asyncio.create_task(self._recompose_fully())
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background recomposition failed", exc_info=task.exception())

    async def drain(self, name: str, *, wait_s: float = 0.0,
                    timeout_s: float = DRAIN_TIMEOUT_S) -> dict[str, Any]:
        """Move every session off server ``name``, then let it leave (docs/migration.md, "Drain")."""
        return await self.draining.start(name, wait_s=wait_s, timeout_s=timeout_s)

    def drain_status(self, name: str) -> dict[str, Any]:
        """Whether server ``name`` is draining, how many sessions are still on it, and whether it has left."""
        return self.draining.status(name)

    # ---- leases: every step of a lease, in one place ----------------------------------------------

    async def lease(self, *, timeout_s: float, ttl_s: float | None = None, client: str | None = None,
                    request_id: str | None = None, k_max: int | None = None) -> Lease:
        """Wait (at most ``timeout_s``) until the policy grants this request a chain; with ``k_max`` (a width rule
        runs: --width) also choose its speculative width. A retry with the same ``request_id`` gets the lease
        already granted to it, or its old place in line."""
        widths = self.widths
        if k_max is not None and widths is None:
            raise BadRequestError("field 'k_max': this orchestrator chooses no speculative widths (start it with "
                                  "--width and --speedup-profile)", ["k_max"])
        if widths is not None:
            widths.arrival()
        lease = await self.leases.acquire(timeout_s=timeout_s, ttl_s=ttl_s, client=client, request_id=request_id)
        if k_max is not None:
            widths.grant(lease, k_max)
        return lease

    def renew(self, lease_id: str, ttl_s: float | None = None) -> tuple[Lease, Lease | None]:
        """Extend a lease's TTL; return it and, if a move of its session was decided (a manager that moves
        sessions), the lease reserved for it on the target chain (the holder moves at its next step boundary)."""
        lease = self.leases.renew(lease_id, ttl_s)
        if self.widths is not None:
            self.widths.renew(lease.lease_id)  # the width may be cut back while units are over-committed
        target = self.leases.offer(lease.lease_id) if self.leases.capabilities.moves_sessions else None
        return lease, target

    def release(self, lease_id: str) -> tuple[Lease, float]:
        """Give a lease's slot back; return it and how long it was held (s)."""
        lease = self.leases.release(lease_id)
        held = self.clock() - lease.granted_s
        if self.widths is not None:
            self.widths.release(lease, held)
        return lease, held

    async def report_failure(
        self, lease_id: str, server: str, *, timeout_s: float, ttl_s: float | None = None
    ) -> Lease:
        """A client's chain broke at ``server``: mark it dead (once the trust layer's probe confirms it), recompose,
        and lease a replacement chain; the request keeps its place in line (ahead of every request after it). Only
        the repair precedes the replacement: the full recomposition runs in the background. A false
        report counts against this request alone (its job), never against a label or an address others share."""
        lease = self.leases.get(lease_id)
        if server not in {s.server for s in lease.chain.spans}:
            on_chain = [s.server for s in lease.chain.spans]
            raise BadRequestError(f"field 'server' = {server!r} is not on lease {lease_id!r}'s chain {on_chain}")
        if await self.trust.confirm_failure(server, reporter_of(lease.job)):
            # the repair replaces the dead chains at once; the client does not wait for the full recomposition
            await self.server_failed(server, f"failure reported by lease {lease_id}", wait=False)
        if self.leases.has(lease_id):  # it may have expired while we recomposed
            self.leases.release(lease_id, failed=True)
        new = await self.leases.acquire(timeout_s=timeout_s, ttl_s=ttl_s or lease.ttl_s, client=lease.client,
                                        replaces=lease_id, resume_job=lease.job)  # keeps its place in line
        if self.widths is not None:
            self.widths.carry(lease_id, new)
        return new

    def migrated(self, lease_id: str, mode: str | None = None, seconds: float | None = None) -> Lease:
        """The holder of ``lease_id`` runs on the lease it was offered: the old one ends; return the new one."""
        lease = self._moving().complete(lease_id, mode, seconds)
        if self.widths is not None:
            self.widths.carry(lease_id, lease)
        return lease

    def migration_failed(self, lease_id: str, mode: str | None = None) -> Lease:
        """The holder could not move: it keeps ``lease_id`` (returned), the reservation on the target ends."""
        return self._moving().fail(lease_id, mode)

    def set_migration_policy(self, policy: str) -> dict[str, Any]:
        """Switch the migration policy (an operator's switch, e.g. plain JFFC against JFFC with migration on one
        swarm); return the migration state."""
        leases = self._moving()
        leases.set_policy(policy, field_name="policy")
        return leases.migration_json()

    def migration_json(self) -> dict[str, Any]:
        """The migration policy, counts and pending moves."""
        return self._moving().migration_json()

    def policies_json(self) -> dict[str, Any]:
        """The registry of live lease policies (leasing/policies.py) and what this orchestrator runs: its lease
        manager's capabilities and, where sessions can move, the migration policy."""
        caps = self.leases.capabilities
        return {"policies": LEASE_POLICIES.to_json(),
                "in_use": {"manager": type(self.leases).__name__,
                           "routes_over_placement": caps.routes_over_placement,
                           "moves_sessions": caps.moves_sessions,
                           "migration": self.leases.migration if caps.moves_sessions else None}}

    def _moving(self) -> MigratingLeaseManager:
        """The lease manager if it moves sessions, else a 400."""
        if not self.leases.capabilities.moves_sessions:
            raise BadRequestError(f"this orchestrator's lease manager ({type(self.leases).__name__}) cannot move "
                                  "sessions")
        return self.leases

    def width_manager(self) -> LeaseWidths:
        """The width rule (--width), else a 400."""
        if self.widths is None:
            raise BadRequestError("this orchestrator chooses no speculative widths (start it with --width and "
                                  "--speedup-profile)")
        return self.widths

    def lease_json(self, lease: Lease) -> dict[str, Any]:
        """A lease as the API returns it (:class:`~petals_chain.protocol.replies.LeaseInfo`): ids, version, timing and
        hops with peer ids and addresses."""
        servers = self.registry.servers
        hops = []
        for s in lease.chain.spans:
            rec = servers.get(s.server)
            hops.append(Hop(s.server, s.start, s.end) if rec is None
                        else Hop(s.server, s.start, s.end, rec.peer_id, rec.address))
        width = self.widths.width(lease.lease_id) if self.widths is not None else None
        return LeaseInfo(spans=tuple(hops), width=width, **self.leases.describe(lease)).to_json()

    # ---- housekeeping ---------------------------------------------------------------------------

    async def sweep(self) -> None:
        """Expire leases nobody renews and servers nobody hears from."""
        self.leases.expire_due()
        if self.heartbeat_timeout_s is not None:
            gone = self.registry.expire(self.clock(), self.heartbeat_timeout_s)
            if gone:
                log.warning("servers without heartbeat marked dead: %s", gone)
                self._offer()  # stop offering their chains at once, before the recomposition lands
                await self.recompose()

    async def run_sweeper(self, interval_s: float = defaults.SWEEP_INTERVAL_S) -> None:
        """Call sweep() every interval_s (or sooner, when a lease is due) until cancelled."""
        while True:
            wait = min(interval_s, max(0.01, self.leases.next_expiry_in_s()))
            await asyncio.sleep(wait)
            try:
                await self.sweep()
            except Exception:  # the sweeper must survive anything and keep freeing capacity
                log.exception("sweep failed")

    def health(self) -> dict[str, Any]:
        """Liveness plus a one-glance summary of the composition and the load."""
        snap = self.leases.snapshot()
        return {
            "status": "ok",
            "version": self.registry.version,
            "composition": self.registry.composition is not None,
            "composition_error": self.registry.error,
            "c": self.registry.composition.c if self.registry.composition is not None else None,
            "servers_registered": len(self.registry.servers),
            "servers_alive": len(self.registry.alive()),
            "chains": len(snap.capacities),
            "chains_composed": len(self._composed),  # more than "chains" while some servers still load
            "capacity": sum(snap.capacities),
            "free": self.leases.free_capacity(),
            "queue_length": snap.queue_length,
            "active_leases": snap.active,
            "orphaned_leases": snap.orphaned,
            "uptime_s": self.clock() - self.started_s,
            "model": {
                "name": self.registry.model.name,
                "num_blocks": self.registry.model.num_blocks,
                "block_bytes": self.registry.model.block_bytes,
                "cache_bytes": self.registry.model.cache_bytes,
            },
            "dht": self.dht_info,
        }
