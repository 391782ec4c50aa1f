"""JFFC with migration: the lower-bound reference of Theorem 3.7 (jobs always sit on the fastest slots)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from petals_chain.dispatch.base import Start, check_chains
from petals_chain.kernels.dispatch_rules import fastest_free, migration_source, speed_order


class JFFCMigration:
    """JFFC plus one migration per departure: a freed faster slot takes a job off the slowest busy chain.

    Arrivals join the fastest chain with a free slot (ties by index), else one
    central FIFO queue. On a departure from chain k with the queue empty, if the
    slowest busy chain s is strictly slower than k, its longest-resident job
    moves to k (``Start(job, k, migrated_from=s)``). With exponential sizes the
    number in system is then the birth-death chain of the lower bound ν̄_n.
    The decisions are :func:`~petals_chain.kernels.dispatch_rules.fastest_free` and
    :func:`~petals_chain.kernels.dispatch_rules.migration_source`, as in the simulator's kernel.
    Deterministic: ``rng`` is accepted for a uniform factory signature, never drawn.
    """

    name = "JFFC-migration"

    def __init__(
        self, rates: Sequence[float], capacities: Sequence[int], rng: np.random.Generator | None = None
    ) -> None:
        self.rates, self.capacities = check_chains(rates, capacities)
        self._by_rank, _ = speed_order(self.rates)
        self._rates = np.asarray(self.rates, dtype=np.float64)
        self._caps = np.asarray(self.capacities, dtype=np.int64)
        self._busy = np.zeros(len(self.rates), dtype=np.int64)
        self._jobs_on: list[dict[int, None]] = [{} for _ in self.rates]  # insertion order = residence order
        self._queue: deque[int] = deque()

    def on_arrival(self, job: int, now: float = 0.0) -> list[Start]:
        k = fastest_free(self._busy, self._caps, self._by_rank)
        if k < 0:
            self._queue.append(job)
            return []
        self._jobs_on[k][job] = None
        return [Start(job, k)]

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
        slowest = migration_source(self._busy, self._rates, self._by_rank, chain)
        if slowest < 0:
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
        return self._busy.tolist()
