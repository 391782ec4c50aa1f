"""The serving methods of the overall comparison (paper §4.1.3; docs/model.md, "Baselines"), simulated alike.

Which methods there are, how each places blocks and routes requests, is the table
:data:`petals_chain.compose.method_table.METHODS`; this module turns an entry into a simulated system:
fixed chains under JFFC, PETALS' per-request routing with backoff, or BPRR's WS-RR routing
(:mod:`.baselines`) with the job sizes the scheduler believes (``estimate``).
:func:`build_system` + :func:`simulate_system` split building from simulating; :func:`run_method`
does both. A method that cannot serve the model on these servers raises :class:`InfeasibleError`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from petals_chain import defaults
from petals_chain.compose.capacity import cache_slots
from petals_chain.compose.method_table import Method, Routing, get_method
from petals_chain.compose.petals_default import DEFAULT_CACHE_JOBS
from petals_chain.compose.routes import RouteGraph
from petals_chain.model import Chain, ModelSpec, Placement, ServerSpec, SpecError, validate_servers
from petals_chain.sim.baselines import simulate_bprr, simulate_petals
from petals_chain.sim.engine import SimResult, simulate
from petals_chain.sim.load_dependent import run_load_dependent
from petals_chain.sim.workloads import Workload

PETALS_CACHE_MODES = ("attn", "memory")


@dataclass(frozen=True)
class System:
    """A built system: its placement and either fixed chains (JFFC) or a routing graph (PETALS, BPRR)."""

    method: str
    placement: Placement
    chains: tuple[Chain, ...] = ()
    graph: RouteGraph | None = None
    info: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def _check(method: str, arrival_rate: float, target_load: float) -> Method:
    """The method's table entry; SpecError for an unknown method, λ ≤ 0 or ρ̄ outside (0, 1)."""
    entry = get_method(method)
    if not arrival_rate > 0:
        raise SpecError(f"{method}: arrival_rate must be > 0 jobs/s, got {arrival_rate!r}")
    if not 0 < target_load < 1:
        raise SpecError(f"{method}: target_load must be in (0, 1), got {target_load!r}")
    return entry


def petals_slots(servers: Sequence[ServerSpec], model: ModelSpec, placement: Placement, cache: str = "attn",
                 cache_jobs: int = DEFAULT_CACHE_JOBS) -> list[int]:
    """Cache slots of PETALS servers: "attn" = its fixed attention cache (cache_jobs sessions over the span,
    capped by memory), "memory" = all memory left after the blocks (M̃_j, eq. 3)."""
    if cache not in PETALS_CACHE_MODES:
        raise SpecError(f"petals: cache must be one of {PETALS_CACHE_MODES}, got {cache!r}")
    left = cache_slots(servers, model, placement)
    if cache == "memory":
        return left
    return [min(cache_jobs * m, s) for m, s in zip(placement.num_blocks, left)]


def build_system(method: str, servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float,
                 target_load: float = defaults.TARGET_LOAD, *, petals_cache: str = "attn") -> System:
    """Place blocks (and compose chains, or prepare routing) the way ``method`` does."""
    m = _check(method, arrival_rate, target_load)
    servers = validate_servers(servers)
    comp = m.compose(servers, model, arrival_rate, target_load)
    if m.routing is Routing.JFFC:
        info = {"c": comp.c} if m.tunes_c else {}
        return System(method, comp.placement, comp.chains, info=info | {"chains": len(comp.chains),
                                                                        "capacity": comp.total_capacity})
    if m.routing is Routing.PETALS:
        slots = petals_slots(servers, model, comp.placement, petals_cache)
        graph = RouteGraph.build(servers, model, comp.placement, slots)
        return System(method, comp.placement, graph=graph, info={"cache": petals_cache, "slots": sum(slots)})
    graph = RouteGraph.build(servers, model, comp.placement)
    return System(method, comp.placement, graph=graph,
                  info=dict(comp.meta) | {"slots": int(graph.slots.sum()), "estimate": m.estimate})


def simulate_system(system: System, workload: Workload, warmup_jobs: int = 0) -> SimResult:
    """Simulate a built system on ``workload`` (chains under JFFC, or per-request routing)."""
    if system.graph is None:
        if any(ch.load_rates for ch in system.chains) and workload.service_s is None:
            return run_load_dependent(system.chains, workload, warmup_jobs)  # servers that slow with their batch
        return simulate([ch.rate_per_s for ch in system.chains], [ch.capacity for ch in system.chains], workload,
                        "JFFC", warmup_jobs=warmup_jobs)
    if get_method(system.method).routing is Routing.PETALS:
        return simulate_petals(system.graph, workload, warmup_jobs)
    return simulate_bprr(system.graph, workload, warmup_jobs, estimate=system.info.get("estimate", "mean"))


def run_method(method: str, servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float,
               workload: Workload, *, warmup_jobs: int = 0, target_load: float = defaults.TARGET_LOAD) -> SimResult:
    """Build ``method`` for these servers and simulate it on ``workload``."""
    return simulate_system(build_system(method, servers, model, arrival_rate, target_load), workload, warmup_jobs)
