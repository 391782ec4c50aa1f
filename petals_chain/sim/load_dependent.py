"""JFFC over chains whose servers slow with their batch: each job's progress rate follows its chain's occupancy.

The fixed-rate engines (:mod:`petals_chain.sim.engine`) give a job on chain k the time size/μ_k whatever else runs
there: the paper's model, where sessions never slow each other. On a server that batches its sessions' steps, a
step of b sessions takes g(b) times one session's (``ServerSpec.step_factor``), so a chain finishes r_k(n) jobs
per second with n in it (``Chain.load_rates``, from exact MVA in compose/serial.py) and each of its n jobs
progresses at r_k(n)/n work units per second; a job of size s needs s units, so a chain at full occupancy runs
every job at μ_k = r_k(c_k)/c_k as the fixed-rate engine does. Every start and departure on a chain changes the
rate of the jobs on it: their remaining work is brought up to date and their departures rescheduled.

Dispatch is the same JFFC policy object as the general engine's (:mod:`petals_chain.dispatch`), ranking chains by
μ_k; only the progress of jobs differs. Each chain is taken alone, as in the bounds (``compose.serial.bound_rates``):
sessions of other chains on a shared server do not slow it here. Chains without ``load_rates`` run at μ_k, so a
composition in the paper's model gives the general engine's records (``tests/sim/test_load_dependent.py``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import numpy as np

from petals_chain.dispatch import make_policy
from petals_chain.model import Chain
from petals_chain.sim.engine import Occupancy, SimResult, SimulationError, _check_workload, _result
from petals_chain.sim.workloads import Workload

__all__ = ["run_load_dependent"]


def run_load_dependent(chains: Sequence[Chain], workload: Workload, warmup_jobs: int = 0) -> SimResult:
    """Simulate ``workload`` under JFFC on ``chains``, each job progressing at its chain's load-dependent rate."""
    chains = tuple(chains)
    if not chains:
        raise ValueError("run_load_dependent: at least one chain is required")
    if workload.service_s is not None:
        raise ValueError("run_load_dependent: needs job sizes, not a per-chain service-time matrix")
    for k, ch in enumerate(chains):
        if ch.load_rates and len(ch.load_rates) != ch.capacity:
            raise ValueError(f"run_load_dependent: chain {k} has {len(ch.load_rates)} load rates for "
                             f"{ch.capacity} slots")
    rates = [ch.rate_per_s for ch in chains]
    caps = [ch.capacity for ch in chains]
    _check_workload(workload, len(chains), warmup_jobs)
    policy = make_policy("JFFC", rates, caps)
    per_job = [[ch.rate_with(n) / n for n in range(1, ch.capacity + 1)] for ch in chains]  # work units/s per job
    n = workload.n_jobs
    arrival = workload.arrival_s.tolist()
    rem = workload.size.tolist()
    start = [math.nan] * n
    end = [math.nan] * n
    chain = [-1] * n
    cur = [-1] * n
    members: list[set[int]] = [set() for _ in chains]
    updated = [0.0] * len(chains)
    heap: list[tuple[float, int, int, int]] = []
    seq = 0
    i = 0
    occ = Occupancy(warmup_jobs)

    def advance(k: int, t: float) -> None:
        """Bring the remaining work of chain k's jobs up to time t at the rate they had since the last event."""
        jobs = members[k]
        if jobs:
            done = (t - updated[k]) * per_job[k][len(jobs) - 1]
            for j in jobs:
                rem[j] = max(rem[j] - done, 0.0)
        updated[k] = t

    while i < n or heap:
        if heap and (i >= n or heap[0][0] <= arrival[i]):
            t, s0, job, k = heapq.heappop(heap)
            if s0 != cur[job]:
                continue  # rescheduled since: its chain's occupancy changed
            occ.depart(t)
            advance(k, t)
            members[k].discard(job)
            end[job] = t
            touched = {k}
            starts = policy.on_departure(job, k, t)
        else:
            t = arrival[i]
            job = i
            i += 1
            occ.arrive(t, job)
            touched = set()
            starts = policy.on_arrival(job, t)
        for st in starts:
            j, k = st.job, st.chain
            if st.migrated_from is not None:
                raise SimulationError("run_load_dependent: JFFC does not migrate")
            if len(members[k]) >= caps[k]:
                raise SimulationError(f"JFFC started job {j} on chain {k}, which is full ({caps[k]} slots)")
            advance(k, t)
            members[k].add(j)
            start[j] = t
            chain[j] = k
            touched.add(k)
        for k in touched:  # every job of a chain whose occupancy changed gets its new departure time
            jobs = members[k]
            if jobs:
                rate = per_job[k][len(jobs) - 1]
                for j in jobs:
                    cur[j] = seq
                    heapq.heappush(heap, (t + rem[j] / rate, seq, j, k))
                    seq += 1
    return _result("JFFC", "load-dependent", workload, np.asarray(start), np.asarray(end), np.asarray(chain),
                   np.zeros(n, dtype=np.int64), occ.area, occ.area_at_warm, warmup_jobs)
