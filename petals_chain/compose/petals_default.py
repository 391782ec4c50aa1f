"""PETALS' own block selection (petals/server/block_selection.py), re-expressed over our model.

Each server, in joining order, takes the contiguous span whose sorted per-block
swarm throughputs are lexicographically smallest; afterwards servers move while
doing so would raise the swarm's minimum throughput past ``balance_quality``.
A server's per-block throughput is 1/τp_j; its span length follows from its
memory with PETALS' fixed attention cache (``cache_jobs`` full-length sessions).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from petals_chain.compose.capacity import blocks_array
from petals_chain.model import InfeasibleError, ModelSpec, Placement, ServerSpec, validate_servers

# PETALS 2.2 gives a non-multi-query model 4096 cache tokens per block: two 2048-token sessions.
DEFAULT_CACHE_JOBS = 2
# The chain-serving authors' simulator gives a low-end server (less memory than the cluster's largest) at most
# this many blocks under PETALS; PETALS itself sizes the span from memory. Used only by the ``petals_capped``
# baseline, which reproduces their comparison.
AUTHORS_LOW_END_SPAN = 4


def _best_start(throughput: np.ndarray, m: int) -> int:
    """Start (0-indexed) of the window whose sorted throughputs are lexicographically smallest."""
    L = throughput.shape[0]
    best, best_key = 0, None
    for a in range(L - m + 1):
        key = tuple(np.sort(throughput[a : a + m]))
        if best_key is None or key < best_key:
            best, best_key = a, key
    return best


def petals_placement(
    servers: Sequence[ServerSpec],
    model: ModelSpec,
    cache_jobs: int = DEFAULT_CACHE_JOBS,
    balance_quality: float = 0.75,
    max_rounds: int = 50,
    low_end_span: int | None = None,
) -> Placement:
    """Place blocks the way PETALS servers choose them when joining one by one, then rebalance.

    ``low_end_span`` caps the span of every server with less memory than the largest (the authors' model of
    PETALS, see :data:`AUTHORS_LOW_END_SPAN`); None sizes every span from memory as PETALS does."""
    servers = validate_servers(servers)
    L = model.num_blocks
    m = blocks_array(servers, model, cache_jobs)
    if low_end_span is not None:
        if isinstance(low_end_span, bool) or not isinstance(low_end_span, int) or low_end_span < 1:
            raise InfeasibleError(f"PETALS placement: field 'low_end_span' must be an integer >= 1, "
                                  f"got {low_end_span!r}")
        top = max(s.memory_bytes for s in servers)
        low = np.array([s.memory_bytes < top for s in servers])
        m = np.where(low, np.minimum(m, low_end_span), m)
    if int(m.sum()) < L:
        raise InfeasibleError(
            f"PETALS placement: the servers fit {int(m.sum())} of {L} blocks with cache for {cache_jobs} sessions"
            + ("" if low_end_span is None else f" (low-end spans capped at {low_end_span} blocks)")
        )
    speed = np.array([1.0 / s.tau_p_s for s in servers])
    throughput = np.zeros(L)
    start = np.zeros(len(servers), dtype=np.int64)
    for j in range(len(servers)):
        if m[j] == 0:
            continue
        start[j] = _best_start(throughput, int(m[j]))
        throughput[start[j] : start[j] + m[j]] += speed[j]
    for _ in range(max_rounds):
        moved = False
        for j in range(len(servers)):
            if m[j] == 0 or m[j] == L:
                continue
            before = throughput.min()
            trial = throughput.copy()
            trial[start[j] : start[j] + m[j]] -= speed[j]
            new = _best_start(trial, int(m[j]))
            if new == start[j]:
                continue
            trial[new : new + m[j]] += speed[j]
            # PETALS moves only if the swarm's bottleneck would improve enough.
            if trial.min() > 0 and before < balance_quality * trial.min():
                throughput, start[j], moved = trial, new, True
        if not moved:
            break
    first = tuple(int(start[j]) + 1 if m[j] > 0 else 0 for j in range(len(servers)))
    return Placement(first, tuple(int(x) for x in m))
