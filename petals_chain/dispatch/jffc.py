"""JFFC (Algorithm 3): join the fastest free chain, else wait in one central FIFO queue."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from petals_chain.dispatch.base import Start, check_chains
from petals_chain.kernels.dispatch_rules import jffc_arrival, jffc_release, speed_order


class JFFC:
    """Join-the-fastest-free-chain with a central FIFO queue; O(log K) per event.

    Chains with a free slot sit in a heap keyed by speed rank (ties broken by
    index), so an arrival takes the fastest one and a departure hands its slot
    straight to the head of the queue. The decisions are
    :func:`~petals_chain.kernels.dispatch_rules.jffc_arrival` and
    :func:`~petals_chain.kernels.dispatch_rules.jffc_release`, the same functions the
    simulator's numba kernel runs.
    """

    name = "JFFC"

    def __init__(self, rates: Sequence[float], capacities: Sequence[int]) -> None:
        self.rates, self.capacities = check_chains(rates, capacities)
        self._by_rank, self._rank_of = speed_order(self.rates)
        self._caps = np.asarray(self.capacities, dtype=np.int64)
        self._busy = np.zeros(len(self.rates), dtype=np.int64)
        self._free = np.arange(len(self.rates), dtype=np.int64)  # min-heap of the ranks of chains with a free slot
        self._nfree = len(self.rates)
        self._queue: deque[int] = deque()

    def on_arrival(self, job: int, now: float = 0.0) -> list[Start]:
        k, self._nfree = jffc_arrival(self._busy, self._caps, self._by_rank, self._free, self._nfree)
        if k < 0:
            self._queue.append(job)
            return []
        return [Start(job, k)]

    def on_resume(self, job: int, now: float = 0.0) -> list[Start]:
        """A job already accepted whose chain broke comes back: the fastest free chain now, or else a place in
        the queue by job id, ahead of every job that arrived after it (a live orchestrator's failover; the
        queue is otherwise in arrival order, so FIFO still holds among the original arrivals)."""
        if self._nfree:
            return self.on_arrival(job, now)
        pos = next((i for i, queued in enumerate(self._queue) if queued > job), len(self._queue))
        self._queue.insert(pos, job)
        return []

    def on_departure(self, job: int, chain: int, now: float = 0.0) -> list[Start]:
        if self._busy[chain] <= 0:
            raise ValueError(f"JFFC: departure from chain {chain}, which has no job in service")
        if self._queue:
            return [Start(self._queue.popleft(), chain)]
        self._nfree = jffc_release(self._busy, self._caps, self._rank_of, self._free, self._nfree, chain)
        return []

    def cancel(self, job: int) -> bool:
        """Withdraw a waiting job (a client that gave up); True if it was queued."""
        try:
            self._queue.remove(job)
        except ValueError:
            return False
        return True

    def occupy(self, chain: int) -> bool:
        """Take one slot of ``chain`` for a job already in service elsewhere (a lease carried over
        from an earlier composition); False, taking nothing, if the chain is full."""
        if self._busy[chain] >= self._caps[chain]:
            return False
        self._busy[chain] += 1
        if self._busy[chain] == self._caps[chain]:  # no longer free: out of the heap (a sorted array is a heap)
            ranks = self._free[: self._nfree]
            rest = np.sort(ranks[ranks != self._rank_of[chain]])
            self._nfree = rest.size
            self._free[: rest.size] = rest
        return True

    def queue_length(self) -> int:
        return len(self._queue)

    def occupancy(self) -> list[int]:
        return self._busy.tolist()

    def queued_jobs(self) -> list[int]:
        """Waiting jobs, head first."""
        return list(self._queue)
