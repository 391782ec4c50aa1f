"""Eq. 3, cache slots M̃_j = ⌊(M_j − s_m·m_j)/s_c⌋: the server's count (BlockSizes.cache_slots, what a PETALS server
sizes its attention cache with) equals the orchestrator's (compose.capacity.cache_slots, what GCA composes with),
and both follow the documented rounding rule, checked here against exact rational arithmetic."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from petals_chain.checkpoint.sizing import BlockSizes, parse_budget
from petals_chain.compose.capacity import (
    RATIO_TOLERANCE,
    blocks_array,
    blocks_for_capacity,
    cache_slots,
    floor_ratio,
    slots_left,
)
from petals_chain.model import GB, ModelSpec, Placement, ServerSpec


def server_count(memory: float, block: int, cache: int, m: int) -> int:
    """Slots as the PETALS server computes them for a span of m blocks."""
    return BlockSizes(max(m, 1), block, cache, 2048, "float32").cache_slots(memory, m)


def orchestrator_count(memory: float, block: int, cache: int, m: int) -> int:
    """Slots as the orchestrator computes them: the registered budget, the checkpoint's ModelSpec, a placement."""
    model = BlockSizes(max(m, 1), block, cache, 2048, "float32").model_spec("m")
    placement = Placement((1 if m else 0,), (m,))
    return cache_slots([ServerSpec("s", memory, 0.0, 1.0)], model, placement)[0]


def exact_rule(memory: float, block: float, cache: float, m: int) -> int:
    """The documented rule in exact arithmetic: ⌊q + tol·max(1, |q|)⌋ with q the exact quotient of the inputs."""
    q = (Fraction(memory) - Fraction(block) * m) / Fraction(cache)
    return math.floor(q + Fraction(RATIO_TOLERANCE) * max(Fraction(1), abs(q)))


def far_from_tolerance_edge(memory: float, block: float, cache: float, m: int) -> bool:
    """Whether the exact quotient is clear of the rule's rounding edge (where float and exact may differ)."""
    q = (Fraction(memory) - Fraction(block) * m) / Fraction(cache)
    slack = Fraction(RATIO_TOLERANCE) * max(Fraction(1), abs(q))
    edge = q + slack - math.floor(q + slack)
    return Fraction(1, 10**6) * slack < edge < 1 - Fraction(1, 10**6) * slack


@settings(max_examples=400, deadline=None)
@given(
    memory=st.one_of(
        st.integers(10**6, 10**12).map(float),  # whole bytes
        st.floats(1e6, 1e12, allow_nan=False, allow_infinity=False),  # fractional bytes
        st.sampled_from(["512MB", "1.5GiB", "20GB", "0.3GiB", "7.77GB", "80GiB"]).map(parse_budget),
    ),
    block=st.integers(1_000, 3 * 10**9),
    cache=st.integers(1_000, 10**8),
    m=st.integers(0, 80),
)
@example(memory=20e9, block=10**9, cache=10**8, m=15)  # exactly 50 slots
@example(memory=20e9 - 1, block=10**9, cache=10**8, m=15)  # a byte short of 50 slots on 5 GB free: within tolerance, 50
@example(memory=2e8 - 1, block=10**6, cache=10**6, m=100)  # 1 B short of 100 slots on 100 MB: 99
@example(memory=1e9, block=10**9, cache=10**6, m=1)  # blocks fill memory exactly: 0 slots
@example(memory=1e9, block=10**9, cache=10**6, m=2)  # over budget: negative on both sides
def test_server_and_orchestrator_count_the_same_slots(memory: float, block: int, cache: int, m: int) -> None:
    """For random budgets, block and cache sizes and spans (and exact boundaries), both sides agree to the slot,
    and the count is the exact floor under the documented tolerance."""
    ours = server_count(memory, block, cache, m)
    assert ours == orchestrator_count(memory, block, cache, m)
    assert ours == slots_left(memory, float(block), float(cache), m)
    if far_from_tolerance_edge(memory, block, cache, m):
        assert ours == exact_rule(memory, block, cache, m)


@pytest.mark.parametrize("k", [1, 2, 7, 50, 4096])
@pytest.mark.parametrize(("block", "cache", "m"), [(10**6, 3 * 10**6, 30), (1_234_567, 89_101, 9), (10**9, 10**7, 40)])
def test_exact_boundaries(k: int, block: int, cache: int, m: int) -> None:
    """M = s_m·m + k·s_c gives k slots on both sides; one cache slot less a byte gives k − 1 unless the shortfall is
    within the relative tolerance; one byte more still gives k."""
    exact = float(block * m + k * cache)
    assert server_count(exact, block, cache, m) == orchestrator_count(exact, block, cache, m) == k
    assert server_count(exact + 1, block, cache, m) == orchestrator_count(exact + 1, block, cache, m) == k
    short = exact - 1
    want = k if 1 <= RATIO_TOLERANCE * k * cache else k - 1
    assert server_count(short, block, cache, m) == orchestrator_count(short, block, cache, m) == want
    assert exact_rule(short, block, cache, m) == want


def test_paper_ratios_do_not_floor_one_short() -> None:
    """Sizes in decimal GB that are not exact in binary still give the slots they give on paper."""
    assert slots_left(10.0, 1.0, 0.1, 6) == 40  # (10 − 6)/0.1 is 39.99999999999999 in floats
    assert slots_left(0.7, 0.1, 0.1, 3) == 4
    assert slots_left(40 * GB, 1.43 * GB, 0.11 * GB, 10) == 233  # (40 − 14.3)/0.11 = 233.63…
    assert slots_left(1.43 * GB * 28, 1.43 * GB, 0.11 * GB, 28) == 0
    assert floor_ratio(40 * GB, 1.43 * GB + 0.0 * GB) == 27
    assert floor_ratio(3 * 0.1, 0.1) == 3  # 0.30000000000000004 / 0.1
    assert floor_ratio(0.3, 0.1) == 3  # 2.9999999999999996 in floats


def test_blocks_array_uses_the_same_rule() -> None:
    """m_j(c) from the vectorised path equals the scalar path for random and boundary budgets."""
    rng = np.random.default_rng(3)
    model = ModelSpec(70, 1.32 * GB, 0.11 * GB)
    budgets = list(rng.uniform(1, 200, 300) * GB) + [1.32 * GB * k + 0.11 * GB * k * 3 for k in range(1, 71)]
    servers = [ServerSpec(f"s{i}", float(b), 0.0, 1.0) for i, b in enumerate(budgets)]
    for c in (0, 1, 3, 17):
        assert blocks_array(servers, model, c).tolist() == [blocks_for_capacity(s, model, c) for s in servers]
    exact = [ServerSpec(f"e{k}", 1.32 * GB * k + 0.11 * GB * k * 3, 0.0, 1.0) for k in range(1, 71)]
    assert blocks_array(exact, model, 3).tolist() == list(range(1, 71))
