"""Choose the reserved concurrency c (§3.2.3) and compose: tune c → GBP-CR → GCA = Composition."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from petals_chain import defaults
from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.compose.capacity import max_concurrency
from petals_chain.compose.gbp_cr import gbp_cr_detail
from petals_chain.compose.gca import gca
from petals_chain.model import Chain, Composition, InfeasibleError, ModelSpec, ServerSpec, SpecError, validate_servers

CRITERIA = ("lower", "upper", "surrogate")


@dataclass(frozen=True)
class CPoint:
    """What GBP-CR(c) + GCA give at one c: chains, surrogate c·K(c) and the Theorem 3.7 bounds."""

    c: int
    gbp_chains: int  # K(c)
    surrogate: int  # c · K(c)
    gca_chains: int
    total_capacity: int
    total_rate_per_s: float
    lower_s: float
    upper_s: float


@dataclass(frozen=True)
class Tuning:
    """The chosen c for a criterion and the whole curve over c = 1..c_max (infeasible c left out)."""

    c: int
    criterion: str
    curve: tuple[CPoint, ...]

    def best(self, criterion: str) -> int:
        """The c another criterion would pick on the same curve."""
        return _pick(self.curve, criterion)


TIE_RTOL = 1e-9  # criterion values this close (relative) are the same value up to rounding


def _pick(curve: Sequence[CPoint], criterion: str) -> int:
    """argmin of the criterion over the curve; ties go to the smallest c. Values within :data:`TIE_RTOL` of the
    minimum tie: at a light load the lower bound is the fastest chain's service time for many c, computed along
    different sums, and which of those exact ties came out a few ulps lower differed between CPUs."""
    key = {"lower": lambda p: p.lower_s, "upper": lambda p: p.upper_s, "surrogate": lambda p: p.surrogate}
    if criterion not in key:
        raise SpecError(f"tune: criterion must be one of {CRITERIA}, got {criterion!r}")
    f = key[criterion]
    finite = [p for p in curve if math.isfinite(f(p))]
    if not finite:
        raise InfeasibleError(
            f"no c in 1..{max((p.c for p in curve), default=0)} gives a stable system for the arrival rate; "
            "add servers or lower the load"
        )
    best = min(f(p) for p in finite)
    return min(p.c for p in finite if f(p) <= best + TIE_RTOL * abs(best))


def _evaluate(servers, model, c, arrival_rate, target_load, memo,
              max_chains: bool = False) -> tuple[CPoint, object, tuple[Chain, ...]] | None:
    """GBP-CR(c) (as written, or max-chains) + GCA + bounds at one c; None where GBP-CR cannot build a chain."""
    try:
        res = gbp_cr_detail(servers, model, c, arrival_rate, target_load, max_chains=max_chains)
    except InfeasibleError:
        return None
    key = res.placement
    if key not in memo:
        memo[key] = gca(servers, model, res.placement)
    chains = memo[key]
    rates = [ch.rate_per_s for ch in chains]
    caps = [ch.capacity for ch in chains]
    b = theorem37_bounds(rates, caps, arrival_rate)
    point = CPoint(
        c=c,
        gbp_chains=res.num_chains,
        surrogate=c * res.num_chains,
        gca_chains=len(chains),
        total_capacity=sum(caps),
        total_rate_per_s=sum(r * k for r, k in zip(rates, caps)),
        lower_s=b.lower_s,
        upper_s=b.upper_s,
    )
    return point, res.placement, chains


def tune_c(
    servers: Sequence[ServerSpec],
    model: ModelSpec,
    arrival_rate: float,
    target_load: float = defaults.TARGET_LOAD,
    criterion: str = "lower",
    c_values: Sequence[int] | None = None,
    *,
    max_chains: bool = False,
) -> Tuning:
    """Sweep c over 1..c_max (or c_values) and pick c* by the criterion: 'lower', 'upper' or 'surrogate'.

    ``max_chains`` runs GBP-CR's max-chains variant at every c instead of Algorithm 1 as written."""
    servers = validate_servers(servers)
    if criterion not in CRITERIA:
        raise SpecError(f"tune: criterion must be one of {CRITERIA}, got {criterion!r}")
    c_max = max_concurrency(servers, model)
    if c_max < 1:
        raise InfeasibleError("no server can hold even one block with cache for one job")
    values = range(1, c_max + 1) if c_values is None else c_values
    memo: dict = {}
    curve = []
    for c in values:
        out = _evaluate(servers, model, c, arrival_rate, target_load, memo, max_chains)
        if out is not None:
            curve.append(out[0])
    if not curve:
        raise InfeasibleError(
            f"the servers cannot hold the model {model.name!r} ({model.num_blocks} blocks of "
            f"{model.block_bytes / 1e9:.3g} GB) for any c"
        )
    return Tuning(_pick(curve, criterion), criterion, tuple(curve))


def compose_for_c(
    servers: Sequence[ServerSpec],
    model: ModelSpec,
    c: int,
    arrival_rate: float,
    target_load: float = defaults.TARGET_LOAD,
    *,
    max_chains: bool = False,
) -> Composition:
    """GBP-CR(c) (as written, or max-chains) then GCA: the composition for a fixed c."""
    servers = validate_servers(servers)
    out = _evaluate(servers, model, c, arrival_rate, target_load, {}, max_chains)
    if out is None:
        raise InfeasibleError(
            f"the servers cannot hold model {model.name!r} with cache reserved for c={c} jobs per server"
        )
    point, placement, chains = out
    meta = {"lower_s": point.lower_s, "upper_s": point.upper_s, "gbp_chains": point.gbp_chains}
    return Composition(servers, model, placement, chains, c, meta)


def compose(
    servers: Sequence[ServerSpec],
    model: ModelSpec,
    arrival_rate: float,
    target_load: float = defaults.TARGET_LOAD,
    c: int | None = None,
    tune: str = "lower",
    *,
    max_chains: bool = False,
) -> Composition:
    """The whole pipeline: c (given, or tuned by `tune`), GBP-CR placement (as written, or max-chains), GCA."""
    tuning = None
    if c is None:
        tuning = tune_c(servers, model, arrival_rate, target_load, tune, max_chains=max_chains)
        c = tuning.c
    comp = compose_for_c(servers, model, c, arrival_rate, target_load, max_chains=max_chains)
    if tuning is not None:
        comp.meta["tuning"] = tuning
    return comp
