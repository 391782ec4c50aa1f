"""Exact references for tests and the unit experiments: all feasible chains, the cache-allocation
ILP over a chain set (scipy milp / HiGHS), and a brute-force optimum of problem (10)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

from petals_chain import defaults
from petals_chain.compose.capacity import blocks_array, cache_slots
from petals_chain.compose.gca import chain_service_time
from petals_chain.model import Chain, InfeasibleError, ModelSpec, Placement, ServerSpec


def enumerate_chains(
    servers: Sequence[ServerSpec], placement: Placement, model: ModelSpec, limit: int = 100_000
) -> list[Chain]:
    """Every j0 → j_end path of the placement's feasible-edge DAG, capacity 0 (depth-first)."""
    L = model.num_blocks
    by_start: dict[int, list[int]] = {}
    for j in range(placement.num_servers):
        a, m = placement.first_block[j], placement.num_blocks[j]
        for p in range(a, a + m):
            by_start.setdefault(p, []).append(j)
    out: list[Chain] = []

    def walk(pos: int, hops: list[int], blocks: list[int]) -> None:
        if pos == L + 1:
            out.append(Chain(tuple(hops), tuple(blocks), 0, chain_service_time(servers, hops, blocks)))
            if len(out) > limit:
                raise InfeasibleError(f"more than {limit} feasible chains: instance too large to enumerate")
            return
        for j in by_start.get(pos, []):
            b = placement.end(j) - pos
            walk(pos + b, hops + [j], blocks + [b])

    walk(1, [], [])
    return out


@dataclass(frozen=True)
class IlpResult:
    """Optimal capacities over a chain set and the objective Σ c_k."""

    chains: tuple[Chain, ...]
    total_capacity: int


def optimal_cache_allocation(
    servers: Sequence[ServerSpec],
    model: ModelSpec,
    placement: Placement,
    chains: Sequence[Chain],
    required_rate: float,
) -> IlpResult:
    """min Σ c_k s.t. Σ c_k μ_k ≥ required_rate and Σ_k m_kj c_k ≤ M̃_j, c integer (problem 7, chains given)."""
    chains = list(chains)
    if not chains:
        raise InfeasibleError("optimal cache allocation: no chains to allocate over")
    J = len(servers)
    slots = cache_slots(servers, model, placement)
    A = np.zeros((J, len(chains)))
    for k, ch in enumerate(chains):
        for j, b in zip(ch.servers, ch.blocks):
            A[j, k] += b
    rates = np.array([ch.rate_per_s for ch in chains])
    constraints = [
        LinearConstraint(A, -np.inf, np.array(slots, dtype=float)),
        LinearConstraint(rates[None, :], required_rate, np.inf),
    ]
    res = milp(np.ones(len(chains)), constraints=constraints, integrality=np.ones(len(chains)),
               bounds=Bounds(0, np.inf))
    if res.status != 0 or res.x is None:
        raise InfeasibleError(
            f"optimal cache allocation: no allocation reaches rate {required_rate:.4g}/s ({res.message})"
        )
    caps = np.round(res.x).astype(int)
    picked = tuple(
        Chain(ch.servers, ch.blocks, int(c), ch.service_time_s) for ch, c in zip(chains, caps) if c > 0
    )
    return IlpResult(picked, int(caps.sum()))


def brute_force_groups(
    servers: Sequence[ServerSpec],
    model: ModelSpec,
    c: int,
    arrival_rate: float,
    target_load: float = defaults.TARGET_LOAD,
) -> int | None:
    """Optimum of problem (10): fewest disjoint server groups, each covering L blocks with m_j(c),
    whose chain rates Σ_k 1/Σ_{j∈J_k} t_j(c) reach λ/(ρ̄ c); None if no grouping does. Tiny J only."""
    J = len(servers)
    if J > 12:
        raise ValueError("brute_force_groups is exponential; use at most 12 servers")
    m = blocks_array(servers, model, c)
    t = np.array([s.tau_c_s + s.tau_p_s * int(mj) for s, mj in zip(servers, m)])
    need = arrival_rate / (target_load * c)
    # Only minimal covering groups matter: dropping a server that is not needed only speeds the chain up.
    groups = []
    for size in range(1, J + 1):
        for g in itertools.combinations(range(J), size):
            if m[list(g)].sum() >= model.num_blocks and all(m[list(g)].sum() - m[j] < model.num_blocks for j in g):
                groups.append((frozenset(g), 1.0 / t[list(g)].sum()))
    best: int | None = None

    def search(start: int, used: frozenset, count: int, rate: float) -> None:
        nonlocal best
        if rate >= need * (1 - 1e-12):
            if best is None or count < best:
                best = count
            return
        if best is not None and count + 1 >= best:
            return
        for i in range(start, len(groups)):
            g, r = groups[i]
            if not (g & used):
                search(i + 1, used | g, count + 1, rate + r)

    search(0, frozenset(), 0, 0.0)
    return best
