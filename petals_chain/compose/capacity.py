"""Per-server quantities that depend on the reserved concurrency c: blocks m_j(c), c_max, cache slots M̃_j.

Every one of them floors a ratio of memory sizes, and all of them use :func:`floor_ratio`, the one rounding
rule for floating inputs (see its docstring). In particular the cache slots of eq. 3 (docs/model.md,
"Cache slots") have one implementation, :func:`slots_left`: the orchestrator composes with it and a PETALS server
sizes its attention cache with it (through ``BlockSizes.cache_slots``), so the two never disagree by a slot.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from petals_chain.model import ModelSpec, Placement, ServerSpec

# Memory sizes are floats (0.1 GB, 1.43 GB are not exact in binary), so a ratio that is an integer on paper can
# come out a hair below it. A quotient within this relative distance below an integer (absolute distance for
# quotients smaller than 1) counts as that integer; nothing else is rounded up.
RATIO_TOLERANCE = 1e-9


def floor_ratio(numerator: float, denominator: float) -> int:
    """⌊numerator / denominator⌋ under the module's rounding rule.

    The rule: q = numerator / denominator in floating point, then ⌊q + RATIO_TOLERANCE · max(1, |q|)⌋. For
    integer-valued sizes below 2**53 the float quotient is the exact one correctly rounded, so this is the exact
    floor except where the exact quotient falls short of an integer by at most RATIO_TOLERANCE relative (e.g. a
    20 GB budget at most 20 bytes short of k slots gets k). The result is negative when the numerator is (callers
    read a negative slot count as "over budget").
    """
    q = numerator / denominator
    return math.floor(q + RATIO_TOLERANCE * max(1.0, abs(q)))


def floor_ratio_array(numerators: np.ndarray, denominator: float) -> np.ndarray:
    """:func:`floor_ratio` element-wise over an array of numerators, as int64."""
    q = np.asarray(numerators, dtype=float) / denominator
    return np.floor(q + RATIO_TOLERANCE * np.maximum(1.0, np.abs(q))).astype(np.int64)


def slots_left(memory_bytes: float, block_bytes: float, cache_bytes: float, num_blocks: int) -> int:
    """M̃_j = ⌊(M_j − s_m·m_j) / s_c⌋ (eq. 3): block-job cache slots left on a server of M_j bytes holding m_j
    blocks of s_m bytes, with s_c bytes of cache per block per job; negative when the blocks alone exceed M_j."""
    return floor_ratio(memory_bytes - block_bytes * num_blocks, cache_bytes)


def blocks_for_capacity(server: ServerSpec, model: ModelSpec, c: int) -> int:
    """m_j(c) = min(⌊M_j / (s_m + s_c c)⌋, L): blocks a server can hold while reserving cache for c jobs."""
    return min(floor_ratio(server.memory_bytes, model.block_bytes + model.cache_bytes * c), model.num_blocks)


def blocks_array(servers: Sequence[ServerSpec], model: ModelSpec, c: int) -> np.ndarray:
    """m_j(c) for every server, as an int array."""
    mem = np.array([s.memory_bytes for s in servers], dtype=float)
    m = floor_ratio_array(mem, model.block_bytes + model.cache_bytes * c)
    return np.minimum(m, model.num_blocks)


def max_concurrency(servers: Sequence[ServerSpec], model: ModelSpec) -> int:
    """c_max = ⌊(max_j M_j - s_m) / s_c⌋: the largest c at which some server holds a block."""
    best = max(s.memory_bytes for s in servers)
    return max(0, floor_ratio(best - model.block_bytes, model.cache_bytes))


def cache_slots(servers: Sequence[ServerSpec], model: ModelSpec, placement: Placement) -> list[int]:
    """M̃_j (eq. 3) of every server after the placement: :func:`slots_left` element-wise, the same float operations
    through :func:`floor_ratio_array` (as :func:`blocks_array` is :func:`blocks_for_capacity`'s), so that GCA's
    setup at J in the thousands is not a Python call per server; tests/compose/test_cache_slots.py checks that it
    agrees with slots_left and with the server's own count."""
    mem = np.array([s.memory_bytes for s in servers], dtype=float)
    held = np.asarray(placement.num_blocks, dtype=float)
    return floor_ratio_array(mem - model.block_bytes * held, model.cache_bytes).tolist()
