"""The allocation schemes greedy(p*) and greedy (docs/moldable.md, "Schemes"), as a rule and as a dispatch
policy over n single-slot servers behind :class:`petals_chain.dispatch.base.DispatchPolicy`."""

from __future__ import annotations

import numpy as np

from petals_chain.dispatch.base import Start
from petals_chain.model import SpecError
from petals_chain.moldable.optimal import optimal_allocation
from petals_chain.moldable.speedup import SpeedUp

SCHEMES = ("greedy-p", "greedy")


def scheme_probabilities(speedup: SpeedUp, load: float, scheme: str) -> np.ndarray:
    """P(I = i), i = 1..d, of the requested count: p* of Theorem 1 for greedy(p*), all mass on d for greedy."""
    if scheme == "greedy-p":
        return optimal_allocation(speedup, load).p.copy()
    if scheme == "greedy":
        p = np.zeros(speedup.d)
        p[-1] = 1.0
        return p
    raise SpecError(f"scheme: unknown scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")


def allocate(probabilities: np.ndarray, idle: int, rng: np.random.Generator) -> int:
    """Eq. (10): 0 if no server is idle (the job is lost), else min(I, idle) with I ~ probabilities."""
    if idle <= 0:
        return 0
    i = int(rng.choice(probabilities.size, p=probabilities)) + 1
    return min(i, idle)


class MoldableDispatch:
    """A loss system of n servers (one 'chain' of capacity 1 each): an arrival starts on min(I, idle) servers.

    ``on_arrival`` returns one Start per server the job holds (none: blocked; nothing ever waits);
    ``on_departure`` frees every server of the job whichever of its servers is named.
    """

    def __init__(self, n: int, speedup: SpeedUp, load: float, scheme: str, rng: np.random.Generator) -> None:
        """n idle servers; p from the scheme at this load; all draws from ``rng``."""
        if int(n) != n or n < 1:
            raise SpecError(f"n: must be an integer >= 1, got {n!r}")
        self.name = scheme
        self.n = int(n)
        self.speedup = speedup
        self.probabilities = scheme_probabilities(speedup, load, scheme)
        self.rng = rng
        self._free = list(range(self.n - 1, -1, -1))
        self._held: dict[int, list[int]] = {}
        self.blocked = 0

    def on_arrival(self, job: int, now: float) -> list[Start]:
        """Allocate min(I, idle) servers to ``job``; an empty list means it was blocked."""
        if job in self._held:
            raise SpecError(f"job: {job} is already in service")
        k = allocate(self.probabilities, len(self._free), self.rng)
        if k == 0:
            self.blocked += 1
            return []
        servers = [self._free.pop() for _ in range(k)]
        self._held[job] = servers
        return [Start(job, s) for s in servers]

    def on_departure(self, job: int, chain: int, now: float) -> list[Start]:
        """``job`` finished: all its servers become idle (nothing waits, so nothing starts)."""
        servers = self._held.pop(job, None)
        if servers is None or chain not in servers:
            raise SpecError(f"job: {job} is not in service on server {chain}")
        self._free.extend(servers)
        return []

    def servers_of(self, job: int) -> int:
        """How many servers ``job`` holds (0 if none)."""
        return len(self._held.get(job, ()))

    def queue_length(self) -> int:
        """A loss system never queues."""
        return 0

    def occupancy(self) -> list[int]:
        """1 for each busy server, 0 for each idle one."""
        busy = [0] * self.n
        for servers in self._held.values():
            for s in servers:
                busy[s] = 1
        return busy
