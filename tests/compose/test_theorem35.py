"""Theorem 3.5: JFFS over ALL feasible chains (memory checked per server at each arrival) behaves
like JFFC over GCA's chains with its capacities: same service times, queueing at the same moments."""

from __future__ import annotations

from collections import deque

import numpy as np

from petals_chain.compose.capacity import cache_slots
from petals_chain.compose.gbp_cr import gbp_cr
from petals_chain.compose.gca import gca
from petals_chain.compose.optimal import enumerate_chains
from petals_chain.dispatch.jffc import JFFC
from petals_chain.model import ModelSpec, Placement
from tests.conftest import random_servers


class JFFSAllChains:
    """Join-the-fastest-free-server-chain over every feasible chain, memory tracked server by server."""

    def __init__(self, servers, model, placement):
        self.chains = sorted(enumerate_chains(servers, placement, model), key=lambda ch: ch.service_time_s)
        self.free = cache_slots(servers, model, placement)
        self.queue: deque[int] = deque()
        self.where: dict[int, object] = {}

    def _fits(self, ch) -> bool:
        return all(self.free[j] >= b for j, b in zip(ch.servers, ch.blocks))

    def _start(self, job: int) -> bool:
        for ch in self.chains:
            if self._fits(ch):
                for j, b in zip(ch.servers, ch.blocks):
                    self.free[j] -= b
                self.where[job] = ch
                return True
        return False

    def arrive(self, job: int) -> None:
        if self.queue or not self._start(job):
            self.queue.append(job)

    def depart(self, job: int) -> None:
        ch = self.where.pop(job)
        for j, b in zip(ch.servers, ch.blocks):
            self.free[j] += b
        while self.queue and self._start(self.queue[0]):
            self.queue.popleft()


def _replay(servers, model, placement, rng, steps=400):
    """Drive both systems with one arrival/departure sequence; return the first mismatch or None."""
    chains = gca(servers, model, placement)
    if not chains:
        return None
    jffc = JFFC([ch.rate_per_s for ch in chains], [ch.capacity for ch in chains])
    jffs = JFFSAllChains(servers, model, placement)
    on_chain: dict[int, int] = {}
    next_job = 0
    for step in range(steps):
        if not on_chain or rng.random() < 0.55:
            job, next_job = next_job, next_job + 1
            starts = jffc.on_arrival(job)
            jffs.arrive(job)
        else:
            job = int(rng.choice(sorted(on_chain)))
            starts = jffc.on_departure(job, on_chain.pop(job))
            if job not in jffs.where:
                return f"step {step}: job {job} is in service under JFFC but not under JFFS"
            jffs.depart(job)
        for s in starts:
            on_chain[s.job] = s.chain
        if set(on_chain) != set(jffs.where):
            return f"step {step}: in service JFFC={sorted(on_chain)} JFFS={sorted(jffs.where)}"
        for j, k in on_chain.items():
            if abs(chains[k].service_time_s - jffs.where[j].service_time_s) > 1e-9:
                return (f"step {step}: job {j} service time JFFC={chains[k].service_time_s} "
                        f"JFFS={jffs.where[j].service_time_s}")
        if jffc.queue_length() != len(jffs.queue):
            return f"step {step}: queue JFFC={jffc.queue_length()} JFFS={len(jffs.queue)}"
    return None


def test_theorem_3_5_under_gbp_cr_placements():
    rng = np.random.default_rng(35)
    mismatches = []
    for trial in range(40):
        servers = random_servers(rng, int(rng.integers(2, 7)))
        model = ModelSpec(int(rng.integers(1, 5)), 1.0, float(rng.uniform(0.2, 0.6)))
        try:
            placement = gbp_cr(servers, model, int(rng.integers(1, 3)), arrival_rate=100.0)
        except ValueError:
            continue
        why = _replay(servers, model, placement, rng)
        if why:
            mismatches.append((trial, why))
    assert mismatches == []


def test_theorem_3_5_under_random_placements():
    """The theorem claims any placement; small random ones exercise cross-chain edges."""
    rng = np.random.default_rng(53)
    mismatches = []
    richer = 0  # instances where some feasible chain is not among GCA's
    for trial in range(150):
        servers = random_servers(rng, int(rng.integers(2, 6)))
        L = int(rng.integers(1, 4))
        model = ModelSpec(L, 1.0, float(rng.uniform(0.2, 0.6)))
        first, count = [], []
        for _ in servers:
            m = int(rng.integers(0, L + 1))
            first.append(int(rng.integers(1, L - m + 2)) if m else 0)
            count.append(m)
        placement = Placement(tuple(first), tuple(count))
        richer += len(enumerate_chains(servers, placement, model)) > len(gca(servers, model, placement))
        why = _replay(servers, model, placement, rng)
        if why:
            mismatches.append((trial, why, servers, placement, model))
    assert richer >= 20
    assert mismatches == [], mismatches[0]
