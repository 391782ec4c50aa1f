"""GCA (Algorithm 2): peel off the fastest chain, give it all the cache it can take, repeat.

The shortest j0 → j_end path comes from :func:`petals_chain.compose.paths.route_dp`
(dynamic programming over block positions, O(Σ_j m_j) per round), which keeps
the whole algorithm near O(K · J · L) rather than O(J⁴) with plain Dijkstra.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from petals_chain.compose.capacity import cache_slots
from petals_chain.compose.paths import group_by_end, route_dp
from petals_chain.model import Chain, ModelSpec, Placement, ServerSpec

try:  # numba makes the per-round DP ~100x faster; the pure-Python path gives identical results
    from numba import njit as _njit
except ImportError:  # pragma: no cover - exercised only where numba is missing
    _njit = None


def _gca_rounds(first, end, tau_c, tau_p, slots, order, starts, num_blocks, out_servers, out_blocks, out_caps):
    """Run every GCA round over arrays; fill the out_* buffers, return the number of chains."""
    L1 = num_blocks + 1
    dist = np.empty(L1 + 1, dtype=np.float64)
    best_server = np.empty(L1 + 1, dtype=np.int64)
    best_prev = np.empty(L1 + 1, dtype=np.int64)
    no_penalty = np.zeros(first.shape[0], dtype=np.float64)
    no_wait = np.zeros((1, 1), dtype=np.float64)
    remaining = slots.copy()
    num_chains = 0
    while num_chains < out_caps.shape[0]:
        hops = route_dp(first, end, tau_c, tau_p, remaining, order, starts, num_blocks, no_penalty, no_wait, 0.0,
                        False, dist, best_server, best_prev, out_servers[num_chains], out_blocks[num_chains])
        if hops == 0:
            break
        cap = -1
        for h in range(hops):
            c_here = remaining[out_servers[num_chains, h]] // out_blocks[num_chains, h]
            if cap < 0 or c_here < cap:
                cap = c_here
        for h in range(hops):
            remaining[out_servers[num_chains, h]] -= out_blocks[num_chains, h] * cap
        for h in range(hops, out_servers.shape[1]):
            out_servers[num_chains, h] = -1
            out_blocks[num_chains, h] = 0
        out_caps[num_chains] = cap
        num_chains += 1
    return num_chains


_gca_rounds_fast = _njit(cache=True)(_gca_rounds) if _njit is not None else _gca_rounds


def chain_service_time(servers: Sequence[ServerSpec], hops: Sequence[int], blocks: Sequence[int]) -> float:
    """T_k = Σ_{(i,j)∈k} (τc_j + τp_j m_ij)  (eq. 2)."""
    return float(sum(servers[j].tau_c_s + servers[j].tau_p_s * m for j, m in zip(hops, blocks)))


def gca(
    servers: Sequence[ServerSpec],
    model: ModelSpec,
    placement: Placement,
    *,
    use_numba: bool = True,
    limit: int | None = None,
    slots: Sequence[int] | None = None,
) -> tuple[Chain, ...]:
    """Greedy cache allocation over a placement: chains fastest first, each with its capacity c_k; with ``limit``
    only the first ``limit`` of them (the same chains, its rounds cut short: the default composition asks for
    the fastest chain alone to rule out a placement before it pays for every round). ``slots`` replaces each
    server's free cache slots M̃_j (eq. 3), e.g. by what chains kept from an earlier composition leave
    (compose/repair.py)."""
    placement.check_for(model)
    count_all = np.asarray(placement.num_blocks, dtype=np.int64)
    idx = np.flatnonzero(count_all > 0).astype(np.int64)  # the hosting servers
    if idx.size == 0:
        return ()
    hosting = idx.tolist()
    count = count_all[idx]
    first = np.asarray(placement.first_block, dtype=np.int64)[idx]
    end = first + count
    tau_c = np.array([servers[j].tau_c_s for j in hosting], dtype=np.float64)
    tau_p = np.array([servers[j].tau_p_s for j in hosting], dtype=np.float64)
    free = cache_slots(servers, model, placement) if slots is None else slots
    if len(free) != len(servers):
        raise ValueError(f"gca: {len(free)} slot counts for {len(servers)} servers")
    slots = np.maximum(np.asarray(free, dtype=np.int64)[idx], 0)
    # Each round exhausts at least one (server, predecessor-position) edge, so this bounds the rounds.
    max_chains = int(count.sum()) + 1
    if limit is not None:
        max_chains = min(max_chains, max(int(limit), 0))
    max_hops = min(model.num_blocks, len(hosting))
    out_servers = np.full((max_chains, max_hops), -1, dtype=np.int64)
    out_blocks = np.zeros((max_chains, max_hops), dtype=np.int64)
    out_caps = np.zeros(max_chains, dtype=np.int64)
    run = _gca_rounds_fast if use_numba else _gca_rounds
    order, starts = group_by_end(end, model.num_blocks)
    k = run(first, end, tau_c, tau_p, slots, order, starts, model.num_blocks, out_servers, out_blocks, out_caps)
    chains = []
    for row, row_blocks, cap in zip(out_servers[:k].tolist(), out_blocks[:k].tolist(), out_caps[:k].tolist()):
        hops = tuple(hosting[x] for x in row if x >= 0)
        blocks = tuple(row_blocks[: len(hops)])
        chains.append(Chain(hops, blocks, cap, chain_service_time(servers, hops, blocks)))
    return tuple(chains)
