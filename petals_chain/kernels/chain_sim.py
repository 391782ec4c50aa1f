"""The chain simulator's numba event loops, event for event the same as the general engine.

Two kernels: one for central-queue policies (JFFC, JFFC with migration) and one
for per-chain FCFS policies (JSQ, SA-JSQ, SED, JIQ). Departures live in the
departure heap of :mod:`petals_chain.kernels.heap`, keyed by (time, sequence
number), arrivals are read in order, and a departure at the same instant as an
arrival is processed first, exactly as in :func:`petals_chain.sim.engine.run_general`.
Without numba the functions are plain Python (correct but slow); the simulator
then prefers its general engine. Two callers: the simulator's fast path
(:func:`petals_chain.sim.engine.run_fast`) and the recomposition's mean estimate
(:mod:`petals_chain.analysis.estimate`), which runs JFFC here directly.

The kernels hold no dispatch policy of their own: every decision (which chain an
arrival takes, whether a freed slot is offered again, which job migrates, which
chain a per-chain policy joins) is a call to the same numba function of
:mod:`petals_chain.kernels.dispatch_rules` that the policy classes of
:mod:`petals_chain.dispatch` call one event at a time, and numba compiles those
calls inline here. What the kernels add is only the event loop: the departure
heap, the queues as arrays, resident lists for migration, the clock and ∫N dt.
``tests/sim/test_engine.py`` still checks, field by field, that the fast path and
the general engine (policy objects) give the same records for every policy, since
the two event loops remain two.

Cost of the calls, measured against the previous kernels that spelled the rules
out inline (kernel alone, CPU time, best of 7, 10^6 jobs, load 0.8, capacity 5):
JFFC, JSQ and SED within 2 % at K = 20 and 200; JFFC with migration 2-3 % slower
at K = 20 and about 6 % at K = 200, where its two O(K) scans run as calls
(``inline="always"`` did not win it back).
"""

from __future__ import annotations

import numpy as np

from petals_chain.kernels.dispatch_rules import (
    fastest_free,
    jffc_arrival,
    jffc_release,
    migration_source,
    per_chain_choice,
)
from petals_chain.kernels.heap import heap_grow, heap_pop, heap_push
from petals_chain.kernels.jit import njit

__all__ = ["central_kernel", "per_chain_kernel"]


@njit(cache=True)
def central_kernel(arrival, size, svc, use_svc, rates, caps, by_rank, migrate, warm):
    """JFFC (``migrate`` False) or JFFC with migration over one workload.

    Returns (start, end, chain, migrations, area_total, area_at_warm) where the
    areas are ∫N(t)dt up to the last event and up to the arrival of job ``warm``.
    """
    n = arrival.shape[0]
    nk = rates.shape[0]
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    chain = np.full(n, -1, np.int64)
    nmig = np.zeros(n, np.int64)
    rem = size.copy()
    seg = np.zeros(n)
    cur = np.full(n, -1, np.int64)
    busy = np.zeros(nk, np.int64)
    rank_of = np.empty(nk, np.int64)
    for r in range(nk):
        rank_of[by_rank[r]] = r
    free = np.arange(nk).astype(np.int64)
    fsize = nk
    queue = np.empty(n, np.int64)
    qh = 0
    qt = 0
    nxt = np.full(n, -1, np.int64)
    prv = np.full(n, -1, np.int64)
    lh = np.full(nk, -1, np.int64)
    lt = np.full(nk, -1, np.int64)
    hcap = int(caps.sum()) + 16
    ht = np.empty(hcap, np.float64)
    hp = np.empty((hcap, 3), np.int64)
    hs = 0
    seq = 0
    i = 0
    in_sys = 0
    area = 0.0
    area_w = 0.0
    t_last = 0.0
    while i < n or hs > 0:
        if hs > 0 and (i >= n or ht[0] <= arrival[i]):
            t = ht[0]
            s0 = hp[0, 0]
            j = hp[0, 1]
            k = hp[0, 2]
            hs = heap_pop(ht, hp, hs)
            if s0 != cur[j]:
                continue  # stale: the job migrated after this departure was scheduled
            area += in_sys * (t - t_last)
            t_last = t
            in_sys -= 1
            end[j] = t
            if migrate:  # unlink j from chain k's resident list
                if prv[j] >= 0:
                    nxt[prv[j]] = nxt[j]
                else:
                    lh[k] = nxt[j]
                if nxt[j] >= 0:
                    prv[nxt[j]] = prv[j]
                else:
                    lt[k] = prv[j]
            if qt > qh:
                nj = queue[qh]
                qh += 1
                start[nj] = t
                chain[nj] = k
                seg[nj] = t
                dur = svc[nj, k] if use_svc else size[nj] / rates[k]
                if hs == ht.shape[0]:
                    ht, hp = heap_grow(ht, hp)
                hs = heap_push(ht, hp, hs, t + dur, seq, nj, k)
                cur[nj] = seq
                seq += 1
                if migrate:
                    prv[nj] = lt[k]
                    nxt[nj] = -1
                    if lt[k] >= 0:
                        nxt[lt[k]] = nj
                    else:
                        lh[k] = nj
                    lt[k] = nj
            elif not migrate:
                fsize = jffc_release(busy, caps, rank_of, free, fsize, k)
            else:
                busy[k] -= 1
                s = migration_source(busy, rates, by_rank, k)
                if s >= 0:
                    m = lh[s]
                    lh[s] = nxt[m]
                    if nxt[m] >= 0:
                        prv[nxt[m]] = -1
                    else:
                        lt[s] = -1
                    busy[s] -= 1
                    prv[m] = lt[k]
                    nxt[m] = -1
                    if lt[k] >= 0:
                        nxt[lt[k]] = m
                    else:
                        lh[k] = m
                    lt[k] = m
                    busy[k] += 1
                    left = rem[m] - (t - seg[m]) * rates[s]
                    left = max(left, 0.0)
                    rem[m] = left
                    seg[m] = t
                    nmig[m] += 1
                    chain[m] = k
                    if hs == ht.shape[0]:
                        ht, hp = heap_grow(ht, hp)
                    hs = heap_push(ht, hp, hs, t + left / rates[k], seq, m, k)
                    cur[m] = seq
                    seq += 1
        else:
            t = arrival[i]
            j = i
            i += 1
            area += in_sys * (t - t_last)
            t_last = t
            in_sys += 1
            if j == warm:
                area_w = area
            if not migrate:
                k, fsize = jffc_arrival(busy, caps, by_rank, free, fsize)
            else:
                k = fastest_free(busy, caps, by_rank)
            if k < 0:
                queue[qt] = j
                qt += 1
            else:
                start[j] = t
                chain[j] = k
                seg[j] = t
                dur = svc[j, k] if use_svc else size[j] / rates[k]
                if hs == ht.shape[0]:
                    ht, hp = heap_grow(ht, hp)
                hs = heap_push(ht, hp, hs, t + dur, seq, j, k)
                cur[j] = seq
                seq += 1
                if migrate:
                    prv[j] = lt[k]
                    nxt[j] = -1
                    if lt[k] >= 0:
                        nxt[lt[k]] = j
                    else:
                        lh[k] = j
                    lt[k] = j
    return start, end, chain, nmig, area, area_w


@njit(cache=True)
def per_chain_kernel(arrival, size, svc, use_svc, rates, caps, code, u, warm):
    """JSQ (1), SA-JSQ (2), SED (3) or JIQ (4) with per-chain FCFS queues; ``u`` holds one uniform per job.

    Returns the same tuple as :func:`central_kernel` (migrations all zero).
    """
    n = arrival.shape[0]
    nk = rates.shape[0]
    start = np.full(n, np.nan)
    end = np.full(n, np.nan)
    chain = np.full(n, -1, np.int64)
    nmig = np.zeros(n, np.int64)
    busy = np.zeros(nk, np.int64)
    qlen = np.zeros(nk, np.int64)
    qhead = np.full(nk, -1, np.int64)
    qtail = np.full(nk, -1, np.int64)
    qnext = np.full(n, -1, np.int64)
    ties = np.empty(nk, np.int64)
    ties2 = np.empty(nk, np.int64)
    hcap = int(caps.sum()) + 16
    ht = np.empty(hcap, np.float64)
    hp = np.empty((hcap, 3), np.int64)
    hs = 0
    seq = 0
    i = 0
    in_sys = 0
    area = 0.0
    area_w = 0.0
    t_last = 0.0
    while i < n or hs > 0:
        if hs > 0 and (i >= n or ht[0] <= arrival[i]):
            t = ht[0]
            j = hp[0, 1]
            k = hp[0, 2]
            hs = heap_pop(ht, hp, hs)
            area += in_sys * (t - t_last)
            t_last = t
            in_sys -= 1
            end[j] = t
            if qlen[k] > 0:
                nj = qhead[k]
                qhead[k] = qnext[nj]
                qlen[k] -= 1
                if qlen[k] == 0:
                    qtail[k] = -1
                start[nj] = t
                chain[nj] = k
                dur = svc[nj, k] if use_svc else size[nj] / rates[k]
                if hs == ht.shape[0]:
                    ht, hp = heap_grow(ht, hp)
                hs = heap_push(ht, hp, hs, t + dur, seq, nj, k)
                seq += 1
            else:
                busy[k] -= 1
        else:
            t = arrival[i]
            j = i
            i += 1
            area += in_sys * (t - t_last)
            t_last = t
            in_sys += 1
            if j == warm:
                area_w = area
            k = per_chain_choice(code, busy, qlen, caps, rates, u[j], ties, ties2)
            if busy[k] < caps[k]:
                busy[k] += 1
                start[j] = t
                chain[j] = k
                dur = svc[j, k] if use_svc else size[j] / rates[k]
                if hs == ht.shape[0]:
                    ht, hp = heap_grow(ht, hp)
                hs = heap_push(ht, hp, hs, t + dur, seq, j, k)
                seq += 1
            else:
                if qlen[k] == 0:
                    qhead[k] = j
                else:
                    qnext[qtail[k]] = j
                qtail[k] = j
                qlen[k] += 1
    return start, end, chain, nmig, area, area_w
