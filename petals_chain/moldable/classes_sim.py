"""Several classes of moldable jobs sharing n servers (docs/moldable.md, "Several classes"): the event simulator.

Class j arrives at rate n·λ_j, brings jobs of mean size E[S_j] and has its own speed-up s_{·j}. Each class is
served by greedy(p*_j) with the p*_j of the water-filling solution of (Q), either inside a hard reserve of
round(n·b*_j) servers (``partition``, the reading of "treated independently" the spec takes) or over the whole
pool (``shared``); ``greedy`` (always min(d_j, idle) servers) over the whole pool is the baseline. Per class it
measures blocking, execution time (both estimators) and time-averaged occupancy, and checks Little's law on the
sample path exactly, as the one-class simulator (:mod:`petals_chain.moldable.sim`) does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from petals_chain.model import SpecError
from petals_chain.moldable import kernel as K
from petals_chain.moldable.optimal import JobClass, water_fill
from petals_chain.moldable.sim import SAMPLE_PATH_TOL, InvariantError
from petals_chain.moldable.speedup import SpeedUp
from petals_chain.kernels.heap import heap_pop, heap_push
from petals_chain.kernels.jit import njit

SCHEMES = ("partition", "shared", "greedy")
# per-class columns of the kernel's ``out`` array
C_ARR, C_BLOCK, C_ADMIT, C_SUMD, C_DONE, C_DONED, C_REMD, C_MAXK, NCOL = range(9)


@njit(cache=True)
def classes_kernel(pool_n, pool_of, speed, dims, cum_p, class_cum, total_rate, mean_size, n_arrivals, dist, rng,
                   area, out, overflow):
    """Simulate ``n_arrivals`` arrivals from empty; ``speed[j, i-1]`` = s_{i,j}, ``cum_p[j, i-1]`` = P(I_j <= i),
    ``class_cum`` the cumulative class mix; fills ``area[j, i-1]`` = ∫(class-j jobs on i servers) dt and ``out``."""
    n_total = 0
    for q in range(pool_n.shape[0]):
        n_total += pool_n[q]
    cap = n_total + 1
    # the departure heap of kernels/heap.py: time, then (slot, servers, class) per job; a
    # job's slot (free-listed, at most n jobs in system) keys its start time and breaks ties in the heap
    ht = np.empty(cap)
    hp = np.empty((cap, 3), np.int64)
    start = np.empty(cap)
    free = np.arange(cap - 1, -1, -1)
    nfree = cap
    busy = np.zeros(pool_n.shape[0], np.int64)
    cnt = np.zeros(area.shape, np.int64)
    size = 0
    t = 0.0
    t_prev = 0.0
    n_cls = speed.shape[0]
    mean_gap = 1.0 / total_rate
    for _ in range(n_arrivals):
        t = t + rng.exponential(mean_gap)
        while size > 0 and ht[0] <= t:
            td = ht[0]
            dt = td - t_prev
            for j in range(n_cls):
                for i in range(dims[j]):
                    area[j, i] += cnt[j, i] * dt
            t_prev = td
            slot, k0, j0 = hp[0, 0], hp[0, 1], hp[0, 2]
            cnt[j0, k0 - 1] -= 1
            busy[pool_of[j0]] -= k0
            out[j0, C_DONE] += 1
            out[j0, C_DONED] += td - start[slot]
            free[nfree] = slot
            nfree += 1
            size = heap_pop(ht, hp, size)
        dt = t - t_prev
        for j in range(n_cls):
            for i in range(dims[j]):
                area[j, i] += cnt[j, i] * dt
        t_prev = t
        u = rng.random()
        j = n_cls - 1
        for c in range(n_cls):
            if u < class_cum[c]:
                j = c
                break
        out[j, C_ARR] += 1
        q = pool_of[j]
        idle = pool_n[q] - busy[q]
        if idle <= 0:
            out[j, C_BLOCK] += 1
            continue
        u = rng.random()
        k = dims[j]
        for i in range(dims[j]):
            if u < cum_p[j, i]:
                k = i + 1
                break
        if k > idle:
            k = idle
        dur = mean_size[j] * K._draw_size(rng, dist) / speed[j, k - 1]
        out[j, C_ADMIT] += 1
        out[j, C_SUMD] += dur
        if k > out[j, C_MAXK]:
            out[j, C_MAXK] = k
        cnt[j, k - 1] += 1
        busy[q] += k
        if busy[q] > pool_n[q]:
            overflow[0] += 1
        nfree -= 1
        slot = free[nfree]
        start[slot] = t
        size = heap_push(ht, hp, size, t + dur, slot, k, j)
    for e in range(size):
        out[hp[e, 2], C_REMD] += t - start[hp[e, 0]]
    return t


def reserves(n: int, shares: np.ndarray) -> np.ndarray:
    """Whole servers per class from the fractions b*_j: floor(n·b_j), the rest by largest remainder (Σ ≤ n)."""
    raw = n * np.asarray(shares, dtype=float)
    out = np.floor(raw + 1e-12).astype(np.int64)
    left = min(n - int(out.sum()), int(round(raw.sum())) - int(out.sum()))
    for j in np.argsort(-(raw - out), kind="stable")[:max(left, 0)]:
        out[j] += 1
    return out


@dataclass(frozen=True)
class ClassesRun:
    """One replication: n servers, classes as (speed-up, λ_j per server, E[S_j]) triples, a scheme, a size law."""

    n: int
    classes: tuple[tuple[tuple[float, ...], float, float], ...]
    scheme: str = "partition"
    dist: str = "exp"
    arrivals: int = 1_000_000

    def __post_init__(self) -> None:
        """Refuse bad input before any run starts (the loads' feasibility is water_fill's check)."""
        if int(self.n) != self.n or self.n < 1:
            raise SpecError(f"n: must be an integer >= 1, got {self.n!r}")
        if self.scheme not in SCHEMES:
            raise SpecError(f"scheme: unknown {self.scheme!r}; choose one of {', '.join(SCHEMES)}")
        if self.dist not in K.DISTS:
            raise SpecError(f"dist: unknown size law {self.dist!r}; choose one of {', '.join(K.DISTS)}")
        if int(self.arrivals) != self.arrivals or self.arrivals < 1:
            raise SpecError(f"arrivals: must be an integer >= 1, got {self.arrivals!r}")
        water_fill(self.job_classes())

    def job_classes(self) -> list[JobClass]:
        """The classes as the optimisation sees them."""
        return [JobClass(SpeedUp(tuple(s)), lam, size) for s, lam, size in self.classes]

    def __call__(self, seed: np.random.SeedSequence | int, index: int = 0) -> dict[str, Any]:
        """Run the kernel once; per-class and overall measures, D* of (Q) for comparison."""
        cls = self.job_classes()
        alloc = water_fill(cls)
        dmax = max(c.speedup.d for c in cls)
        m = len(cls)
        speed = np.ones((m, dmax))
        cum = np.ones((m, dmax))
        dims = np.array([c.speedup.d for c in cls], dtype=np.int64)
        for j, c in enumerate(cls):
            speed[j, :c.speedup.d] = c.speedup.array()
            p = np.zeros(c.speedup.d)
            if self.scheme == "greedy":
                p[-1] = 1.0
            else:
                p = np.asarray(alloc.p[j], dtype=float)
            cum[j, :c.speedup.d] = np.cumsum(p)
            cum[j, c.speedup.d - 1:] = 1.0
        if self.scheme == "partition":
            pool_n = reserves(self.n, alloc.share)
            pool_of = np.arange(m, dtype=np.int64)
        else:
            pool_n = np.array([self.n], dtype=np.int64)
            pool_of = np.zeros(m, dtype=np.int64)
        rates = np.array([c.arrival_rate for c in cls])
        class_cum = np.cumsum(rates / rates.sum())
        class_cum[-1] = 1.0
        area = np.zeros((m, dmax))
        out = np.zeros((m, NCOL))
        overflow = np.zeros(1, np.int64)
        horizon = classes_kernel(pool_n, pool_of, speed, dims, cum, class_cum, self.n * rates.sum(),
                                 np.array([c.mean_size for c in cls]), int(self.arrivals), K.DISTS[self.dist],
                                 np.random.default_rng(seed), area, out, overflow)
        return {"replication": index, **class_measures(self.n, cls, alloc, area, out, horizon, int(overflow[0]),
                                                       pool_n)}


def class_measures(n: int, cls: Sequence[JobClass], alloc: Any, area: np.ndarray, out: np.ndarray, horizon: float,
                   overflow: int, pool_n: np.ndarray) -> dict[str, Any]:
    """Per-class P_b, E[D] (all admitted / finished before the last arrival), occupancy; exact identities checked."""
    if overflow:
        raise InvariantError(f"a pool had more servers busy than it holds at {overflow} admissions")
    row: dict[str, Any] = {"d_star": alloc.execution_time, "pools": " ".join(str(int(p)) for p in pool_n)}
    admitted = out[:, C_ADMIT].sum()
    for j, c in enumerate(cls):
        jobs = float(area[j].sum())
        path = out[j, C_DONED] + out[j, C_REMD]
        if abs(jobs - path) > SAMPLE_PATH_TOL * max(1.0, jobs):
            raise InvariantError(f"class {j}: ∫N dt = {jobs!r} but Σ time in system = {path!r}")
        if out[j, C_BLOCK] + out[j, C_ADMIT] != out[j, C_ARR]:
            raise InvariantError(f"class {j}: blocked + admitted != arrivals")
        exec_all = out[j, C_SUMD] / max(out[j, C_ADMIT], 1)
        throughput = out[j, C_ADMIT] / (n * horizon)
        occupancy = jobs / (n * horizon)
        row |= {f"blocking_{j}": out[j, C_BLOCK] / max(out[j, C_ARR], 1), f"exec_time_all_{j}": exec_all,
                f"exec_time_done_{j}": out[j, C_DONED] / max(out[j, C_DONE], 1), f"occupancy_{j}": occupancy,
                f"little_rel_err_{j}": abs(throughput * exec_all - occupancy) / max(occupancy, 1e-300),
                f"max_servers_{j}": int(out[j, C_MAXK])}
    row["blocking"] = out[:, C_BLOCK].sum() / out[:, C_ARR].sum()
    row["exec_time_all"] = out[:, C_SUMD].sum() / max(admitted, 1)
    row["busy_fraction"] = float(sum((area[j, :c.speedup.d] * np.arange(1, c.speedup.d + 1)).sum()
                                     for j, c in enumerate(cls)) / (n * horizon))
    return row
