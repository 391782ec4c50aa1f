"""Machinery of the per-chain dispatch baselines (docs/model.md, "Dispatch baselines"): chain = FCFS queue, c_l slots.

A policy picks a chain on arrival and the job stays there: it starts at once if
the chain has a free slot, else it waits in that chain's own FIFO queue.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from petals_chain.dispatch.base import Start, check_chains


def pick(candidates: Sequence[int], u: float) -> int:
    """The candidate at position ⌊u·n⌋ (u uniform in [0, 1)): a uniform random tie-break from one draw."""
    return candidates[min(int(u * len(candidates)), len(candidates) - 1)]


class PerChainFCFS:
    """Base class: per-chain FIFO queues; subclasses implement :meth:`choose`.

    Every arrival draws exactly one uniform from ``rng`` (used or not), so the
    random stream is the same as in the numba fast path, which pre-draws one
    uniform per job.
    """

    name = "per-chain"

    def __init__(self, rates: Sequence[float], capacities: Sequence[int], rng: np.random.Generator) -> None:
        self.rates, self.capacities = check_chains(rates, capacities)
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"{self.name}: rng must be a numpy.random.Generator, got {type(rng).__name__}")
        self._rng = rng
        self._busy = [0] * len(self.rates)
        self._queues: list[deque[int]] = [deque() for _ in self.rates]

    def number_at(self, k: int) -> int:
        """Z_k: jobs at chain k, in service plus waiting."""
        return self._busy[k] + len(self._queues[k])

    def choose(self, u: float) -> int:
        """The chain an arriving job joins, given one uniform draw ``u`` for ties."""
        raise NotImplementedError

    def on_arrival(self, job: int, now: float = 0.0) -> list[Start]:
        k = self.choose(float(self._rng.random()))
        if self._busy[k] < self.capacities[k]:
            self._busy[k] += 1
            return [Start(job, k)]
        self._queues[k].append(job)
        return []

    def on_departure(self, job: int, chain: int, now: float = 0.0) -> list[Start]:
        if self._busy[chain] <= 0:
            raise ValueError(f"{self.name}: departure from chain {chain}, which has no job in service")
        queue = self._queues[chain]
        if queue:
            return [Start(queue.popleft(), chain)]
        self._busy[chain] -= 1
        return []

    def queue_length(self) -> int:
        return sum(len(q) for q in self._queues)

    def occupancy(self) -> list[int]:
        return list(self._busy)
