"""Machinery of the per-chain dispatch baselines (docs/model.md, "Dispatch baselines"): chain = FCFS queue, c_l slots.

A policy picks a chain on arrival and the job stays there: it starts at once if
the chain has a free slot, else it waits in that chain's own FIFO queue. The
choice is :func:`~petals_chain.kernels.dispatch_rules.per_chain_choice`, the same
function the simulator's numba kernel runs; a subclass only names its rule.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from petals_chain.dispatch.base import Start, check_chains
from petals_chain.kernels.dispatch_rules import per_chain_choice


class PerChainFCFS:
    """Base class: per-chain FIFO queues; subclasses set ``code`` (a rule of :func:`per_chain_choice`).

    Every arrival draws exactly one uniform from ``rng`` (used or not), so the
    random stream is the same as in the numba fast path, which pre-draws one
    uniform per job.
    """

    name = "per-chain"
    code = 0

    def __init__(self, rates: Sequence[float], capacities: Sequence[int], rng: np.random.Generator) -> None:
        self.rates, self.capacities = check_chains(rates, capacities)
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"{self.name}: rng must be a numpy.random.Generator, got {type(rng).__name__}")
        self._rng = rng
        nk = len(self.rates)
        self._rates = np.asarray(self.rates, dtype=np.float64)
        self._caps = np.asarray(self.capacities, dtype=np.int64)
        self._busy = np.zeros(nk, dtype=np.int64)
        self._qlen = np.zeros(nk, dtype=np.int64)
        self._queues: list[deque[int]] = [deque() for _ in self.rates]
        self._ties = np.empty(nk, dtype=np.int64)
        self._ties2 = np.empty(nk, dtype=np.int64)

    def number_at(self, k: int) -> int:
        """Z_k: jobs at chain k, in service plus waiting."""
        return int(self._busy[k] + self._qlen[k])

    def choose(self, u: float) -> int:
        """The chain an arriving job joins, given one uniform draw ``u`` for ties."""
        return per_chain_choice(self.code, self._busy, self._qlen, self._caps, self._rates, u, self._ties,
                                self._ties2)

    def on_arrival(self, job: int, now: float = 0.0) -> list[Start]:
        k = self.choose(float(self._rng.random()))
        if self._busy[k] < self._caps[k]:
            self._busy[k] += 1
            return [Start(job, k)]
        self._queues[k].append(job)
        self._qlen[k] += 1
        return []

    def on_departure(self, job: int, chain: int, now: float = 0.0) -> list[Start]:
        if self._busy[chain] <= 0:
            raise ValueError(f"{self.name}: departure from chain {chain}, which has no job in service")
        queue = self._queues[chain]
        if queue:
            self._qlen[chain] -= 1
            return [Start(queue.popleft(), chain)]
        self._busy[chain] -= 1
        return []

    def queue_length(self) -> int:
        return int(self._qlen.sum())

    def occupancy(self) -> list[int]:
        return self._busy.tolist()
