"""JFFC (Algorithm 3): join the fastest free chain, else wait in one central FIFO queue."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from petals_chain.dispatch.base import Start, check_chains
from petals_chain.kernels.dispatch_rules import (
    JFFC_BUSY,
    JFFC_CAPS,
    JFFC_FREE,
    JFFC_NFREE,
    JFFC_RANK_OF,
    jffc_give,
    jffc_state,
    jffc_take,
)
from petals_chain.kernels.jit import entry


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
        self._state = jffc_state(self.rates, self.capacities)  # busy, caps, ranks, free-rank heap, nfree (rows)
        self._take = entry(jffc_take, self._state)
        self._give = entry(jffc_give, self._state, 0, 0)
        self._queue: deque[int] = deque()

    @property
    def _busy(self) -> np.ndarray:
        """Jobs in service per chain (a view of the packed state's row; subclasses read it)."""
        return self._state[JFFC_BUSY]

    @property
    def _caps(self) -> np.ndarray:
        """Each chain's capacity (a view of the packed state's row)."""
        return self._state[JFFC_CAPS]

    def on_arrival(self, job: int, now: float = 0.0) -> list[Start]:
        k = self._take(self._state)
        if k < 0:
            self._queue.append(job)
            return []
        return [Start(job, k)]

    def on_resume(self, job: int, now: float = 0.0) -> list[Start]:
        """A job already accepted whose chain broke comes back: the fastest free chain now, or else a place in
        the queue by job id, ahead of every job that arrived after it (a live orchestrator's failover; the
        queue is otherwise in arrival order, so FIFO still holds among the original arrivals)."""
        if self._state[JFFC_NFREE, 0]:
            return self.on_arrival(job, now)
        pos = next((i for i, queued in enumerate(self._queue) if queued > job), len(self._queue))
        self._queue.insert(pos, job)
        return []

    def on_departure(self, job: int, chain: int, now: float = 0.0) -> list[Start]:
        done = self._give(self._state, chain, len(self._queue))
        if done == 0:
            return []
        if done < 0:
            raise ValueError(f"JFFC: departure from chain {chain}, which has no job in service")
        return [Start(self._queue.popleft(), chain)]

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
        busy, caps = self._busy, self._caps
        if busy[chain] >= caps[chain]:
            return False
        busy[chain] += 1
        if busy[chain] == caps[chain]:  # no longer free: out of the heap (a sorted array is a heap)
            ranks = self._state[JFFC_FREE, : self._state[JFFC_NFREE, 0]]
            rest = np.sort(ranks[ranks != self._state[JFFC_RANK_OF, chain]])
            self._state[JFFC_NFREE, 0] = rest.size
            self._state[JFFC_FREE, : rest.size] = rest
        return True

    def queue_length(self) -> int:
        return len(self._queue)

    def occupancy(self) -> list[int]:
        return self._busy.tolist()

    def queued_jobs(self) -> list[int]:
        """Waiting jobs, head first."""
        return list(self._queue)
