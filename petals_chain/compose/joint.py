"""petals_chain's default composition: c and the set of chains chosen together, by the Theorem 3.7 bounds and,
where the bounds cannot separate the best candidates, by an estimate of the mean itself.

For every c, GBP-CR is run both as the paper writes it and in its max-chains variant, and GCA orders
each placement's chains fastest first. Every prefix of those chains is a candidate (dropping a chain
only frees memory), and servers that no chosen chain uses may each serve as a one-server chain
holding the whole model (fastest first, every prefix). Algorithm 1's own composition at every c (the
paper variant with all its chains) is thus a candidate, and so is max-chains'.

The bounds rule candidates out: one whose lower bound exceeds another's upper bound cannot be faster.
Among the rest, taken in order of lower bound, the JFFC mean response time estimated at the design rate
(analysis/estimate.py: exact for at most two distinct chain rates, else a seeded simulation) decides, and
the search stops at the first candidate whose lower bound is above the best estimate so far. The lower
bound alone would prefer a fast chain of few slots plus a slow one to a single chain of many slots, as if
jobs always sat on the fastest slots; JFFC keeps a job where it started, so the slow chain is used more
than the bound assumes (docs/model.md, "Choosing c and the chains together").
``tune='upper'`` instead minimises the upper bound (the lower bound breaking ties), without the estimate.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from petals_chain import defaults
from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.analysis.estimate import jffc_mean_estimate
from petals_chain.compose.capacity import floor_ratio, max_concurrency
from petals_chain.compose.gbp_cr import gbp_cr_detail
from petals_chain.compose.gca import gca
from petals_chain.compose.serial import bound_rates, cap_chains
from petals_chain.model import Chain, Composition, InfeasibleError, ModelSpec, Placement, ServerSpec, SpecError
from petals_chain.model import validate_servers


@dataclass(frozen=True)
class JointChoice:
    """The winning candidate: c, which GBP-CR variant, how many of its chains, how many whole-model chains, its
    bounds and its estimated mean (how: analysis.estimate.ESTIMATORS; "" when chosen by the upper bound alone)."""

    c: int
    variant: str  # "paper" or "max-chains": the GBP-CR run whose chains it keeps
    kept_chains: int  # prefix length of GCA's chains (fastest first)
    whole_model_chains: int  # one-server chains added on otherwise idle servers
    lower_s: float
    upper_s: float
    estimate_s: float = math.nan
    estimated_by: str = ""
    estimated_candidates: int = 0  # candidates whose mean was estimated before the bounds ended the search


@dataclass(frozen=True)
class _Candidate:
    """One (c, variant, k, e) with its bounds; ``chains`` are the k GCA chains plus e whole-model ones."""

    lower_s: float
    upper_s: float
    c: int
    rank: int  # 0 = paper, 1 = max-chains (ties go to the paper's)
    k: int
    e: int
    variant: str
    placement: Placement
    chains: tuple[Chain, ...]  # as offered: slots cut to what serial servers can run (compose/serial.py)
    gbp_chains: int
    whole: tuple[int, ...] = ()  # servers that hold the whole model as one-server chains

    @property
    def order(self) -> tuple:
        """Lower bound first, then upper bound, smaller c, the paper's variant, fewer chains."""
        return (self.lower_s, self.upper_s, self.c, self.rank, self.k, self.e)


def _whole_model_chains(servers: Sequence[ServerSpec], model: ModelSpec) -> list[Chain]:
    """A one-server chain for every server that holds all L blocks plus cache for one job, fastest first."""
    L = model.num_blocks
    out = []
    for j, s in enumerate(servers):
        cap = floor_ratio(s.memory_bytes - L * model.block_bytes, L * model.cache_bytes)
        if cap >= 1:
            out.append(Chain((j,), (L,), cap, s.tau_c_s + s.tau_p_s * L))
    return sorted(out, key=lambda ch: (ch.service_time_s, ch.servers))


_REL_TIE = 1e-9  # bounds or estimates this close are equal
CRITERIA = ("lower", "upper")


def _candidates(
    chains: Sequence[Chain],
    whole: Sequence[Chain],
    arrival_rate: float,
    c: int,
    rank: int,
    variant: str,
    placement: Placement,
    gbp_chains: int,
    servers: Sequence[ServerSpec],
) -> Iterator[_Candidate]:
    """Every stable candidate of k GCA chains (a prefix) plus e whole-model chains on servers they leave idle,
    each chain's slots and time as its serial servers allow (compose/serial.py; unchanged in the paper's model)."""
    for k in range(1, len(chains) + 1):
        used = {j for ch in chains[:k] for j in ch.servers}
        free = [ch for ch in whole if ch.servers[0] not in used]
        for e in range(len(free) + 1):
            chosen = cap_chains(tuple(chains[:k]) + tuple(free[:e]), servers)
            b = theorem37_bounds(*bound_rates(chosen), arrival_rate)
            if math.isfinite(b.lower_s):
                yield _Candidate(b.lower_s, b.upper_s, c, rank, k, e, variant, placement, chosen, gbp_chains,
                                 tuple(ch.servers[0] for ch in free[:e]))


def _estimate(cand: _Candidate, arrival_rate: float):
    """The candidate's estimated JFFC mean (analysis/estimate.py)."""
    return jffc_mean_estimate([ch.rate_per_s for ch in cand.chains], [ch.capacity for ch in cand.chains], arrival_rate)


def _by_upper(cands: Sequence[_Candidate]) -> _Candidate:
    """The smallest upper bound; where upper bounds tie (within _REL_TIE), the smallest lower bound."""
    best = None
    for cand in sorted(cands, key=lambda x: (x.upper_s, x.order)):
        if best is None or (cand.upper_s <= best.upper_s * (1 + _REL_TIE) and cand.lower_s < best.lower_s):
            best = cand
    return best


def _by_estimate(cands: Sequence[_Candidate], arrival_rate: float) -> tuple[_Candidate, object, int]:
    """The smallest estimated mean among candidates the bounds do not rule out (see the module docstring);
    returns (winner, its estimate, how many candidates were estimated)."""
    best_upper = min(x.upper_s for x in cands)
    best, best_est, n = None, None, 0
    for cand in sorted((x for x in cands if x.lower_s <= best_upper * (1 + _REL_TIE)), key=lambda x: x.order):
        if best_est is not None and cand.lower_s >= best_est.mean_s:
            break  # this and every later candidate has a mean at least its lower bound: none can do better
        est = _estimate(cand, arrival_rate)
        n += 1
        if best_est is None or est.mean_s < best_est.mean_s * (1 - _REL_TIE):
            best, best_est = cand, est
    return best, best_est, n


def joint_compose(
    servers: Sequence[ServerSpec],
    model: ModelSpec,
    arrival_rate: float,
    target_load: float = defaults.TARGET_LOAD,
    c: int | None = None,
    tune: str = "lower",
) -> Composition:
    """The default composition: (c, chains) chosen by the bounds and the estimated mean (``tune='lower'``) or by
    the upper bound (``tune='upper'``); c fixed when given.

    With c given and no stable candidate, all max-chains chains are kept (bounds infinite), like the paper's
    composition for a fixed c; with c tuned, no stable c raises InfeasibleError.
    The surrogate c·K(c) belongs to the paper's tuning of c alone."""
    if tune not in CRITERIA:
        raise SpecError(
            f"tune: the joint composition chooses by a bound, one of {CRITERIA}; got {tune!r} "
            "(the surrogate is for methods 'paper' and 'max-chains')"
        )
    servers = validate_servers(servers)
    c_max = max_concurrency(servers, model)
    if c is not None and c < 1:
        raise SpecError(f"compose: field 'c' must be >= 1, got {c}")
    values = [c] if c is not None else range(1, c_max + 1)
    whole = _whole_model_chains(servers, model)
    cands: list[_Candidate] = []
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
            found = list(_candidates(chains, whole, arrival_rate, cc, rank, variant, res.placement, res.num_chains,
                                     servers))
            cands += found
            if not found and c is not None and max_chains and chains:
                unstable = _Candidate(
                    math.inf, math.inf, cc, rank, len(chains), 0, variant, res.placement, tuple(chains), res.num_chains
                )
    if not built:
        raise InfeasibleError(
            f"the servers cannot hold the model {model.name!r} ({model.num_blocks} blocks of "
            f"{model.block_bytes / 1e9:.3g} GB) with cache for {'any c' if c is None else f'c={c}'}"
        )
    est, n_est = None, 0
    if cands and tune == "lower":
        win, est, n_est = _by_estimate(cands, arrival_rate)
    elif cands:
        win = _by_upper(cands)
    else:
        win = unstable
    if win is None:
        raise InfeasibleError(
            f"no c in {'1..' + str(c_max) if c is None else c} gives chains that keep the system stable at "
            f"λ={arrival_rate:g}/s for model {model.name!r}; add servers or lower the load"
        )
    used = {j for ch in win.chains for j in ch.servers if j not in win.whole}
    first, count = list(win.placement.first_block), list(win.placement.num_blocks)
    for j in range(len(servers)):
        if j not in used:  # a server no kept chain uses holds nothing (or the whole model below)
            first[j], count[j] = 0, 0
    for j in win.whole:
        first[j], count[j] = 1, model.num_blocks
    choice = JointChoice(
        win.c,
        win.variant,
        win.k,
        win.e,
        win.lower_s,
        win.upper_s,
        est.mean_s if est else math.nan,
        est.how if est else "",
        n_est,
    )
    meta = {"lower_s": win.lower_s, "upper_s": win.upper_s, "gbp_chains": win.gbp_chains, "joint": choice}
    return Composition(servers, model, Placement(tuple(first), tuple(count)), win.chains, win.c, meta)
