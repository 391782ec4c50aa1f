"""BPRR's CG-BP placement (Sun et al., Performance Evaluation 2025) with its choice of concurrency R."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from petals_chain.compose.capacity import blocks_array
from petals_chain.model import InfeasibleError, ModelSpec, Placement, ServerSpec, SpecError, validate_servers


def _amortised_order(servers: Sequence[ServerSpec], m: np.ndarray) -> np.ndarray:
    """Servers with m_j > 0 by ascending amortised time t̃_j = (τc_j + τp_j m_j) / m_j."""
    tau_c = np.array([s.tau_c_s for s in servers])
    tau_p = np.array([s.tau_p_s for s in servers])
    with np.errstate(divide="ignore", invalid="ignore"):
        amortised = np.where(m > 0, (tau_c + tau_p * m) / np.maximum(m, 1), np.inf)
    order = np.lexsort((np.arange(len(servers)), amortised))
    return order[m[order] > 0]


def max_concurrency_bprr(servers: Sequence[ServerSpec], model: ModelSpec) -> int:
    """R_max: the largest R for which Σ_j min(⌊M_j/(s_m + s_c R)⌋, L) ≥ L (CG-BP feasible)."""
    hi = int(max(s.memory_bytes for s in servers) // model.cache_bytes) + 1
    lo = 0
    while lo < hi:  # feasibility is monotone in R
        mid = (lo + hi + 1) // 2
        if int(blocks_array(servers, model, mid).sum()) >= model.num_blocks:
            lo = mid
        else:
            hi = mid - 1
    return lo


def fastest_chain_time(servers: Sequence[ServerSpec], model: ModelSpec, concurrency: int = 1) -> float:
    """T_1: service time of the first chain the greedy order builds (fastest servers until L blocks)."""
    m = blocks_array(servers, model, concurrency)
    covered, total = 0, 0.0
    for j in _amortised_order(servers, m):
        total += servers[j].tau_c_s + servers[j].tau_p_s * int(m[j])
        covered += int(m[j])
        if covered >= model.num_blocks:
            return total
    raise InfeasibleError("BPRR: the servers cannot hold one copy of the model")


def bprr_concurrency(servers: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float) -> int:
    """R = min(round(λT_1 + √(λT_1)), R_max), at least 1 (docs/model.md, "Baselines")."""
    if not arrival_rate > 0:
        raise SpecError(f"bprr: field 'arrival_rate' must be > 0, got {arrival_rate!r}")
    servers = validate_servers(servers)
    r_max = max_concurrency_bprr(servers, model)
    if r_max < 1:
        raise InfeasibleError("BPRR: the servers cannot hold the model with cache for even one job")
    load = arrival_rate * fastest_chain_time(servers, model)
    return max(1, min(round(load + math.sqrt(load)), r_max))


def cg_bp(servers: Sequence[ServerSpec], model: ModelSpec, concurrency: int) -> Placement:
    """CG-BP: m_j for R jobs, servers by t̃_j, each onto the window covering most under-served blocks."""
    servers = validate_servers(servers)
    L = model.num_blocks
    m = blocks_array(servers, model, concurrency)
    if int(m.sum()) < L:
        raise InfeasibleError(f"BPRR: with R={concurrency} the servers fit {int(m.sum())} of {L} blocks")
    served = np.zeros(L, dtype=np.int64)
    first = [0] * len(servers)
    for j in _amortised_order(servers, m):
        mj = int(m[j])
        least = served.min()
        best, best_key = 0, None
        for a in range(L - mj + 1):
            window = served[a : a + mj]
            key = (-int((window == least).sum()), tuple(np.sort(window)))
            if best_key is None or key < best_key:
                best, best_key = a, key
        first[j] = best + 1
        served[best : best + mj] += 1
    count = tuple(int(m[j]) if first[j] > 0 else 0 for j in range(len(servers)))
    return Placement(tuple(first), count)
