"""The numba kernel of the moldable loss system: Poisson arrivals, n unit servers, allocation min(I, idle) with
I ~ p, departures in a binary heap, time-averaged occupancy and both execution-time estimators."""

from __future__ import annotations

import numpy as np

from petals_chain.kernels.heap import heap_pop, heap_push
from petals_chain.kernels.jit import njit

DISTS = {"exp": 0, "det": 1, "erlang": 2, "pareto": 3}
# out[] layout of the kernel's scalar results
(ARRIVALS, BLOCKED, ADMITTED, SUM_D, SUM_S, DONE, DONE_D, HORIZON, MAX_BELOW, MAX_K, OVERFLOW, AREA_N_END,
 REMAIN_D, REMAIN_R, DONE_S, NOUT) = range(16)


@njit(cache=True)
def _draw_size(rng, dist):
    """One job size of unit mean: Exp(1), 1, 0.4 Erlang-1 + 0.6 Erlang-2 at rate 1.6, or Pareto U^(-2/3)/3."""
    if dist == 0:
        return rng.exponential(1.0)
    if dist == 1:
        return 1.0
    if dist == 2:
        if rng.random() < 0.4:
            return rng.exponential(1.0 / 1.6)
        return rng.gamma(2.0, 1.0 / 1.6)
    return (1.0 - rng.random()) ** (-2.0 / 3.0) / 3.0


@njit(cache=True)
def moldable_kernel(n, speed, cum_p, total_rate, n_arrivals, dist, rng, below, area, out):
    """Simulate ``n_arrivals`` arrivals from an empty system; fill ``area`` (per server count) and ``out``.

    ``cum_p[i-1]`` = P(I <= i); ``below``: count jobs holding fewer servers than this (Lemma 2's check).
    ``area[i-1]`` = ∫ (jobs on i servers) dt over [0, last arrival].
    """
    d = speed.shape[0]
    # the departure heap of kernels/heap.py: time, then (slot, servers, unused) per job; a
    # job's slot (free-listed: at most n jobs in system) keys its duration and breaks ties in the heap
    ht = np.empty(n)
    hp = np.empty((n, 3), np.int64)
    hd = np.empty(n)
    free = np.arange(n - 1, -1, -1)
    nfree = n
    cnt = np.zeros(d, np.int64)
    size = 0
    busy = 0
    n_below = 0
    max_below = 0
    max_k = 0
    overflow = 0
    blocked = 0
    admitted = 0
    sum_d = 0.0
    sum_s = 0.0
    done = 0
    done_d = 0.0
    done_s = 0.0
    t = 0.0
    t_prev = 0.0
    mean_gap = 1.0 / total_rate
    for _ in range(n_arrivals):
        t = t + rng.exponential(mean_gap)
        while size > 0 and ht[0] <= t:
            td = ht[0]
            slot = hp[0, 0]
            kk = hp[0, 1]
            dd = hd[slot]
            dt = td - t_prev
            for i in range(d):
                area[i] += cnt[i] * dt
            t_prev = td
            cnt[kk - 1] -= 1
            busy -= kk
            if kk < below:
                n_below -= 1
            done += 1
            done_d += dd
            done_s += dd * speed[kk - 1]
            free[nfree] = slot
            nfree += 1
            size = heap_pop(ht, hp, size)
        dt = t - t_prev
        for i in range(d):
            area[i] += cnt[i] * dt
        t_prev = t
        idle = n - busy
        if idle <= 0:
            blocked += 1
            continue
        u = rng.random()
        k = d
        for i in range(d):
            if u < cum_p[i]:
                k = i + 1
                break
        if k > idle:
            k = idle
        s = _draw_size(rng, dist)
        dur = s / speed[k - 1]
        admitted += 1
        sum_d += dur
        sum_s += s
        cnt[k - 1] += 1
        busy += k
        if busy > n:
            overflow += 1
        if k > max_k:
            max_k = k
        if k < below:
            n_below += 1
            if n_below > max_below:
                max_below = n_below
        nfree -= 1
        slot = free[nfree]
        hd[slot] = dur
        size = heap_push(ht, hp, size, t + dur, slot, k, 0)
    remain_d = 0.0
    remain_r = 0.0
    for e in range(size):
        dd = hd[hp[e, 0]]
        elapsed = t - (ht[e] - dd)
        remain_d += elapsed
        remain_r += elapsed * speed[hp[e, 1] - 1]
    out[ARRIVALS] = n_arrivals
    out[BLOCKED] = blocked
    out[ADMITTED] = admitted
    out[SUM_D] = sum_d
    out[SUM_S] = sum_s
    out[DONE] = done
    out[DONE_D] = done_d
    out[DONE_S] = done_s
    out[HORIZON] = t
    out[MAX_BELOW] = max_below
    out[MAX_K] = max_k
    out[OVERFLOW] = overflow
    out[AREA_N_END] = size
    out[REMAIN_D] = remain_d
    out[REMAIN_R] = remain_r


def new_outputs(d: int) -> tuple[np.ndarray, np.ndarray]:
    """Zeroed ``area`` (length d) and ``out`` arrays for one kernel call."""
    return np.zeros(d), np.zeros(NOUT)
