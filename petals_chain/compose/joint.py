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
the search stops at the first candidate whose lower bound is above the best estimate so far.
The lower bound alone would prefer a fast chain of few slots plus a slow one to a single chain of many slots, as if
jobs always sat on the fastest slots; JFFC keeps a job where it started, so the slow chain is used more
than the bound assumes (docs/model.md, "Choosing c and the chains together").

The search makes that choice without bounding every candidate (:func:`_pruned_candidates`): each placement is
first bounded below by its fastest chain, GCA's rounds run only on placements that bound cannot rule out, every
prefix's lower bound comes from one pass, and only candidates that may fall under the best upper bound are
bounded exactly; estimates reuse a simulation for the candidates that differ from it only in chains no job
reached (analysis.estimate.JffcMeans). ``search='exhaustive'`` is the reference that bounds and simulates every
candidate; both choose the same, bit for bit (tests/compose/test_joint_search.py).
``tune='upper'`` instead minimises the upper bound (the lower bound breaking ties), without the estimate.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from petals_chain import defaults
from petals_chain.analysis.bounds import prefix_lower_bounds, theorem37_bounds
from petals_chain.analysis.estimate import JffcMeans, MeanEstimate, jffc_mean_estimate
from petals_chain.compose.capacity import floor_ratio, max_concurrency
from petals_chain.compose.gbp_cr import gbp_cr_detail
from petals_chain.compose.gca import gca
from petals_chain.compose.serial import any_serial, bound_rates, cap_chains
from petals_chain.model import (
    Chain,
    Composition,
    InfeasibleError,
    ModelSpec,
    Placement,
    ServerSpec,
    SpecError,
    validate_servers,
)


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


@dataclass(frozen=True)
class _Group:
    """One GBP-CR run (c, variant) and GCA's chains on its placement, fastest first: the source of the candidates
    (k, e) that keep k of those chains and add e whole-model chains."""

    c: int
    rank: int
    variant: str
    placement: Placement
    gbp_chains: int
    chains: tuple[Chain, ...] = ()


def _candidate(g: _Group, k: int, free: Sequence[Chain], e: int, arrival_rate: float,
               servers: Sequence[ServerSpec], serial: bool) -> _Candidate | None:
    """The candidate of g's first k chains plus the first e of ``free`` (whole-model chains on servers those k leave
    idle), each chain's slots and time as its serial servers allow (compose/serial.py; unchanged in the paper's
    model), with its Theorem 3.7 bounds; None where it is unstable."""
    chosen = tuple(g.chains[:k]) + tuple(free[:e])
    if serial:
        chosen = cap_chains(chosen, servers)
    b = theorem37_bounds(*bound_rates(chosen), arrival_rate)
    if not math.isfinite(b.lower_s):
        return None
    return _Candidate(b.lower_s, b.upper_s, g.c, g.rank, k, e, g.variant, g.placement, chosen, g.gbp_chains,
                      tuple(ch.servers[0] for ch in free[:e]))


def _free_whole(g: _Group, whole: Sequence[Chain]) -> Iterator[tuple[int, list[Chain]]]:
    """(k, the whole-model chains on servers that g's first k chains leave idle) for k = 1..K."""
    used: set[int] = set()
    for k, ch in enumerate(g.chains, start=1):
        used.update(ch.servers)
        yield k, [w for w in whole if w.servers[0] not in used]


def _every_candidate(g: _Group, whole: Sequence[Chain], arrival_rate: float, servers: Sequence[ServerSpec],
                     serial: bool) -> Iterator[_Candidate]:
    """Every stable candidate of g, each with its bounds (the exhaustive search)."""
    for k, free in _free_whole(g, whole):
        for e in range(len(free) + 1):
            cand = _candidate(g, k, free, e, arrival_rate, servers, serial)
            if cand is not None:
                yield cand


_PRUNE_SLACK = 1e-6  # prefix_lower_bounds' rounding is below 1e-12 relative; this leaves a wide margin


def _pruned_candidates(runs: Sequence[_Group], whole: Sequence[Chain], arrival_rate: float,
                       servers: Sequence[ServerSpec], model: ModelSpec, serial: bool) -> list[_Candidate]:
    """The candidates whose lower bound is at most the best upper bound of all (within _REL_TIE), each with its
    bounds computed exactly as the exhaustive search computes them, and nothing else: the same set that
    :func:`_by_estimate` keeps from every candidate, found without the bounds of most candidates and without GCA's
    chains on most placements. ``runs`` are the GBP-CR runs, their chains not yet built.

    Runs with the same placement have the same chains, so their candidates are computed once and repeated with
    each run's (c, variant). Every candidate first gets a floor under its lower bound, and candidates are bounded
    exactly in order of floor, keeping the least upper bound so far, until the next floor passes it: every later
    candidate's lower bound, and so its upper bound, is above it, so the least upper bound found is the least of
    all and every candidate under it has been bounded. The floors, where no server is serial (with serial servers,
    whose slots are cut per candidate, they are 0 and every candidate is bounded):

    * a placement, before GCA runs on it, has the time of its fastest chain (GCA's first round alone), or of the
      fastest whole-model chain if that is faster: no candidate's mean, nor its lower bound, is below the time of
      its fastest chain;
    * once GCA has run, a prefix k of its chains (fastest first) has its lower bound, all K from one pass
      (analysis.bounds.prefix_lower_bounds); a prefix with e ≥ 1 whole-model chains added has at least the lower
      bound of all the placement's chains with every whole-model chain (adding a chain only raises every ν̄_n)."""
    canon: dict[Placement, int] = {}
    repeats: list[list[_Group]] = []
    for g in runs:
        if g.placement in canon:
            repeats[canon[g.placement]].append(g)
        else:
            canon[g.placement] = len(repeats)
            repeats.append([g])
    firsts = [gs[0] for gs in repeats]
    fastest_whole = whole[0].service_time_s if whole else math.inf
    heap: list[tuple[float, int, int, int]] = []  # (floor, group, k, e); k = 0: the group's chains not built yet
    for gi, g in enumerate(firsts):
        floor = 0.0
        if not serial:
            first = gca(servers, model, g.placement, limit=1)
            floor = min(first[0].service_time_s if first else math.inf, fastest_whole)
        heap.append((floor, gi, 0, 0))
    heapq.heapify(heap)
    best_upper = math.inf
    bounded: list[_Candidate] = []
    free_of: dict[tuple[int, int], list[Chain]] = {}
    while heap and heap[0][0] <= best_upper * (1 + _REL_TIE) * (1 + _PRUNE_SLACK):
        _, gi, k, e = heapq.heappop(heap)
        g = firsts[gi]
        if k == 0:
            g = firsts[gi] = replace(g, chains=gca(servers, model, g.placement))
            for entry in _floors(g, gi, whole, arrival_rate, serial):
                heapq.heappush(heap, entry)
            continue
        if (gi, k) not in free_of:
            used = {j for ch in g.chains[:k] for j in ch.servers} if whole else set()
            free_of[gi, k] = [w for w in whole if w.servers[0] not in used]
        cand = _candidate(g, k, free_of[gi, k], e, arrival_rate, servers, serial)
        if cand is None:
            continue
        best_upper = min(best_upper, cand.upper_s)
        bounded += [cand] + [replace(cand, c=r.c, rank=r.rank, variant=r.variant, gbp_chains=r.gbp_chains)
                             for r in repeats[gi][1:]]
    return [x for x in bounded if x.lower_s <= best_upper * (1 + _REL_TIE)]


def _floors(g: _Group, gi: int, whole: Sequence[Chain], arrival_rate: float,
            serial: bool) -> list[tuple[float, int, int, int]]:
    """(floor under the lower bound, gi, k, e) for every candidate of group g (see :func:`_pruned_candidates`)."""
    rates = np.array([ch.rate_per_s for ch in g.chains])
    caps = np.array([ch.capacity for ch in g.chains], dtype=np.int64)
    out = []
    sorted_ = not serial and bool(np.all(np.diff(rates) <= 0))
    if sorted_ and g.chains:
        prefix = prefix_lower_bounds(rates, caps, arrival_rate)
        out += [(float(prefix[k]), gi, int(k) + 1, 0) for k in np.flatnonzero(np.isfinite(prefix))]
    if whole or not sorted_:
        with_whole = 0.0
        if sorted_:
            every = tuple(g.chains) + tuple(whole)
            with_whole = theorem37_bounds([ch.rate_per_s for ch in every], [ch.capacity for ch in every],
                                          arrival_rate).lower_s
        first_e = 1 if sorted_ else 0
        out += [(with_whole, gi, k, e) for k, free in _free_whole(g, whole) for e in range(first_e, len(free) + 1)]
    return out


def _estimate(cand: _Candidate, means: JffcMeans | None, arrival_rate: float) -> MeanEstimate:
    """The candidate's estimated JFFC mean (analysis/estimate.py): from ``means``, which reuses one simulation for
    the candidates that differ only in chains it never used, or, without it, one call per candidate."""
    rates, caps = [ch.rate_per_s for ch in cand.chains], [ch.capacity for ch in cand.chains]
    if means is None:
        return jffc_mean_estimate(rates, caps, arrival_rate)
    return means.estimate(rates, caps)


def _by_upper(cands: Sequence[_Candidate]) -> _Candidate:
    """The smallest upper bound; where upper bounds tie (within _REL_TIE), the smallest lower bound."""
    best = None
    for cand in sorted(cands, key=lambda x: (x.upper_s, x.order)):
        if best is None or (cand.upper_s <= best.upper_s * (1 + _REL_TIE) and cand.lower_s < best.lower_s):
            best = cand
    return best


def _by_estimate(cands: Sequence[_Candidate], arrival_rate: float,
                 means: JffcMeans | None) -> tuple[_Candidate, MeanEstimate, int]:
    """The smallest estimated mean among candidates the bounds do not rule out (see the module docstring);
    returns (winner, its estimate, how many candidates were estimated)."""
    best_upper = min(x.upper_s for x in cands)
    best, best_est, n = None, None, 0
    for cand in sorted((x for x in cands if x.lower_s <= best_upper * (1 + _REL_TIE)), key=lambda x: x.order):
        if best_est is not None and cand.lower_s >= best_est.mean_s:
            break  # this and every later candidate has a mean at least its lower bound: none can do better
        est = _estimate(cand, means, arrival_rate)
        n += 1
        if best_est is None or est.mean_s < best_est.mean_s * (1 - _REL_TIE):
            best, best_est = cand, est
    return best, best_est, n


SEARCHES = ("pruned", "exhaustive")


def joint_compose(
    servers: Sequence[ServerSpec],
    model: ModelSpec,
    arrival_rate: float,
    target_load: float = defaults.TARGET_LOAD,
    c: int | None = None,
    tune: str = "lower",
    *,
    search: str = "pruned",
) -> Composition:
    """The default composition: (c, chains) chosen by the bounds and the estimated mean (``tune='lower'``) or by
    the upper bound (``tune='upper'``); c fixed when given.

    ``search='exhaustive'`` bounds every candidate and simulates every estimated one on its own (how the choice
    was first made; kept as the reference that tests and ``bench compose`` compare against); the default
    ``'pruned'`` makes the same choice from the few candidates the bounds leave (:func:`_pruned_candidates`),
    GCA run once per distinct placement and a simulation reused by the candidates that differ only in chains it
    never used (analysis.estimate.JffcMeans). With c given, both search every candidate of that c.
    With c given and no stable candidate, all max-chains chains are kept (bounds infinite), like the paper's
    composition for a fixed c; with c tuned, no stable c raises InfeasibleError.
    The surrogate c·K(c) belongs to the paper's tuning of c alone."""
    if tune not in CRITERIA:
        raise SpecError(
            f"tune: the joint composition chooses by a bound, one of {CRITERIA}; got {tune!r} "
            "(the surrogate is for methods 'paper' and 'max-chains')"
        )
    if search not in SEARCHES:
        raise SpecError(f"search: one of {SEARCHES}, got {search!r}")
    servers = validate_servers(servers)
    c_max = max_concurrency(servers, model)
    if c is not None and c < 1:
        raise SpecError(f"compose: field 'c' must be >= 1, got {c}")
    values = [c] if c is not None else range(1, c_max + 1)
    whole = _whole_model_chains(servers, model)
    serial = any_serial(servers)
    exhaustive = search == "exhaustive" or c is not None
    groups: list[_Group] = []
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
            g = _Group(cc, rank, variant, res.placement, res.num_chains)
            if not exhaustive:
                groups.append(g)  # its chains are built only if the bounds cannot rule it out
                continue
            g = replace(g, chains=gca(servers, model, res.placement))
            found = list(_every_candidate(g, whole, arrival_rate, servers, serial))
            cands += found
            if not found and c is not None and max_chains and g.chains:
                unstable = _Candidate(
                    math.inf, math.inf, cc, rank, len(g.chains), 0, variant, res.placement, g.chains, res.num_chains
                )
    if groups:
        cands = _pruned_candidates(groups, whole, arrival_rate, servers, model, serial)
    if not built:
        raise InfeasibleError(
            f"the servers cannot hold the model {model.name!r} ({model.num_blocks} blocks of "
            f"{model.block_bytes / 1e9:.3g} GB) with cache for {'any c' if c is None else f'c={c}'}"
        )
    est, n_est = None, 0
    if cands and tune == "lower":
        means = None if search == "exhaustive" else JffcMeans(arrival_rate)
        win, est, n_est = _by_estimate(cands, arrival_rate, means)
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
