"""The serving methods, defined once: what each places, how its requests are routed, what it is called.

The simulator (:mod:`petals_chain.sim.systems`), the orchestrator (``--method``), the live testbed
(:mod:`petals_chain.launch.live_methods`) and the experiments all read :data:`METHODS`. A method is a
composer (placement, and chains where it has fixed ones) plus the way requests reach servers:

* ``Routing.JFFC``: fixed chains, one lease per request from a central queue by JFFC;
* ``Routing.WS_RR``: no fixed chains; the scheduler routes every request over the placement by WS-RR
  (BPRR, Sun et al., Performance Evaluation 2025);
* ``Routing.PETALS``: PETALS' own client-side routing with its backoff (no orchestrator at all).

Three compositions share JFFC routing: ``proposed`` (the default users get: c and the chains chosen
together, by the Theorem 3.7 bounds and the estimated JFFC mean), ``paper`` (the paper's Algorithm 1
exactly, for reproduction) and ``max-chains`` (GBP-CR forming every chain the servers allow).

Adding a variant is one more :class:`Method` entry in :data:`METHODS`.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from petals_chain import defaults
from petals_chain.model import Composition, ModelSpec, ServerSpec, SpecError


class Composer(Protocol):
    """Places blocks for a method: (servers, model, λ, ρ̄, c, tune) -> Composition (no chains if it routes)."""

    def __call__(self, servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float,
                 target_load: float = defaults.TARGET_LOAD, c: int | None = None,
                 tune: str = "lower") -> Composition: ...


class Routing(str, enum.Enum):
    """How a method's requests reach servers."""

    JFFC = "jffc"  # fixed chains; JFFC leases from one central queue
    WS_RR = "ws_rr"  # a WS-RR route per request over the placement
    PETALS = "petals"  # PETALS' own client routing; no orchestrator


ESTIMATES = ("mean", "exact")


def proposed_composition(servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float,
                         target_load: float = defaults.TARGET_LOAD, c: int | None = None,
                         tune: str = "lower") -> Composition:
    """The default: c and the chains chosen together by the Theorem 3.7 bounds and the estimated mean
    (compose/joint.py)."""
    from petals_chain.compose.joint import joint_compose

    return joint_compose(servers, model, arrival_rate, target_load, c=c, tune=tune)


def paper_composition(servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float,
                      target_load: float = defaults.TARGET_LOAD, c: int | None = None,
                      tune: str = "lower") -> Composition:
    """Algorithm 1 as the paper writes it (stop once the rate is met) + GCA, c given or tuned by ``tune``."""
    from petals_chain.compose.tuning import compose

    return compose(servers, model, arrival_rate, target_load, c=c, tune=tune)


def max_chains_composition(servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float,
                           target_load: float = defaults.TARGET_LOAD, c: int | None = None,
                           tune: str = "lower") -> Composition:
    """GBP-CR forming every chain the servers allow + GCA, c given or tuned by ``tune``."""
    from petals_chain.compose.tuning import compose

    return compose(servers, model, arrival_rate, target_load, c=c, tune=tune, max_chains=True)


def whole_model_chains(servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float,
                       target_load: float = defaults.TARGET_LOAD, c: int | None = None,
                       tune: str = "lower") -> Composition:
    """Every server that holds all L blocks is a one-server chain (InfeasibleError if none can)."""
    from petals_chain.compose.whole_model import whole_model_composition

    return whole_model_composition(servers, model)


def bprr_placement(servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float,
                   target_load: float = defaults.TARGET_LOAD, c: int | None = None,
                   tune: str = "lower") -> Composition:
    """CG-BP for BPRR's R = min(round(λT₁ + √(λT₁)), R_max); no chains (``c`` and ``meta["R"]`` hold R)."""
    from petals_chain.compose.bprr import bprr_concurrency, cg_bp

    r = bprr_concurrency(servers, model, arrival_rate)
    return Composition(tuple(servers), model, cg_bp(servers, model, r), (), c=r, meta={"R": r})


def petals_composition(servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float,
                  target_load: float = defaults.TARGET_LOAD, c: int | None = None,
                  tune: str = "lower") -> Composition:
    """PETALS' own block selection (its attention cache for a fixed number of sessions); no chains."""
    from petals_chain.compose.petals_default import petals_placement

    return Composition(tuple(servers), model, petals_placement(servers, model), ())


def petals_capped_composition(servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float,
                              target_load: float = defaults.TARGET_LOAD, c: int | None = None,
                              tune: str = "lower") -> Composition:
    """PETALS as the chain-serving authors modelled it: a low-end server's span capped (AUTHORS_LOW_END_SPAN)."""
    from petals_chain.compose.petals_default import AUTHORS_LOW_END_SPAN, petals_placement

    placement = petals_placement(servers, model, low_end_span=AUTHORS_LOW_END_SPAN)
    return Composition(tuple(servers), model, placement, ())


@dataclass(frozen=True)
class Method:
    """One serving method: its name, labels, composer and routing (see the module docstring)."""

    name: str
    label: str  # short, for table columns
    legend: str  # longer, for figure legends
    routing: Routing
    compose: Composer
    tunes_c: bool = False  # its composer uses the orchestrator's --c / --tune
    estimate: str = "mean"  # WS-RR: the scheduler believes mean job sizes, or is told the exact ones
    sim_only: str = ""  # why it runs in the simulator only ("" when it runs live too)

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("_", "").replace("-", "").isalnum():
            raise SpecError(f"method field 'name' must be letters, digits, '_' or '-', got {self.name!r}")
        if not isinstance(self.routing, Routing):
            raise SpecError(f"method {self.name}: field 'routing' must be a Routing, got {self.routing!r}")
        if self.estimate not in ESTIMATES:
            raise SpecError(f"method {self.name}: field 'estimate' must be one of {ESTIMATES}, got {self.estimate!r}")

    @property
    def orchestrated(self) -> bool:
        """Served through the orchestrator's leases (PETALS routes by itself)."""
        return self.routing is not Routing.PETALS

    @property
    def live(self) -> bool:
        """Runs on real servers (testbed, orchestrator), not only in the simulator."""
        return not self.sim_only


METHODS: Mapping[str, Method] = MappingProxyType({m.name: m for m in (
    Method("proposed", "proposed", "proposed (c and chains by bounds + estimated mean, JFFC)", Routing.JFFC,
           proposed_composition, tunes_c=True),
    Method("paper", "paper", "paper (Algorithm 1 as written + GCA + JFFC)", Routing.JFFC, paper_composition,
           tunes_c=True),
    Method("max-chains", "max-chains", "max-chains (GBP-CR, every chain + GCA + JFFC)", Routing.JFFC,
           max_chains_composition, tunes_c=True),
    Method("jffc_only", "JFFC only", "JFFC only", Routing.JFFC, whole_model_chains),
    Method("petals", "PETALS", "PETALS", Routing.PETALS, petals_composition),
    Method("petals_capped", "PETALS (authors)", "PETALS as the authors modelled it (low-end span ≤ 4 blocks)",
           Routing.PETALS, petals_capped_composition,
           sim_only="the span cap is the authors' simulator's assumption; a real PETALS server sizes its span "
                    "from memory"),
    Method("bprr", "BPRR", "BPRR", Routing.WS_RR, bprr_placement),
    Method("bprr_oracle", "BPRR (exact sizes)", "BPRR (exact sizes)", Routing.WS_RR, bprr_placement,
           estimate="exact", sim_only="WS-RR is told every job's exact size in advance, which no live scheduler "
                                      "knows"),
)})
"""Every method by name, in the order figures show them."""


def method_names(*, live: bool | None = None, orchestrated: bool | None = None) -> tuple[str, ...]:
    """Names of the methods, optionally only those that (do not) run live or go through the orchestrator."""
    return tuple(n for n, m in METHODS.items() if (live is None or m.live == live)
                 and (orchestrated is None or m.orchestrated == orchestrated))


def get_method(name: str, *, choices: Iterable[str] | None = None, field: str = "method") -> Method:
    """The method called ``name``; SpecError naming ``field`` and the choices when it is unknown or not among them."""
    allowed = tuple(choices) if choices is not None else tuple(METHODS)
    if name not in allowed or name not in METHODS:
        raise SpecError(f"{field}: unknown method {name!r}; choose one of {', '.join(allowed)}")
    return METHODS[name]


def live_method(name: str, *, orchestrated: bool | None = None, field: str = "method") -> Method:
    """A method that runs live (and, with ``orchestrated``, does or does not use the orchestrator).

    A known method that does not fit gets a SpecError saying why (simulator only, or PETALS' own routing)."""
    choices = method_names(live=True, orchestrated=orchestrated)
    m = METHODS.get(name)
    if m is not None and not m.live:
        raise SpecError(f"{field}: {name} runs in the simulator only ({m.sim_only}); choose one of "
                        f"{', '.join(choices)}")
    if m is not None and orchestrated is not None and m.orchestrated != orchestrated:
        why = ("PETALS routes every request itself and runs no orchestrator" if m.routing is Routing.PETALS
               else f"{name} is served through the orchestrator")
        raise SpecError(f"{field}: {name} cannot be used here ({why}); choose one of {', '.join(choices)}")
    return get_method(name, choices=choices, field=field)
