"""Repairing a composition after one server leaves or joins, in milliseconds, while the full recomposition runs in
the background (docs/orchestrator.md, "Churn").

The default composition searches c and the chains together and takes about half a second at J = 1000; a swarm
whose servers come and go cannot wait that long to stop offering a dead chain or to put a newcomer to work. A
repair changes only what the event touches:

- **A leave** keeps every chain that does not pass through the server, with its slots and its hops, so the leases on
  those chains carry over untouched. The server's span goes to idle servers (ones the composition gave no blocks),
  fastest per block first, each taking as many of its blocks as it holds at the composition's c, as GBP-CR builds
  a chain, so that they start loading at once (none if the idle servers cannot cover it all). GCA then
  routes over the cache slots the kept chains leave free, on every server that holds blocks: replacement chains
  from the spare capacity of the dead chains' other servers.
- **A join** gives the newcomer m_j(c) blocks over the thinnest window of the pipeline (the blocks that the fewest
  servers hold), and GCA routes over the slots left, as for a leave.

Neither changes c or the blocks of a server already placed: only the full recomposition that follows may, and it
replaces a repaired composition only where :func:`worth_replacing` says so, since each replacement can send dozens
of servers loading new blocks (`python -m petals_chain.bench compose --churn N` counts them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from petals_chain import defaults
from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.compose.capacity import blocks_array, blocks_for_capacity, cache_slots
from petals_chain.compose.gca import gca
from petals_chain.compose.serial import any_serial, bound_rates, cap_chains
from petals_chain.model import Chain, Composition, ModelSpec, Placement, ServerSpec, SpecError


def residual_slots(servers: Sequence[ServerSpec], model: ModelSpec, placement: Placement,
                   chains: Sequence[Chain]) -> list[int]:
    """Each server's cache slots M̃_j (eq. 3) less what ``chains`` hold on it (blocks × capacity per hop)."""
    free = cache_slots(servers, model, placement)
    for ch in chains:
        for j, m in zip(ch.servers, ch.blocks):
            free[j] -= m * ch.capacity
    return free


def repair(comp: Composition, gone: Sequence[str] = (), new: Sequence[ServerSpec] = ()) -> Composition:
    """``comp`` without the servers named in ``gone`` and with the servers ``new`` (see the module docstring), in one
    pass: one GCA however many changed. SpecError for a name not in ``comp``, a newcomer's name already in it, or a
    name given twice."""
    names = [s.name for s in comp.servers]
    index = {n: j for j, n in enumerate(names)}
    if len(set(gone)) != len(gone) or len({s.name for s in new}) != len(new):
        raise SpecError("repair: a server is named twice")
    missing = [n for n in gone if n not in index]
    if missing:
        raise SpecError(f"repair: server {missing[0]!r} is not in the composition")
    dup = [s.name for s in new if s.name in index]
    if dup:
        raise SpecError(f"repair: server {dup[0]!r} is already in the composition")
    dead = {index[n] for n in gone}
    keep = [j for j in range(len(names)) if j not in dead]
    remap = {j: i for i, j in enumerate(keep)}
    servers = tuple(comp.servers[j] for j in keep) + tuple(new)
    kept = [replace(ch, servers=tuple(remap[j] for j in ch.servers)) for ch in comp.chains
            if not dead.intersection(ch.servers)]
    first = [comp.placement.first_block[j] for j in keep] + [0] * len(new)
    count = [comp.placement.num_blocks[j] for j in keep] + [0] * len(new)
    heirs: list[str] = []
    holds = blocks_array(servers[:len(keep)], comp.model, max(comp.c, 1)) if dead else None
    for d in sorted(dead):
        for j, a, m in _heirs(servers[:len(keep)], holds, count, comp.placement.first_block[d],
                              comp.placement.num_blocks[d]):
            first[j], count[j] = a, m
            heirs.append(servers[j].name)
    L = comp.model.num_blocks
    for i, spec in enumerate(new):
        m = blocks_for_capacity(spec, comp.model, max(comp.c, 1))
        if m <= 0:
            continue
        cover = np.zeros(L + 1, dtype=np.int64)  # servers holding each block, by a difference array
        for a, k in zip(first, count):
            if k > 0:
                cover[a - 1] += 1
                cover[a - 1 + k] -= 1
        held = np.cumsum(cover)[:L]
        sums = np.convolve(held, np.ones(m, dtype=np.int64), mode="valid")  # servers over each window of m blocks
        first[len(keep) + i], count[len(keep) + i] = int(np.argmin(sums)) + 1, m
    kind = "leave" if gone and not new else "join" if new and not gone else "churn"
    meta = {"repair": kind, "gone": tuple(gone), "new": tuple(s.name for s in new), "heirs": tuple(heirs)}
    return _route(servers, comp.model, first, count, kept, comp.c, meta)


def drop_server(comp: Composition, name: str) -> Composition:
    """``comp`` without server ``name`` (:func:`repair`)."""
    return repair(comp, gone=(name,))


def add_server(comp: Composition, spec: ServerSpec) -> Composition:
    """``comp`` with ``spec`` added (:func:`repair`)."""
    return repair(comp, new=(spec,))


def restored(servers: Sequence[ServerSpec], model: ModelSpec, held: Mapping[str, tuple[int, int]],
             c: int) -> Composition:
    """The composition the servers' current spans give (``held``: name → PETALS span; absent: none), routed by GCA
    as a repair routes: what an orchestrator restarted from its store serves without sending anyone loading.
    SpecError or ValueError if those spans do not fit the servers any more."""
    servers = tuple(servers)
    first, count = [], []
    for s in servers:
        start, end = held.get(s.name, (0, 0))
        first.append(start + 1 if end > start else 0)
        count.append(max(0, end - start))
    placement = Placement(tuple(first), tuple(count))
    placement.check_for(model)
    if min(cache_slots(servers, model, placement), default=0) < 0:  # checked before GCA routes anything over it
        raise SpecError("restored: a server's span no longer fits its memory")
    return _route(servers, model, first, count, [], max(c, 1), {"repair": "restored", "gone": (), "new": (),
                                                                 "heirs": ()})


def worth_replacing(current: Composition, candidate: Composition, arrival_rate: float,
                    margin: float = defaults.REPAIR_KEEP_MARGIN) -> bool:
    """Whether ``candidate`` (a full recomposition) should replace ``current`` (a repaired one): the servers
    differ (a figure moved, or one came or went that the repair does not hold), or the candidate gains more than
    ``margin``: its Theorem 3.7 lower bound on the mean response below (1 − margin) × current's, or, where current
    cannot keep up with ``arrival_rate`` (no finite bound), a finite bound or a total rate ν above (1 + margin) ×
    current's. A candidate as overloaded as current is not worth sending servers loading: a swap of two servers'
    spans would drop their sessions for nothing. The bound, not the simulated estimate: it is exact to compute in
    microseconds, and both sides get the same one."""
    if sorted(current.servers, key=lambda s: s.name) != sorted(candidate.servers, key=lambda s: s.name):
        return True

    def lower(comp: Composition) -> float:
        return theorem37_bounds(*bound_rates(comp.chains), arrival_rate).lower_s if comp.chains else np.inf

    now, then = lower(current), lower(candidate)
    if np.isfinite(now):
        return then < (1 - margin) * now
    return bool(np.isfinite(then)) or candidate.total_rate_per_s > (1 + margin) * current.total_rate_per_s


def _heirs(servers: Sequence[ServerSpec], holds: np.ndarray, count: Sequence[int], a: int,
           m: int) -> list[tuple[int, int, int]]:
    """Idle servers (no blocks) covering blocks a .. a+m-1 end to end, fastest per block first, each with what it
    holds at the composition's c (``holds``, m_j(c) of every server): [(server, first block, blocks)], or [] if they
    cannot cover the span."""
    if m <= 0:
        return []
    idle = [(j, min(int(holds[j]), m)) for j in range(len(servers)) if count[j] == 0 and holds[j] > 0]
    idle.sort(key=lambda jk: ((servers[jk[0]].tau_c_s + servers[jk[0]].tau_p_s * jk[1]) / jk[1], jk[0]))
    out, pos, end = [], a, a + m
    for j, k in idle:
        take = min(k, end - pos)
        out.append((j, pos, take))
        pos += take
        if pos == end:
            return out
    return []


def _route(servers: tuple[ServerSpec, ...], model: ModelSpec, first: list[int], count: list[int],
           kept: list[Chain], c: int, meta: dict) -> Composition:
    """The kept chains plus GCA's over the slots they leave, fastest first (the order JFFC indexes)."""
    placement = Placement(tuple(first), tuple(count))
    new = gca(servers, model, placement, slots=residual_slots(servers, model, placement, kept))
    if new and any_serial(servers):
        new = cap_chains(new, servers)
    chains = tuple(sorted([*kept, *new], key=lambda ch: ch.service_time_s))
    return Composition(servers, model, placement, chains, c, meta)
