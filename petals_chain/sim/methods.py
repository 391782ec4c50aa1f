"""The four whole systems of the overall comparison (paper §4.1.3, spec §4), built and simulated uniformly.

``proposed``: GBP-CR(c*) + GCA with c* tuned by the Theorem 3.7 lower bound, JFFC dispatch.
``jffc_only``: every server that holds all L blocks is a one-server chain, JFFC dispatch.
``petals``: PETALS' block selection and its per-request routing with backoff (:mod:`.system`).
``bprr``: CG-BP placement for R = min(round(λT₁ + √(λT₁)), R_max) and WS-RR routing (:mod:`.system`),
the scheduler estimating waits with mean job sizes; ``bprr_oracle``: the same, told every job's exact size.

Each method is one function ``f(servers, model, arrival_rate, workload, *, warmup_jobs, target_load)
-> SimResult``; :func:`build_system` + :func:`simulate_system` split building from simulating.
A method that cannot serve the model on these servers raises :class:`InfeasibleError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from petals_chain.compose.bprr import bprr_concurrency, cg_bp
from petals_chain.compose.capacity import cache_slots
from petals_chain.compose.petals_default import DEFAULT_CACHE_JOBS, petals_placement
from petals_chain.compose.routes import RouteGraph
from petals_chain.compose.tuning import compose
from petals_chain.compose.whole_model import whole_model_composition
from petals_chain.model import Chain, ModelSpec, Placement, ServerSpec, SpecError, validate_servers
from petals_chain.sim.engine import SimResult, simulate
from petals_chain.sim.baselines import simulate_bprr, simulate_petals
from petals_chain.sim.workloads import Workload

METHODS: tuple[str, ...] = ("proposed", "jffc_only", "petals", "bprr", "bprr_oracle")
LABELS: dict[str, str] = {"proposed": "proposed (GBP-CR + GCA + JFFC)", "jffc_only": "JFFC only",
                          "petals": "PETALS", "bprr": "BPRR", "bprr_oracle": "BPRR (exact sizes)"}
PETALS_CACHE_MODES = ("attn", "memory")


@dataclass(frozen=True)
class System:
    """A built system: its placement and either fixed chains (JFFC) or a routing graph (PETALS, BPRR)."""

    method: str
    placement: Placement
    chains: tuple[Chain, ...] = ()
    graph: RouteGraph | None = None
    info: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def _check(method: str, arrival_rate: float, target_load: float) -> None:
    """Raise SpecError for an unknown method, λ ≤ 0 or ρ̄ outside (0, 1)."""
    if method not in METHODS:
        raise SpecError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if not arrival_rate > 0:
        raise SpecError(f"{method}: arrival_rate must be > 0 jobs/s, got {arrival_rate!r}")
    if not 0 < target_load < 1:
        raise SpecError(f"{method}: target_load must be in (0, 1), got {target_load!r}")


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
                 target_load: float = 0.7, *, petals_cache: str = "attn") -> System:
    """Place blocks (and compose chains, or prepare routing) the way ``method`` does."""
    _check(method, arrival_rate, target_load)
    servers = validate_servers(servers)
    if method == "proposed":
        comp = compose(servers, model, arrival_rate, target_load)
        return System(method, comp.placement, comp.chains, info={"c": comp.c, "chains": len(comp.chains),
                                                                 "capacity": comp.total_capacity})
    if method == "jffc_only":
        comp = whole_model_composition(servers, model)
        return System(method, comp.placement, comp.chains, info={"chains": len(comp.chains),
                                                                 "capacity": comp.total_capacity})
    if method == "petals":
        placement = petals_placement(servers, model)
        slots = petals_slots(servers, model, placement, petals_cache)
        graph = RouteGraph.build(servers, model, placement, slots)
        return System(method, placement, graph=graph, info={"cache": petals_cache, "slots": sum(slots)})
    r = bprr_concurrency(servers, model, arrival_rate)
    placement = cg_bp(servers, model, r)
    graph = RouteGraph.build(servers, model, placement)
    estimate = "exact" if method == "bprr_oracle" else "mean"
    return System(method, placement, graph=graph, info={"R": r, "slots": int(graph.slots.sum()), "estimate": estimate})


def simulate_system(system: System, workload: Workload, warmup_jobs: int = 0) -> SimResult:
    """Simulate a built system on ``workload`` (chains under JFFC, or per-request routing)."""
    if system.graph is None:
        return simulate([ch.rate_per_s for ch in system.chains], [ch.capacity for ch in system.chains], workload,
                        "JFFC", warmup_jobs=warmup_jobs)
    if system.method == "petals":
        return simulate_petals(system.graph, workload, warmup_jobs)
    return simulate_bprr(system.graph, workload, warmup_jobs, estimate=system.info.get("estimate", "mean"))


def run_method(method: str, servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float,
               workload: Workload, *, warmup_jobs: int = 0, target_load: float = 0.7) -> SimResult:
    """Build ``method`` for these servers and simulate it on ``workload``."""
    return simulate_system(build_system(method, servers, model, arrival_rate, target_load), workload, warmup_jobs)


def proposed(servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float, workload: Workload, *,
             warmup_jobs: int = 0, target_load: float = 0.7) -> SimResult:
    """GBP-CR(c*) + GCA + JFFC, c* by the Theorem 3.7 lower bound."""
    return run_method("proposed", servers, model, arrival_rate, workload, warmup_jobs=warmup_jobs,
                      target_load=target_load)


def jffc_only(servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float, workload: Workload, *,
              warmup_jobs: int = 0, target_load: float = 0.7) -> SimResult:
    """Whole-model one-server chains + JFFC (InfeasibleError if no server fits the model)."""
    return run_method("jffc_only", servers, model, arrival_rate, workload, warmup_jobs=warmup_jobs,
                      target_load=target_load)


def petals(servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float, workload: Workload, *,
           warmup_jobs: int = 0, target_load: float = 0.7) -> SimResult:
    """PETALS placement + min-latency routing with alloc penalty and backoff retries."""
    return run_method("petals", servers, model, arrival_rate, workload, warmup_jobs=warmup_jobs,
                      target_load=target_load)


def bprr(servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float, workload: Workload, *,
         warmup_jobs: int = 0, target_load: float = 0.7) -> SimResult:
    """BPRR: CG-BP(R) placement + WS-RR routing with mean-size wait estimates."""
    return run_method("bprr", servers, model, arrival_rate, workload, warmup_jobs=warmup_jobs,
                      target_load=target_load)


def bprr_oracle(servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float, workload: Workload, *,
                warmup_jobs: int = 0, target_load: float = 0.7) -> SimResult:
    """BPRR with WS-RR told every job's exact size (an optimistic bound on BPRR)."""
    return run_method("bprr_oracle", servers, model, arrival_rate, workload, warmup_jobs=warmup_jobs,
                      target_load=target_load)


RUNNERS: dict[str, Callable[..., SimResult]] = {"proposed": proposed, "jffc_only": jffc_only, "petals": petals,
                                                "bprr": bprr, "bprr_oracle": bprr_oracle}
