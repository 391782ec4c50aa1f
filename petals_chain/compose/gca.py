"""GCA (Algorithm 2): peel off the fastest chain, give it all the cache it can take, repeat.

The shortest j0 → j_end path is found by dynamic programming over block
positions instead of Dijkstra over server pairs: an edge (i, j) depends on i
only through i's end block e_i = a_i + m_i, so the best way to *reach* block
position p is all that matters. One round costs O(Σ_j m_j), which keeps the
whole algorithm near O(K · J · L) rather than O(J⁴).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from petals_chain.compose.capacity import cache_slots
from petals_chain.model import Chain, ModelSpec, Placement, ServerSpec

try:  # numba makes the per-round DP ~100x faster; the pure-Python path gives identical results
    from numba import njit as _njit
except ImportError:  # pragma: no cover - exercised only where numba is missing
    _njit = None


def _gca_rounds(first, end, tau_c, tau_p, slots, num_blocks, out_servers, out_blocks, out_caps):
    """Run every GCA round over arrays; fill the out_* buffers, return the number of chains."""
    n = first.shape[0]
    L1 = num_blocks + 1
    # servers grouped by end position (positions 2..L+1), each group in index order
    order = np.argsort(end, kind="mergesort")
    starts = np.zeros(L1 + 2, dtype=np.int64)
    for idx in range(n):
        starts[end[order[idx]] + 1] += 1
    for p in range(1, L1 + 2):
        starts[p] += starts[p - 1]
    dist = np.empty(L1 + 1, dtype=np.float64)
    best_server = np.empty(L1 + 1, dtype=np.int64)
    best_prev = np.empty(L1 + 1, dtype=np.int64)
    remaining = slots.copy()
    num_chains = 0
    pos_buf = np.empty(L1 + 1, dtype=np.int64)
    while True:
        for p in range(L1 + 1):
            dist[p] = np.inf
            best_server[p] = -1
            best_prev[p] = -1
        dist[1] = 0.0
        for e in range(2, L1 + 1):
            for g in range(starts[e], starts[e + 1]):
                j = order[g]
                lo = first[j]
                lo = max(lo, e - remaining[j])  # edge needs M_j >= m_ij = e - p
                for p in range(lo, e):
                    if dist[p] == np.inf:
                        continue
                    cost = dist[p] + tau_c[j] + tau_p[j] * (e - p)
                    if cost < dist[e]:
                        dist[e] = cost
                        best_server[e] = j
                        best_prev[e] = p
        if dist[L1] == np.inf:
            return num_chains
        # walk back from L+1 to position 1
        hops = 0
        e = L1
        while e != 1:
            pos_buf[hops] = e
            hops += 1
            e = best_prev[e]
        cap = -1
        for h in range(hops):
            e = pos_buf[h]
            j = best_server[e]
            blocks = e - best_prev[e]
            c_here = remaining[j] // blocks
            if cap < 0 or c_here < cap:
                cap = c_here
        for h in range(hops):
            e = pos_buf[hops - 1 - h]
            j = best_server[e]
            blocks = e - best_prev[e]
            remaining[j] -= blocks * cap
            out_servers[num_chains, h] = j
            out_blocks[num_chains, h] = blocks
        for h in range(hops, out_servers.shape[1]):
            out_servers[num_chains, h] = -1
            out_blocks[num_chains, h] = 0
        out_caps[num_chains] = cap
        num_chains += 1
        if num_chains == out_caps.shape[0]:
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
) -> tuple[Chain, ...]:
    """Greedy cache allocation over a placement: chains fastest first, each with its capacity c_k."""
    placement.check_for(model)
    hosting = [j for j in range(placement.num_servers) if placement.num_blocks[j] > 0]
    if not hosting:
        return ()
    idx = np.array(hosting, dtype=np.int64)
    first = np.array([placement.first_block[j] for j in hosting], dtype=np.int64)
    end = np.array([placement.end(j) for j in hosting], dtype=np.int64)
    tau_c = np.array([servers[j].tau_c_s for j in hosting], dtype=np.float64)
    tau_p = np.array([servers[j].tau_p_s for j in hosting], dtype=np.float64)
    all_slots = cache_slots(servers, model, placement)
    slots = np.array([max(all_slots[j], 0) for j in hosting], dtype=np.int64)
    # Each round exhausts at least one (server, predecessor-position) edge, so this bounds the rounds.
    max_chains = int(sum(placement.num_blocks[j] for j in hosting)) + 1
    max_hops = min(model.num_blocks, len(hosting))
    out_servers = np.full((max_chains, max_hops), -1, dtype=np.int64)
    out_blocks = np.zeros((max_chains, max_hops), dtype=np.int64)
    out_caps = np.zeros(max_chains, dtype=np.int64)
    run = _gca_rounds_fast if use_numba else _gca_rounds
    k = run(first, end, tau_c, tau_p, slots, model.num_blocks, out_servers, out_blocks, out_caps)
    chains = []
    for r in range(k):
        hops_local = [int(x) for x in out_servers[r] if x >= 0]
        hops = tuple(int(idx[x]) for x in hops_local)
        blocks = tuple(int(b) for b in out_blocks[r, : len(hops)])
        chains.append(Chain(hops, blocks, int(out_caps[r]), chain_service_time(servers, hops, blocks)))
    return tuple(chains)
