"""petals_chain's default composition: c and the set of chains chosen together by the Theorem 3.7 lower bound.

For every c, GBP-CR is run both as the paper writes it and in its max-chains variant, and GCA orders
each placement's chains fastest first. Every prefix of those chains is a candidate (dropping a chain
only frees memory), and servers that no chosen chain uses may each serve as a one-server chain
holding the whole model (fastest first, every prefix). The candidate with the smallest lower bound
wins, so idle servers are used exactly when they lower it
(docs/model.md, "Choosing c and the chains together"). Adding a chain never raises the lower bound
(its slots come after the faster ones), so where the lower bounds of two candidates tie the upper
bound decides. Both the paper's and the
max-chains composition are candidates, so the result's lower bound is never above theirs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from petals_chain import defaults
from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.compose.capacity import floor_ratio, max_concurrency
from petals_chain.compose.gbp_cr import gbp_cr_detail
from petals_chain.compose.gca import gca
from petals_chain.model import Chain, Composition, InfeasibleError, ModelSpec, Placement, ServerSpec, SpecError
from petals_chain.model import validate_servers


@dataclass(frozen=True)
class JointChoice:
    """The winning candidate: c, which GBP-CR variant, how many of its chains, how many whole-model chains."""

    c: int
    variant: str  # "paper" or "max-chains": the GBP-CR run whose chains it keeps
    kept_chains: int  # prefix length of GCA's chains (fastest first)
    whole_model_chains: int  # one-server chains added on otherwise idle servers
    lower_s: float
    upper_s: float


def _whole_model_chains(servers: Sequence[ServerSpec], model: ModelSpec) -> list[Chain]:
    """A one-server chain for every server that holds all L blocks plus cache for one job, fastest first."""
    L = model.num_blocks
    out = []
    for j, s in enumerate(servers):
        cap = floor_ratio(s.memory_bytes - L * model.block_bytes, L * model.cache_bytes)
        if cap >= 1:
            out.append(Chain((j,), (L,), cap, s.tau_c_s + s.tau_p_s * L))
    return sorted(out, key=lambda ch: (ch.service_time_s, ch.servers))


_REL_TIE = 1e-9  # bounds this close are equal; the other bound then decides
CRITERIA = ("lower", "upper")


def _better(lower: float, upper: float, best_lower: float, best_upper: float, criterion: str = "lower") -> bool:
    """A smaller bound of the criterion wins; where those tie (within _REL_TIE), a smaller other bound."""
    first, second, best_first, best_second = ((lower, upper, best_lower, best_upper) if criterion == "lower"
                                              else (upper, lower, best_upper, best_lower))
    if first < best_first * (1.0 - _REL_TIE):
        return True
    return first <= best_first * (1.0 + _REL_TIE) and second < best_second


def _best_for(chains: Sequence[Chain], whole: Sequence[Chain], arrival_rate: float, criterion: str = "lower"
              ) -> tuple[float, float, int, int] | None:
    """(lower, upper, k, e) minimising the criterion's bound over k GCA chains plus e whole-model chains on idle
    servers."""
    best = None
    for k in range(1, len(chains) + 1):
        used = {j for ch in chains[:k] for j in ch.servers}
        free = [ch for ch in whole if ch.servers[0] not in used]
        for e in range(len(free) + 1):
            chosen = list(chains[:k]) + free[:e]
            b = theorem37_bounds([ch.rate_per_s for ch in chosen], [ch.capacity for ch in chosen], arrival_rate)
            if math.isfinite(b.lower_s) and (
                    best is None or _better(b.lower_s, b.upper_s, best[0], best[1], criterion)):
                best = (b.lower_s, b.upper_s, k, e)
    return best


def joint_compose(
    servers: Sequence[ServerSpec],
    model: ModelSpec,
    arrival_rate: float,
    target_load: float = defaults.TARGET_LOAD,
    c: int | None = None,
    tune: str = "lower",
) -> Composition:
    """The default composition: (c, chains) minimising the Theorem 3.7 lower bound (or, with ``tune='upper'``,
    the upper bound); c fixed when given.

    With c given and no stable candidate, all max-chains chains are kept (bounds infinite), like the paper's
    composition for a fixed c; with c tuned, no stable c raises InfeasibleError.
    ``tune`` is 'lower' or 'upper'; the surrogate c·K(c) belongs to the paper's tuning of c alone."""
    if tune not in CRITERIA:
        raise SpecError(f"tune: the joint composition chooses by a bound, one of {CRITERIA}; got {tune!r} "
                        "(the surrogate is for methods 'paper' and 'max-chains')")
    servers = validate_servers(servers)
    c_max = max_concurrency(servers, model)
    if c is not None and c < 1:
        raise SpecError(f"compose: field 'c' must be >= 1, got {c}")
    values = [c] if c is not None else range(1, c_max + 1)
    whole = _whole_model_chains(servers, model)
    winner = None  # ((lower, c, variant order, k, e), variant, upper, placement, chains, gbp_chains)
    built = False  # GBP-CR completed a chain at some c
    unstable = None  # with c given and nothing stable: every max-chains chain, as the paper's compose_for_c would
    for cc in values:
        for rank, (variant, max_chains) in enumerate((("paper", False), ("max-chains", True))):
            try:
                res = gbp_cr_detail(servers, model, cc, arrival_rate, target_load, max_chains=max_chains)
            except InfeasibleError:
                continue
            built = True
            chains = gca(servers, model, res.placement)
            found = _best_for(chains, whole, arrival_rate, tune)
            if found is None:
                if c is not None and max_chains and chains:
                    unstable = ((math.inf, cc, rank, len(chains), 0), variant, math.inf, res.placement, chains,
                                res.num_chains)
                continue
            lower, upper, k, e = found
            key = (lower, cc, rank, k, e)
            if winner is None or _better(lower, upper, winner[0][0], winner[2], tune):
                winner = (key, variant, upper, res.placement, chains, res.num_chains)
    winner = winner or unstable
    if not built:
        raise InfeasibleError(
            f"the servers cannot hold the model {model.name!r} ({model.num_blocks} blocks of "
            f"{model.block_bytes / 1e9:.3g} GB) with cache for {'any c' if c is None else f'c={c}'}"
        )
    if winner is None:
        raise InfeasibleError(
            f"no c in {'1..' + str(c_max) if c is None else c} gives chains that keep the system stable at "
            f"λ={arrival_rate:g}/s for model {model.name!r}; add servers or lower the load"
        )
    (lower, cc, _, k, e), variant, upper, placement, chains, gbp_chains = winner
    kept = list(chains[:k])
    used = {j for ch in kept for j in ch.servers}
    extra = [ch for ch in whole if ch.servers[0] not in used][:e]
    first, count = list(placement.first_block), list(placement.num_blocks)
    for j in range(len(servers)):
        if j not in used:  # a server no kept chain uses holds nothing (or the whole model below)
            first[j], count[j] = 0, 0
    for ch in extra:
        first[ch.servers[0]], count[ch.servers[0]] = 1, model.num_blocks
    choice = JointChoice(cc, variant, k, e, lower, upper)
    meta = {"lower_s": lower, "upper_s": upper, "gbp_chains": gbp_chains, "joint": choice}
    return Composition(servers, model, Placement(tuple(first), tuple(count)), tuple(kept + extra), cc, meta)
