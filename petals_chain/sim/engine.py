"""Discrete-event simulation of chains with capacities under a dispatch policy.

:func:`run_general` drives any :class:`~petals_chain.dispatch.base.DispatchPolicy`
with a heap of departures (job sizes: service time = size / μ_k, or a per-chain
service-time matrix); :func:`simulate` picks the numba fast path of
:mod:`petals_chain.kernels.chain_sim` when it can, which gives the same records for
the same inputs. Both keep ∫N(t)dt so that every run checks Little's law.
"""

from __future__ import annotations

import heapq
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from petals_chain.dispatch import POLICY_NAMES, canonical_name, make_policy
from petals_chain.dispatch.base import DispatchPolicy, check_chains
from petals_chain.kernels.chain_sim import central_kernel, per_chain_kernel
from petals_chain.kernels.dispatch_rules import PER_CHAIN_CODES, speed_order
from petals_chain.kernels.jit import HAVE_NUMBA
from petals_chain.sim.workloads import Workload

RECORD_DTYPE = np.dtype([
    ("job", np.int64), ("arrival_s", np.float64), ("start_s", np.float64), ("end_s", np.float64),
    ("chain", np.int32), ("waiting_s", np.float64), ("service_s", np.float64), ("response_s", np.float64),
    ("migrations", np.int32),
])
FAST_POLICIES: tuple[str, ...] = POLICY_NAMES
LITTLE_RTOL = 1e-6


class SimulationError(RuntimeError):
    """The simulation broke an invariant (a policy misbehaved, or Little's law failed)."""


@dataclass(frozen=True)
class SimResult:
    """Per-job records of the jobs kept after warm-up, plus the time integrals for Little's law."""

    policy: str
    engine: str
    records: np.ndarray
    n_jobs: int
    warmup_jobs: int
    area_total: float
    response_sum_total: float
    window_start_s: float
    window_end_s: float
    area_window: float

    @property
    def mean_response_s(self) -> float:
        return float(self.records["response_s"].mean())

    @property
    def mean_waiting_s(self) -> float:
        return float(self.records["waiting_s"].mean())

    @property
    def mean_service_s(self) -> float:
        return float(self.records["service_s"].mean())

    @property
    def time_avg_in_system(self) -> float:
        """Time-average number of jobs in system over the observation window."""
        return self.area_window / (self.window_end_s - self.window_start_s)

    @property
    def throughput_per_s(self) -> float:
        """Kept jobs per second of the observation window."""
        return self.records.size / (self.window_end_s - self.window_start_s)

    @property
    def littles_law_gap(self) -> float:
        """Relative gap between ∫N dt and Σ response over the whole run (0 up to rounding)."""
        return abs(self.area_total - self.response_sum_total) / max(self.response_sum_total, 1e-300)

    @property
    def littles_law_window_gap(self) -> float:
        """Relative gap between time-average N and throughput × mean response in the window (edge effects only)."""
        lam_w = self.throughput_per_s * self.mean_response_s
        return abs(self.time_avg_in_system - lam_w) / max(lam_w, 1e-300)

    def summary(self) -> dict[str, float | int | str]:
        """The headline numbers as a flat dict (for CSV/JSON)."""
        r = self.records
        return {
            "policy": self.policy, "engine": self.engine, "jobs": int(r.size), "warmup_jobs": self.warmup_jobs,
            "mean_response_s": self.mean_response_s, "mean_waiting_s": self.mean_waiting_s,
            "mean_service_s": self.mean_service_s,
            "p95_response_s": float(np.percentile(r["response_s"], 95)),
            "p99_response_s": float(np.percentile(r["response_s"], 99)),
            "time_avg_in_system": self.time_avg_in_system, "throughput_per_s": self.throughput_per_s,
            "littles_law_gap": self.littles_law_gap, "littles_law_window_gap": self.littles_law_window_gap,
            "migrations": int(r["migrations"].sum()),
        }

def _check_workload(workload: Workload, num_chains: int, warmup_jobs: int) -> None:
    """Raise ValueError if the workload and warm-up do not fit the chains."""
    if workload.n_jobs < 1:
        raise ValueError("simulate: the workload has no jobs")
    if not 0 <= warmup_jobs < workload.n_jobs:
        raise ValueError(f"simulate: warmup_jobs must be in [0, {workload.n_jobs}), got {warmup_jobs}")
    if workload.service_s is not None and workload.service_s.shape[1] != num_chains:
        raise ValueError(
            f"simulate: workload.service_s has {workload.service_s.shape[1]} columns for {num_chains} chains"
        )


def build_records(arrival: np.ndarray, start: np.ndarray, end: np.ndarray, chain: np.ndarray,
                  migrations: np.ndarray | int, warmup_jobs: int) -> np.ndarray:
    """Per-job records (RECORD_DTYPE) of the jobs after the warm-up; the one place records are assembled."""
    keep = slice(warmup_jobs, None)
    rec = np.empty(arrival.size - warmup_jobs, dtype=RECORD_DTYPE)
    rec["job"] = np.arange(warmup_jobs, arrival.size)
    rec["arrival_s"] = arrival[keep]
    rec["start_s"] = start[keep]
    rec["end_s"] = end[keep]
    rec["chain"] = chain[keep]
    rec["waiting_s"] = start[keep] - arrival[keep]
    rec["service_s"] = end[keep] - start[keep]
    rec["response_s"] = end[keep] - arrival[keep]
    rec["migrations"] = migrations[keep] if isinstance(migrations, np.ndarray) else migrations
    return rec


def _result(policy: str, engine: str, workload: Workload, start: np.ndarray, end: np.ndarray, chain: np.ndarray,
            migrations: np.ndarray, area_total: float, area_at_warm: float, warmup_jobs: int) -> SimResult:
    """Assemble records, check that every job finished and that Little's law holds over the whole run."""
    unfinished = np.flatnonzero(~np.isfinite(end))
    if unfinished.size:
        raise SimulationError(f"{policy}: {unfinished.size} job(s) never finished (first: job {unfinished[0]})")
    arrival = workload.arrival_s
    response = end - arrival
    response_sum = float(response.sum())
    if abs(area_total - response_sum) > LITTLE_RTOL * max(response_sum, 1.0):
        raise SimulationError(
            f"{policy}: Little's law broken: ∫N dt = {area_total!r} but Σ response = {response_sum!r}"
        )
    rec = build_records(arrival, start, end, chain, migrations, warmup_jobs)
    t_w = float(arrival[warmup_jobs])
    t_end = float(end.max())
    return SimResult(policy, engine, rec, workload.n_jobs, warmup_jobs, float(area_total), response_sum,
                     t_w, t_end, float(area_total - area_at_warm))


class Occupancy:
    """The number in system and ∫N dt, kept event by event, with the area at the warm-up job's arrival: the
    bookkeeping every Python event loop here shares (the numba kernels keep the same figures inline)."""

    def __init__(self, warmup_jobs: int) -> None:
        self.warmup_jobs = warmup_jobs
        self.in_sys = 0
        self.area = 0.0
        self.area_at_warm = 0.0
        self.t_last = 0.0

    def _advance(self, t: float) -> None:
        self.area += self.in_sys * (t - self.t_last)
        self.t_last = t

    def arrive(self, t: float, job: int) -> None:
        """Job ``job`` arrives at ``t``."""
        self._advance(t)
        self.in_sys += 1
        if job == self.warmup_jobs:
            self.area_at_warm = self.area

    def depart(self, t: float) -> None:
        """A job leaves at ``t``."""
        self._advance(t)
        self.in_sys -= 1


def run_general(policy: DispatchPolicy, rates: Sequence[float], capacities: Sequence[int], workload: Workload,
                warmup_jobs: int = 0) -> SimResult:
    """Simulate ``workload`` under any policy object; checks every Start against the chains' capacities.

    A departure and an arrival at the same instant: the departure goes first.
    A migrated job keeps its remaining size (exponential sizes are memoryless).
    """
    rates_l, caps_l = check_chains(rates, capacities)
    _check_workload(workload, len(rates_l), warmup_jobs)
    name = getattr(policy, "name", type(policy).__name__)
    n = workload.n_jobs
    arrival = workload.arrival_s.tolist()
    size = workload.size.tolist()
    svc = workload.service_s
    start = [math.nan] * n
    end = [math.nan] * n
    chain = [-1] * n
    migrations = [0] * n
    rem = list(size)
    seg = [0.0] * n
    cur = [-1] * n
    busy = [0] * len(rates_l)
    heap: list[tuple[float, int, int, int]] = []
    seq = 0
    i = 0
    occ = Occupancy(warmup_jobs)
    while i < n or heap:
        if heap and (i >= n or heap[0][0] <= arrival[i]):
            t, s0, job, k = heapq.heappop(heap)
            if s0 != cur[job]:
                continue
            occ.depart(t)
            end[job] = t
            busy[k] -= 1
            starts = policy.on_departure(job, k, t)
        else:
            t = arrival[i]
            job = i
            i += 1
            occ.arrive(t, job)
            starts = policy.on_arrival(job, t)
        for st in starts:
            j, k = st.job, st.chain
            if not 0 <= k < len(rates_l):
                raise SimulationError(f"{name}: started job {j} on chain {k}, which does not exist")
            if busy[k] >= caps_l[k]:
                raise SimulationError(f"{name}: started job {j} on chain {k}, which is full ({caps_l[k]} slots)")
            if st.migrated_from is None:
                if not (0 <= j < i) or not math.isnan(start[j]):
                    raise SimulationError(f"{name}: started job {j}, which has not arrived or already started")
                start[j] = t
                dur = float(svc[j, k]) if svc is not None else size[j] / rates_l[k]
                end_t = t + dur
            else:
                s = st.migrated_from
                if svc is not None:
                    raise SimulationError(f"{name}: migration needs memoryless sizes, not a service-time matrix")
                if chain[j] != s or cur[j] < 0 or not math.isnan(end[j]):
                    raise SimulationError(f"{name}: migrated job {j} from chain {s}, where it is not in service")
                busy[s] -= 1
                left = rem[j] - (t - seg[j]) * rates_l[s]
                left = max(left, 0.0)
                rem[j] = left
                migrations[j] += 1
                end_t = t + left / rates_l[k]
            busy[k] += 1
            chain[j] = k
            seg[j] = t
            cur[j] = seq
            heapq.heappush(heap, (end_t, seq, j, k))
            seq += 1
    return _result(name, "general", workload, np.asarray(start), np.asarray(end), np.asarray(chain),
                   np.asarray(migrations), occ.area, occ.area_at_warm, warmup_jobs)


def run_fast(policy: str, rates: Sequence[float], capacities: Sequence[int], workload: Workload,
             rng: np.random.Generator | None = None, warmup_jobs: int = 0) -> SimResult:
    """The numba path for a policy named in FAST_POLICIES; same records as :func:`run_general`.

    Randomised policies pre-draw one uniform per job from ``rng``, the same
    numbers their Python classes draw one arrival at a time.
    """
    canon = canonical_name(policy)
    rates_l, caps_l = check_chains(rates, capacities)
    _check_workload(workload, len(rates_l), warmup_jobs)
    rates_a = np.asarray(rates_l, dtype=np.float64)
    caps_a = np.asarray(caps_l, dtype=np.int64)
    use_svc = workload.service_s is not None
    svc = workload.service_s if use_svc else np.empty((0, 0), dtype=np.float64)
    if canon in ("JFFC", "JFFC-migration"):
        if canon == "JFFC-migration" and use_svc:
            raise ValueError("simulate: JFFC-migration needs memoryless sizes, not a service-time matrix")
        by_rank, _ = speed_order(rates_l)
        out = central_kernel(workload.arrival_s, workload.size, svc, use_svc, rates_a, caps_a, by_rank,
                             canon == "JFFC-migration", warmup_jobs)
    else:
        if rng is None:
            raise ValueError(f"simulate: policy {canon} breaks ties at random: pass rng")
        u = rng.random(workload.n_jobs)
        out = per_chain_kernel(workload.arrival_s, workload.size, svc, use_svc, rates_a, caps_a,
                               PER_CHAIN_CODES[canon], u, warmup_jobs)
    start, end, chain, migrations, area, area_w = out
    return _result(canon, "fast", workload, start, end, chain, migrations, area, area_w, warmup_jobs)


def simulate(rates: Sequence[float], capacities: Sequence[int], workload: Workload, policy: str = "JFFC",
             rng: np.random.Generator | None = None, warmup_jobs: int = 0, engine: str = "auto") -> SimResult:
    """Simulate a named policy: ``engine`` is "fast" (numba), "general" (Python policy objects) or "auto".

    "auto" and "fast" use numba when it is importable; "fast" without numba
    warns and falls back to the general engine.
    """
    if engine not in ("auto", "fast", "general"):
        raise ValueError(f"simulate: engine must be 'auto', 'fast' or 'general', got {engine!r}")
    canon = canonical_name(policy)
    if engine != "general" and canon in FAST_POLICIES:
        if HAVE_NUMBA:
            return run_fast(canon, rates, capacities, workload, rng, warmup_jobs)
        if engine == "fast":
            warnings.warn("numba is not installed: using the general (pure Python) engine", RuntimeWarning,
                          stacklevel=2)
    return run_general(make_policy(canon, rates, capacities, rng), rates, capacities, workload, warmup_jobs)
