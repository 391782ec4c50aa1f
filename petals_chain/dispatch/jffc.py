"""JFFC (Algorithm 3): join the fastest free chain, else wait in one central FIFO queue."""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence

from petals_chain.dispatch.base import Start, check_chains


class JFFC:
    """Join-the-fastest-free-chain with a central FIFO queue; O(log K) per event.

    Chains with a free slot sit in a heap keyed by speed rank (ties broken by
    index), so an arrival takes the fastest one and a departure hands its slot
    straight to the head of the queue.
    """

    name = "JFFC"

    def __init__(self, rates: Sequence[float], capacities: Sequence[int]) -> None:
        self.rates, self.capacities = check_chains(rates, capacities)
        order = sorted(range(len(self.rates)), key=lambda k: (-self.rates[k], k))
        self._rank = {k: r for r, k in enumerate(order)}
        self._by_rank = order
        self._busy = [0] * len(self.rates)
        self._free: list[int] = list(range(len(order)))  # ranks of chains with a free slot
        heapq.heapify(self._free)
        self._queue: deque[int] = deque()

    def on_arrival(self, job: int, now: float = 0.0) -> list[Start]:
        if not self._free:
            self._queue.append(job)
            return []
        k = self._by_rank[self._free[0]]
        self._busy[k] += 1
        if self._busy[k] == self.capacities[k]:
            heapq.heappop(self._free)
        return [Start(job, k)]

    def on_resume(self, job: int, now: float = 0.0) -> list[Start]:
        """A job already accepted whose chain broke comes back: the fastest free chain now, or else a place in
        the queue by job id, ahead of every job that arrived after it (a live orchestrator's failover; the
        queue is otherwise in arrival order, so FIFO still holds among the original arrivals)."""
        if self._free:
            return self.on_arrival(job, now)
        pos = next((i for i, queued in enumerate(self._queue) if queued > job), len(self._queue))
        self._queue.insert(pos, job)
        return []

    def on_departure(self, job: int, chain: int, now: float = 0.0) -> list[Start]:
        if self._busy[chain] <= 0:
            raise ValueError(f"JFFC: departure from chain {chain}, which has no job in service")
        if self._queue:
            return [Start(self._queue.popleft(), chain)]
        if self._busy[chain] == self.capacities[chain]:
            heapq.heappush(self._free, self._rank[chain])
        self._busy[chain] -= 1
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
        if self._busy[chain] >= self.capacities[chain]:
            return False
        self._busy[chain] += 1
        if self._busy[chain] == self.capacities[chain]:
            self._free.remove(self._rank[chain])
            heapq.heapify(self._free)
        return True

    def queue_length(self) -> int:
        return len(self._queue)

    def occupancy(self) -> list[int]:
        return list(self._busy)

    def queued_jobs(self) -> list[int]:
        """Waiting jobs, head first."""
        return list(self._queue)
