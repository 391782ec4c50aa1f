"""Per-server quantities that depend on the reserved concurrency c (paper eqs. 8, 9, 12, 3).

See docs/model.md, "Composition problem" for m_j(c) and c_max, and "Cache slots" for M̃_j.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from petals_chain.model import ModelSpec, Placement, ServerSpec

# Memory arithmetic is done in floats; this slack keeps 40 GB / 1.43 GB-style
# ratios that are integers on paper from flooring one short.
_FLOOR_SLACK = 1e-9


def safe_floor(x: float) -> int:
    """floor(x) that forgives float error just below an integer."""
    return math.floor(x + _FLOOR_SLACK)


def blocks_for_capacity(server: ServerSpec, model: ModelSpec, c: int) -> int:
    """m_j(c) = min(⌊M_j / (s_m + s_c c)⌋, L): blocks a server can hold while reserving cache for c jobs."""
    return min(safe_floor(server.memory_bytes / (model.block_bytes + model.cache_bytes * c)), model.num_blocks)


def blocks_array(servers: Sequence[ServerSpec], model: ModelSpec, c: int) -> np.ndarray:
    """m_j(c) for every server, as an int array."""
    mem = np.array([s.memory_bytes for s in servers], dtype=float)
    m = np.floor(mem / (model.block_bytes + model.cache_bytes * c) + _FLOOR_SLACK).astype(np.int64)
    return np.minimum(m, model.num_blocks)


def max_concurrency(servers: Sequence[ServerSpec], model: ModelSpec) -> int:
    """c_max = ⌊(max_j M_j - s_m) / s_c⌋: the largest c at which some server holds a block."""
    best = max(s.memory_bytes for s in servers)
    return max(0, safe_floor((best - model.block_bytes) / model.cache_bytes))


def cache_slots(servers: Sequence[ServerSpec], model: ModelSpec, placement: Placement) -> list[int]:
    """M̃_j = ⌊(M_j - s_m m_j) / s_c⌋ (eq. 3): cache slots (block-jobs) left after the placement."""
    out = []
    for s, m in zip(servers, placement.num_blocks):
        out.append(safe_floor((s.memory_bytes - model.block_bytes * m) / model.cache_bytes))
    return out
