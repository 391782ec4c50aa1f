"""JFFC with migration: the lower-bound reference of Theorem 3.7 (jobs always sit on the fastest slots)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from petals_chain.dispatch.base import Start, check_chains


class JFFCMigration:
    """JFFC plus one migration per departure: a freed faster slot takes a job off the slowest busy chain.

    Arrivals join the fastest chain with a free slot (ties by index), else one
    central FIFO queue. On a departure from chain k with the queue empty, if the
    slowest busy chain s is strictly slower than k, its longest-resident job
    moves to k (``Start(job, k, migrated_from=s)``). With exponential sizes the
    number in system is then the birth-death chain of the lower bound ν̄_n.
    Deterministic: ``rng`` is accepted for a uniform factory signature, never drawn.
    """

    name = "JFFC-migration"

    def __init__(
        self, rates: Sequence[float], capacities: Sequence[int], rng: np.random.Generator | None = None
    ) -> None:
        self.rates, self.capacities = check_chains(rates, capacities)
        self._by_rank = sorted(range(len(self.rates)), key=lambda k: (-self.rates[k], k))
        self._busy = [0] * len(self.rates)
        self._jobs_on: list[dict[int, None]] = [{} for _ in self.rates]  # insertion order = residence order
        self._queue: deque[int] = deque()

    def on_arrival(self, job: int, now: float = 0.0) -> list[Start]:
        for k in self._by_rank:
            if self._busy[k] < self.capacities[k]:
                self._busy[k] += 1
                self._jobs_on[k][job] = None
                return [Start(job, k)]
        self._queue.append(job)
        return []

    def on_departure(self, job: int, chain: int, now: float = 0.0) -> list[Start]:
        resident = self._jobs_on[chain]
        if job not in resident:
            raise ValueError(f"JFFC-migration: job {job} departs from chain {chain}, where it is not in service")
        del resident[job]
        if self._queue:
            nxt = self._queue.popleft()
            resident[nxt] = None
            return [Start(nxt, chain)]
        self._busy[chain] -= 1
        slowest = next((s for s in reversed(self._by_rank) if self._busy[s] > 0), None)
        if slowest is None or not self.rates[slowest] < self.rates[chain]:
            return []
        mover = next(iter(self._jobs_on[slowest]))
        del self._jobs_on[slowest][mover]
        self._busy[slowest] -= 1
        resident[mover] = None
        self._busy[chain] += 1
        return [Start(mover, chain, migrated_from=slowest)]

    def queue_length(self) -> int:
        return len(self._queue)

    def occupancy(self) -> list[int]:
        return list(self._busy)
