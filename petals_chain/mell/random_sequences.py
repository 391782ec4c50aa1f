"""Random request sequences for a Mell scheduler: sizes that grow, finish and arrive, slot by slot.

The tests drive the scheduler over these to check its invariants (Theorem 1) and its GPU count against the exact
optimum (Theorem 2); the ``mell-theorem2`` experiment does the latter at scale. One slot is drawn by
:func:`next_slot` and applied by :func:`run_sequence`; both draw from the caller's generator in a fixed order, so a
seed fixes the whole sequence.

A size is drawn by :func:`draw_size`: with probability ``tiny_share`` a tiny request (1 to C/8 tokens, the
paper's T class), otherwise one of C/8 to 3C/4 tokens (S, M and L requests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

MIN_CAPACITY = 16  # below this the size ranges (C/8, C/6) are empty


class Scheduler(Protocol):
    """What :func:`run_sequence` needs of a scheduler (Mell's and the baselines all have it)."""

    C: int

    def step(self, arrivals: Mapping[int, int], departures: Iterable[int], growth: Mapping[int, int],
             final_sizes: Mapping[int, int]) -> Any: ...


@dataclass(frozen=True)
class SequenceShape:
    """How a sequence's slots are drawn.

    ``arrivals_per_step``: Poisson mean of the arrivals per slot; ``max_growth``: a live request grows by
    0..max_growth − 1 tokens per slot (capped at C); ``max_life``: a request lives 1..max_life − 1 slots;
    ``tiny_share``: the share of tiny arrivals (:func:`draw_size`); ``single_op``: every slot is exactly one
    operation (one arrival, one departure or one growth of 1..C/6 − 1 tokens) instead of a mixed slot.
    """

    arrivals_per_step: float = 2.0
    max_growth: int = 20
    max_life: int = 40
    tiny_share: float = 0.3
    single_op: bool = False

    def __post_init__(self) -> None:
        if not self.arrivals_per_step >= 0:
            raise ValueError(f"arrivals_per_step must be >= 0, got {self.arrivals_per_step}")
        if self.max_growth < 1:
            raise ValueError(f"max_growth must be >= 1, got {self.max_growth}")
        if self.max_life < 2:
            raise ValueError(f"max_life must be >= 2, got {self.max_life}")
        if not 0 <= self.tiny_share <= 1:
            raise ValueError(f"tiny_share must lie in [0, 1], got {self.tiny_share}")


def draw_size(rng: np.random.Generator, capacity: int, tiny_share: float) -> int:
    """One arrival's size in tokens: tiny (1..C/8) with probability ``tiny_share``, else C/8 + 1 .. 3C/4 − 1."""
    if rng.random() < tiny_share:
        return int(rng.integers(1, capacity // 8 + 1))
    return int(rng.integers(capacity // 8 + 1, capacity // 2 + capacity // 4))


def next_slot(rng: np.random.Generator, live: dict[int, list[int]], next_id: int, capacity: int,
              shape: SequenceShape = SequenceShape()
              ) -> tuple[tuple[dict[int, int], list[int], dict[int, int]], int]:
    """Draw one slot: ``((arrivals, departures, growth), next_id)``, updating ``live`` (request id -> [size,
    slots left]) in place.

    A mixed slot ends the requests whose life ran out, grows every other live request and draws Poisson arrivals
    (ids from ``next_id`` on); a single-operation slot makes one arrival (always when nothing is live), one
    departure or one growth.
    """
    deps: list[int] = []
    growth: dict[int, int] = {}
    arr: dict[int, int] = {}
    if shape.single_op:
        kind = rng.integers(3) if live else 0
        if kind == 0:
            arr[next_id] = draw_size(rng, capacity, shape.tiny_share)
            live[next_id] = [arr[next_id], int(rng.integers(1, shape.max_life))]
            next_id += 1
        elif kind == 1:
            r = int(rng.choice(list(live)))
            deps.append(r)
            del live[r]
        else:
            r = int(rng.choice(list(live)))
            live[r][0] = min(capacity, live[r][0] + int(rng.integers(1, capacity // 6)))
            growth[r] = live[r][0]
        return (arr, deps, growth), next_id
    deps = [r for r, (_, rem) in live.items() if rem <= 0]
    for r in deps:
        del live[r]
    for r, v in live.items():
        v[0] = min(capacity, v[0] + int(rng.integers(0, shape.max_growth)))
        v[1] -= 1
        growth[r] = v[0]
    for _ in range(rng.poisson(shape.arrivals_per_step)):
        s = draw_size(rng, capacity, shape.tiny_share)
        arr[next_id] = s
        live[next_id] = [s, int(rng.integers(1, shape.max_life))]
        next_id += 1
    return (arr, deps, growth), next_id


def run_sequence(sched: Scheduler, rng: np.random.Generator, steps: int, *, arrivals_per_step: float = 2.0,
                 max_growth: int = 20, max_life: int = 40, tiny_share: float = 0.3, single_op: bool = False,
                 check: Callable[[Any, Any], None] | None = None) -> list[Any]:
    """Drive ``sched`` for ``steps`` slots drawn by :func:`next_slot` (the keywords are a
    :class:`SequenceShape`'s); call ``check(sched, result)`` after each slot; return the slots' results.

    Every arrival announces C as its final size (the scheduler does not know how far a request will grow).
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    if sched.C < MIN_CAPACITY:
        raise ValueError(f"capacity must be >= {MIN_CAPACITY} tokens for these size ranges, got {sched.C}")
    shape = SequenceShape(arrivals_per_step, max_growth, max_life, tiny_share, single_op)
    live: dict[int, list[int]] = {}
    nxt = 0
    out = []
    for _ in range(steps):
        (arr, deps, growth), nxt = next_slot(rng, live, nxt, sched.C, shape)
        res = sched.step(arr, deps, growth, {r: sched.C for r in arr})
        out.append(res)
        if check is not None:
            check(sched, res)
    return out
