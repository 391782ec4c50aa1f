"""The orchestrator's Prometheus metrics: one collector that reads its state at every scrape (prometheus_client).

Nothing is counted twice: the lease manager keeps its counters and time histograms, the registry its servers, and
:class:`OrchestratorCollector` turns them into metric families when GET /metrics asks. Each orchestrator has its own
``CollectorRegistry`` (:func:`new_metrics_registry`), so several can live in one process. Names follow Prometheus'
conventions: the ``petals_chain_`` prefix, units in the name (``_seconds``, ``_bytes``), ``_total`` only on counters
(added by the library), never on gauges.

Label sets stay bounded however often the swarm recomposes:

* chains are labelled by their position in the current composition (``chain="0"`` is its first chain, the index
  JFFC orders them by), not by the version-bearing chain id (``v7.0``) the API hands out, which would start a new
  series at every recomposition, nor by the servers on the chain, whose combinations are many. A scrape holds one
  series per chain composed now; the series of a position is reused by whichever chain takes it next;
* servers are labelled by name (the registry keeps every server that ever registered, and a name is stable across
  restarts); their state is a StateSet (``planned``, ``loading``, ``serving``, ``idle``, ``dead``).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from importlib import metadata
from typing import TYPE_CHECKING, Protocol

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from petals_chain.compose.capacity import cache_slots
from petals_chain.model import Composition
from petals_chain.orchestrator.leasing.leases import TimeHistogram
from petals_chain.orchestrator.leasing.migration import REASONS, UNKNOWN_MODE
from petals_chain.orchestrator.state.registry import ServerRecord
from petals_chain.protocol.requests import MOVE_MODES

if TYPE_CHECKING:
    from petals_chain.orchestrator.engine.chains import ChainInfo
    from petals_chain.orchestrator.leasing.leases import LeaseManager
    from petals_chain.orchestrator.leasing.widths import LeaseWidths
    from petals_chain.orchestrator.state.registry import Registry

PREFIX = "petals_chain"
SERVER_STATES = ("planned", "loading", "serving", "idle", "dead")


@functools.lru_cache(maxsize=1)
def package_version() -> str:
    """The installed petals_chain version ('unknown' when run from a tree that was never installed)."""
    try:
        return metadata.version("petals_chain")
    except metadata.PackageNotFoundError:
        return "unknown"


def server_state(rec: ServerRecord) -> str:
    """One of SERVER_STATES: dead; planned (from a cluster file, never heard from); idle (no blocks assigned);
    serving (it reports serving its whole assigned span); loading (blocks assigned, not all served yet)."""
    if not rec.alive:
        return "dead"
    if rec.last_heartbeat_s is None:
        return "planned"
    if rec.assignment is None or rec.assignment.num_blocks == 0:
        return "idle"
    if rec.serving is not None and rec.serving[0] <= rec.assignment.start and rec.assignment.end <= rec.serving[1]:
        return "serving"
    return "loading"


def cache_slots_by_server(comp: Composition | None) -> dict[str, int]:
    """M~_j = floor((M_j - s_m m_j) / s_c) of every server of the composition: cache slots left after its blocks."""
    if comp is None:
        return {}
    return {s.name: n for s, n in zip(comp.servers, cache_slots(comp.servers, comp.model, comp.placement))}


def _buckets(hist: TimeHistogram) -> list[tuple[str, int]]:
    """A TimeHistogram's per-bucket counts as Prometheus' cumulative buckets, ending with +Inf."""
    bounds = [floatToGoString(b) for b in hist.buckets_s] + ["+Inf"]
    return list(zip(bounds, itertools.accumulate(hist.counts)))


def _histogram(name: str, doc: str, hist: TimeHistogram) -> HistogramMetricFamily:
    """A TimeHistogram as a Prometheus histogram."""
    return HistogramMetricFamily(name, doc, buckets=_buckets(hist), sum_value=hist.sum_s, unit="seconds")


class EngineView(Protocol):
    """What the collector reads from the engine at scrape time (the engine satisfies it; this module never imports
    it)."""

    registry: Registry
    leases: LeaseManager
    widths: LeaseWidths | None
    recompositions: int
    repairs: int
    repairs_kept: int
    http_errors: dict[int, int]

    @property
    def composed(self) -> list[ChainInfo]:
        """Every chain of the current composition."""


class OrchestratorCollector(Collector):
    """Reads an orchestrator's leases, registry and composition at scrape time (see the module docstring)."""

    def __init__(self, orch: EngineView) -> None:
        self._orch = orch

    def collect(self) -> Iterator[Metric]:
        """Every family, in a stable order."""
        yield from self._summary()
        yield from self._counters()
        yield from self._servers()
        yield from self._chains()
        yield from self._migrations()
        yield from self._widths()

    def _summary(self) -> Iterator[Metric]:
        """The one-glance gauges and the info metric."""
        orch = self._orch
        snap = orch.leases.snapshot()
        comp = orch.registry.composition
        gauges = (
            ("queue_length", "Requests waiting in the central FIFO queue.", snap.queue_length),
            ("active_leases", "Leases currently held.", snap.active),
            ("orphaned_leases", "Held leases whose chain left the composition (their slots are not re-offered).",
             snap.orphaned),
            ("capacity", "Sum of the capacities c_k of the chains offered now.", sum(snap.capacities)),
            ("capacity_free", "Free slots across the chains offered now.", orch.leases.free_capacity()),
            ("chains", "Chains offered now.", len(snap.capacities)),
            ("chains_composed", "Chains of the current composition (more than offered while servers load).",
             len(orch.composed)),
            ("composition_version", "Version of the current composition.", orch.registry.version),
            ("servers_registered", "Servers in the registry, alive or dead.", len(orch.registry.servers)),
            ("servers_alive", "Servers alive in the registry.", len(orch.registry.alive())),
        )
        for name, doc, value in gauges:
            yield GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=value)
        yield InfoMetricFamily(
            f"{PREFIX}_orchestrator",
            "The petals_chain version, the model, and the current composition's version and reserved concurrency c.",
            value={
                "version": package_version(),
                "model": orch.registry.model.name,
                "composition_version": str(orch.registry.version),
                "c": str(comp.c) if comp is not None else "",
            },
        )

    def _counters(self) -> Iterator[Metric]:
        """Lease events, recompositions, HTTP errors, and the waiting and holding time histograms."""
        orch = self._orch
        cnt = orch.leases.counters
        counters = (
            ("lease_requests", "Lease requests received.", cnt.requested),
            ("leases_granted", "Leases granted.", cnt.granted),
            ("leases_released", "Leases released by their client.", cnt.released),
            ("leases_expired", "Leases expired because their client stopped renewing.", cnt.expired),
            ("leases_failed", "Leases ended by a reported server failure.", cnt.failed),
            ("leases_abandoned", "Leases granted to a client that had already gone (handed back).", cnt.abandoned),
            ("lease_waits_cancelled", "Waiting requests whose client disconnected.", cnt.cancelled),
            ("lease_waits_timed_out", "Waiting requests that hit their timeout.", cnt.timed_out),
            ("recompositions", "Compositions installed.", orch.recompositions),
            ("repairs", "Compositions repaired at once after servers left or joined (among those installed).",
             orch.repairs),
            ("repairs_kept", "Full recompositions not installed because the repaired composition was within the "
             "margin.", orch.repairs_kept),
        )
        for name, doc, value in counters:
            yield CounterMetricFamily(f"{PREFIX}_{name}", doc, value=value)
        errors = CounterMetricFamily(f"{PREFIX}_http_errors", "HTTP error responses by status.", labels=["status"])
        for status, n in sorted(orch.http_errors.items()):
            errors.add_metric([str(status)], n)
        yield errors
        yield _histogram(f"{PREFIX}_wait_seconds", "Time a lease request waited for a chain.", orch.leases.wait_hist)
        yield _histogram(f"{PREFIX}_service_seconds", "Time a lease was held (granted to release or expiry).",
                         orch.leases.service_hist)

    def _servers(self) -> Iterator[Metric]:
        """Per server: blocks assigned and served, cache slots and those in use, memory, times, state."""
        orch = self._orch
        records = list(orch.registry.servers.values())
        slots = cache_slots_by_server(orch.registry.composition)
        in_use: dict[str, int] = {}
        for lease in orch.leases.leases():
            for span in lease.chain.spans:
                in_use[span.server] = in_use.get(span.server, 0) + span.end - span.start
        families = {
            "blocks_assigned": GaugeMetricFamily(
                f"{PREFIX}_server_blocks_assigned", "Blocks the current composition gives the server.",
                labels=["server"]),
            "blocks_served": GaugeMetricFamily(
                f"{PREFIX}_server_blocks_served", "Blocks the server last reported serving (0 while it loads).",
                labels=["server"]),
            "cache_slots": GaugeMetricFamily(
                f"{PREFIX}_server_cache_slots", "Cache slots (one block for one job) left after its blocks: M~_j.",
                labels=["server"]),
            "cache_slots_in_use": GaugeMetricFamily(
                f"{PREFIX}_server_cache_slots_in_use", "Cache slots held by active leases (their blocks there).",
                labels=["server"]),
            "memory_bytes": GaugeMetricFamily(
                f"{PREFIX}_server_memory_bytes", "Memory budget the server registered with.", labels=["server"],
                unit="bytes"),
            "block_time_seconds": GaugeMetricFamily(
                f"{PREFIX}_server_block_time_seconds", "Time per block per token, tau_p, used by the composition.",
                labels=["server"], unit="seconds"),
            "rtt_seconds": GaugeMetricFamily(
                f"{PREFIX}_server_rtt_seconds", "Communication time, tau_c, used by the composition.",
                labels=["server"], unit="seconds"),
        }
        state = StateSetMetricFamily(f"{PREFIX}_server_state", "What the server is doing now.", labels=["server"])
        for rec in records:
            served = rec.serving[1] - rec.serving[0] if rec.serving is not None else 0
            values = {
                "blocks_assigned": rec.assignment.num_blocks if rec.assignment is not None else 0,
                "blocks_served": served,
                "cache_slots": slots.get(rec.name, 0),
                "cache_slots_in_use": in_use.get(rec.name, 0),
                "memory_bytes": rec.memory_bytes,
                "block_time_seconds": rec.tau_p_s,
                "rtt_seconds": rec.tau_c_s,
            }
            for key, family in families.items():
                family.add_metric([rec.name], values[key])
            now = server_state(rec)
            state.add_metric([rec.name], {s: s == now for s in SERVER_STATES})
        yield from families.values()
        yield state

    def _chains(self) -> Iterator[Metric]:
        """Per chain of the current composition, labelled by its position: capacity, occupancy, T_k, offered."""
        orch = self._orch
        snap = orch.leases.snapshot()
        busy = {id(c): z for c, z in zip(snap.chains, snap.occupancy)}  # offered chains are the composed objects
        capacity = GaugeMetricFamily(f"{PREFIX}_chain_capacity", "Capacity c_k of each chain.", labels=["chain"])
        occupancy = GaugeMetricFamily(f"{PREFIX}_chain_occupancy", "Leases in service on each chain.",
                                      labels=["chain"])
        service = GaugeMetricFamily(f"{PREFIX}_chain_service_time_seconds", "Service time T_k of each chain.",
                                    labels=["chain"], unit="seconds")
        offered = GaugeMetricFamily(
            f"{PREFIX}_chain_offered",
            "1 while the chain is offered to lease requests, else 0 (a server on it is down or still loading).",
            labels=["chain"])
        for k, chain in enumerate(orch.composed):
            label = [str(k)]
            capacity.add_metric(label, chain.capacity)
            occupancy.add_metric(label, busy.get(id(chain), 0))
            service.add_metric(label, chain.service_time_s)
            offered.add_metric(label, 1 if id(chain) in busy else 0)
        yield from (capacity, occupancy, service, offered)

    def _widths(self) -> Iterator[Metric]:
        """With --width: the widths chosen so far and held now, the measured load and the units (none without)."""
        widths = self._orch.widths
        if widths is None:
            return
        view = widths.to_json()
        chosen = CounterMetricFamily(f"{PREFIX}_width_chosen", "Speculative widths handed out in lease replies.",
                                     labels=["width"])
        active = GaugeMetricFamily(f"{PREFIX}_width_active_leases", "Speculative leases held now, by width.",
                                   labels=["width"])
        for k in range(1, widths.rule.speedup.d + 1):
            chosen.add_metric([str(k)], view["chosen"].get(str(k), 0))
            active.add_metric([str(k)], view["active"].get(str(k), 0))
        yield chosen
        yield active
        yield GaugeMetricFamily(f"{PREFIX}_width_load", "Measured load lambda of the width rule (width-1 work per "
                                "unit).", value=view["load"])
        yield GaugeMetricFamily(f"{PREFIX}_width_units", "Width units: the slots of the chains offered.",
                                value=view["units"])
        yield GaugeMetricFamily(f"{PREFIX}_width_units_in_use", "Width units held by leases (a speculative one its "
                                "width, any other one).", value=view["units_in_use"])
        yield InfoMetricFamily(f"{PREFIX}_width", "The width policy (--width) and its simulator scheme.",
                               value={"policy": view["policy"], "scheme": view["scheme"] or ""})


    def _migrations(self) -> Iterator[Metric]:
        """Moves of running sessions between chains (docs/migration.md): offered, committed, rolled back and dropped
        by reason (and, once the holder says, by mode), the move times holders reported, and the slots reserved now.
        Every reason and mode has its series from the start (zeros), so rates need no absent-series handling."""
        leases = self._orch.leases
        if not leases.capabilities.moves_sessions:
            return
        counts = leases.moves.by_label
        modes = (*MOVE_MODES, UNKNOWN_MODE)
        families = (
            ("offered", "migrations_offered", "Moves decided and offered to the holder (a slot reserved).", False),
            ("completed", "migrations_committed", "Moves the holder carried out (the old lease ended).", True),
            ("failed", "migrations_rolled_back", "Moves that failed; the session stayed on its old chain.", True),
            ("dropped", "migrations_dropped", "Moves given up because the session ended before it moved.", False),
        )
        for event, name, doc, by_mode in families:
            family = CounterMetricFamily(f"{PREFIX}_{name}", doc, labels=["reason", "mode"] if by_mode else ["reason"])
            for reason in REASONS:
                if by_mode:
                    for mode in modes:
                        family.add_metric([reason, mode], counts[(event, reason, mode)])
                else:
                    family.add_metric([reason], counts[(event, reason, "")])
            yield family
        hist = HistogramMetricFamily(f"{PREFIX}_migration_seconds",
                                     "Time a move held its session, as the holder reported it, by mode.",
                                     labels=["mode"], unit="seconds")
        for mode in modes:
            h = leases.moves.seconds.get(mode) or TimeHistogram()
            hist.add_metric([mode], _buckets(h), h.sum_s)
        yield hist
        yield GaugeMetricFamily(f"{PREFIX}_migration_slots_reserved",
                                "Slots reserved now for moves offered and not yet taken or given back.",
                                value=leases.reserved())


def new_metrics_registry(orch: EngineView) -> CollectorRegistry:
    """A registry holding the orchestrator's collector and the process, platform and GC collectors."""
    registry = CollectorRegistry()  # no describe-by-collect: nothing is read from the orchestrator until a scrape
    registry.register(OrchestratorCollector(orch))
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry
