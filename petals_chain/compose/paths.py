"""Shortest chain through a placement by dynamic programming over block positions.

An edge (i, j) of the placement DAG depends on i only through i's end block
e_i = a_i + m_i, so the best way to *reach* a block position is all that
matters: one pass over positions 2..L+1 costs O(Σ_j m_j). GCA (fastest chain
per round) and the simulated PETALS/BPRR routers (with alloc penalties and
waiting times) share this one routine; numba compiles it when available.
"""

from __future__ import annotations

import numpy as np

try:
    from numba import njit as _njit
except ImportError:  # pragma: no cover - exercised only where numba is missing
    _njit = None


def group_by_end(end: np.ndarray, num_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    """Server order sorted by end position (stable) and, per position e, its slice starts[e]:starts[e+1]."""
    order = np.argsort(end, kind="mergesort").astype(np.int64)
    starts = np.zeros(num_blocks + 3, dtype=np.int64)
    for e in end:
        starts[e + 1] += 1
    return order, np.cumsum(starts).astype(np.int64)


def _route_dp_py(first, end, tau_c, tau_p, slots, order, starts, num_blocks, penalty, free_at, now, use_wait,
              dist, best_server, best_prev, out_servers, out_blocks):
    """Shortest position-1 → position-(L+1) path of the placement DAG; fills out_*, returns the hop count (0: none).

    Edge (p → e_j) at server j costs τc_j + τp_j m + penalty_j (+ (free_at[j, m-1] − now)⁺ if use_wait),
    m = e_j − p; edges with m > slots_j are absent. Ties keep the first found (lower p, lower index).
    """
    L1 = num_blocks + 1
    for p in range(L1 + 1):
        dist[p] = np.inf
        best_server[p] = -1
        best_prev[p] = -1
    dist[1] = 0.0
    for e in range(2, L1 + 1):
        for g in range(starts[e], starts[e + 1]):
            j = order[g]
            lo = first[j]
            if e - slots[j] > lo:
                lo = e - slots[j]
            base = tau_c[j] + penalty[j]
            for p in range(lo, e):
                if dist[p] == np.inf:
                    continue
                m = e - p
                cost = dist[p] + base + tau_p[j] * m
                if use_wait:
                    w = free_at[j, m - 1] - now
                    if w > 0.0:
                        cost += w
                if cost < dist[e]:
                    dist[e] = cost
                    best_server[e] = j
                    best_prev[e] = p
    if dist[L1] == np.inf:
        return 0
    hops = 0
    e = L1
    while e != 1:
        hops += 1
        e = best_prev[e]
    h = hops
    e = L1
    while e != 1:
        h -= 1
        out_servers[h] = best_server[e]
        out_blocks[h] = e - best_prev[e]
        e = best_prev[e]
    return hops


route_dp = _njit(cache=True)(_route_dp_py) if _njit is not None else _route_dp_py
