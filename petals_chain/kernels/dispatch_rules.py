"""The decision rules of the chain dispatch policies, written once as numba functions over arrays.

Both users call these same functions: the policy classes of :mod:`petals_chain.dispatch` (the live
orchestrator's JFFC and the simulator's general engine, one event at a time, from Python) and the
chain simulator's numba kernels (:mod:`petals_chain.kernels.chain_sim`, compiled calls inside their event loops).
What stays outside is bookkeeping that is not a decision: queues of job ids, resident lists, the departure heap
and the clock. They sit in this low-level package, not in ``dispatch/``, because the recomposition's mean
estimate runs the JFFC kernel below ``compose/``, which ``dispatch/`` builds on.

State, per chain k (chains indexed as given to a policy): ``busy[k]`` jobs in service, ``caps[k]`` = c_k,
``rates[k]`` = μ_k; ``by_rank`` lists the chains fastest first (ties by index) and ``rank_of`` inverts it;
JFFC's chains with a free slot are the int min-heap ``free[:nfree]`` of their ranks (:mod:`.heap`); ``qlen[k]`` is the
length of chain k's own FIFO queue (per-chain policies). The live JFFC keeps these arrays as the rows of one packed
array (:func:`jffc_state`) and calls :func:`jffc_take` / :func:`jffc_give`, which run the same two rules on its rows.
"""

from __future__ import annotations

import numpy as np

from petals_chain.kernels.heap import iheap_pop, iheap_push
from petals_chain.kernels.jit import njit

JSQ_CODE, SA_JSQ_CODE, SED_CODE, JIQ_CODE = 1, 2, 3, 4
PER_CHAIN_CODES = {"JSQ": JSQ_CODE, "SA-JSQ": SA_JSQ_CODE, "SED": SED_CODE, "JIQ": JIQ_CODE}


def speed_order(rates) -> tuple[np.ndarray, np.ndarray]:
    """(by_rank, rank_of): chains fastest first, ties by index, and each chain's rank."""
    by_rank = np.asarray(sorted(range(len(rates)), key=lambda k: (-rates[k], k)), dtype=np.int64)
    rank_of = np.empty_like(by_rank)
    rank_of[by_rank] = np.arange(by_rank.size, dtype=np.int64)
    return by_rank, rank_of


# ---- JFFC -------------------------------------------------------------------------------------------------------


@njit(cache=True)
def jffc_arrival(busy, caps, by_rank, free, nfree):
    """JFFC on an arrival: the fastest chain with a free slot, whose slot is taken, or -1 (join the queue).

    Returns (chain, nfree)."""
    if nfree == 0:
        return -1, nfree
    k = by_rank[free[0]]
    busy[k] += 1
    if busy[k] == caps[k]:
        nfree = iheap_pop(free, nfree)
    return k, nfree


@njit(cache=True)
def jffc_release(busy, caps, rank_of, free, nfree, k):
    """JFFC when a slot of chain ``k`` frees up and nobody waits: the chain is offered again. Returns nfree.

    (With a queue the slot goes straight to its head: nothing to decide.)"""
    if busy[k] == caps[k]:
        nfree = iheap_push(free, nfree, rank_of[k])
    busy[k] -= 1
    return nfree


# The live policy's view of the same rules (:class:`~petals_chain.dispatch.jffc.JFFC`, one event per call from
# Python): the whole state in one (6, K) int64 array, so that a call unboxes one array instead of five (the
# arguments' unboxing, not the decision, is what a call from Python costs). Rows:
JFFC_BUSY, JFFC_CAPS, JFFC_BY_RANK, JFFC_RANK_OF, JFFC_FREE, JFFC_NFREE = range(6)  # nfree: JFFC_NFREE's first entry


def jffc_state(rates, caps) -> np.ndarray:
    """The packed JFFC state over chains with these rates and capacities, every slot free."""
    by_rank, rank_of = speed_order(rates)
    state = np.zeros((6, by_rank.size), dtype=np.int64)
    state[JFFC_CAPS] = caps
    state[JFFC_BY_RANK] = by_rank
    state[JFFC_RANK_OF] = rank_of
    state[JFFC_FREE] = np.arange(by_rank.size)  # every rank: a sorted array is a heap
    state[JFFC_NFREE, 0] = by_rank.size
    return state


@njit(cache=True)
def jffc_take(state):
    """:func:`jffc_arrival` on the packed state: the chain whose slot is taken, or -1 (join the queue)."""
    k, nfree = jffc_arrival(state[JFFC_BUSY], state[JFFC_CAPS], state[JFFC_BY_RANK], state[JFFC_FREE],
                            state[JFFC_NFREE, 0])
    state[JFFC_NFREE, 0] = nfree
    return k


@njit(cache=True)
def jffc_give(state, k, queued):
    """A departure from chain ``k`` on the packed state: -1, changing nothing, if ``k`` is no chain or has no job in
    service; 1 if requests are ``queued`` (the slot goes to the head: nothing to decide); else :func:`jffc_release`
    and 0."""
    if k < 0 or k >= state.shape[1] or state[JFFC_BUSY, k] <= 0:
        return -1
    if queued:
        return 1
    state[JFFC_NFREE, 0] = jffc_release(state[JFFC_BUSY], state[JFFC_CAPS], state[JFFC_RANK_OF], state[JFFC_FREE],
                                        state[JFFC_NFREE, 0], k)
    return 0


# ---- JFFC with migration ----------------------------------------------------------------------------------------


@njit(cache=True)
def fastest_free(busy, caps, by_rank):
    """JFFC-migration on an arrival: the fastest chain with a free slot (taken), or -1 (join the queue)."""
    for r in range(by_rank.shape[0]):
        c = by_rank[r]
        if busy[c] < caps[c]:
            busy[c] += 1
            return c
    return -1


@njit(cache=True)
def migration_source(busy, rates, by_rank, k):
    """JFFC-migration after a departure from chain ``k`` with nobody waiting (``busy[k]`` already lowered):
    the slowest busy chain if it is strictly slower than k (its longest-resident job moves to k), else -1."""
    s = -1
    for r in range(by_rank.shape[0] - 1, -1, -1):
        if busy[by_rank[r]] > 0:
            s = by_rank[r]
            break
    if s >= 0 and rates[s] < rates[k]:
        return s
    return -1


# ---- per-chain FCFS policies: JSQ, SA-JSQ, SED, JIQ -------------------------------------------------------------


@njit(cache=True)
def pick(ties, count, u):
    """ties[⌊u·count⌋], clamped: a uniform random tie-break from one draw u in [0, 1)."""
    idx = int(u * count)
    idx = min(idx, count - 1)
    return ties[idx]


@njit(cache=True)
def per_chain_choice(code, busy, qlen, caps, rates, u, ties, ties2):
    """The chain an arriving job joins under JSQ (1), SA-JSQ (2), SED (3) or JIQ (4), from one uniform ``u``.

    JSQ: min (Z_k − c_k + 1)⁺ / c_k, Z_k = busy + queued; SA-JSQ: the same, ties to the fastest; SED:
    min 1/μ_k + (Z_k − c_k + 1)⁺ / (μ_k c_k); JIQ: a chain with a free slot, else any. Remaining ties are
    broken by :func:`pick`. ``ties``/``ties2`` are scratch arrays of one slot per chain.
    """
    nk = rates.shape[0]
    count = 0
    if code == 4:  # JIQ
        for c in range(nk):
            if busy[c] < caps[c]:
                ties[count] = c
                count += 1
        if count > 0:
            return pick(ties, count, u)
        idx = int(u * nk)
        return idx if idx < nk else nk - 1
    best = 0.0
    for c in range(nk):
        z = busy[c] + qlen[c]
        if code == 3:
            key = 1.0 / rates[c] + max(z - caps[c] + 1, 0) / (rates[c] * caps[c])
        else:
            key = max(z - caps[c] + 1, 0) / caps[c]
        if count == 0 or key < best:
            best = key
            ties[0] = c
            count = 1
        elif key == best:
            ties[count] = c
            count += 1
    if code == 2:  # SA-JSQ: keep only the fastest of the tied chains
        fastest = rates[ties[0]]
        for x in range(1, count):
            fastest = max(fastest, rates[ties[x]])
        c2 = 0
        for x in range(count):
            if rates[ties[x]] == fastest:
                ties2[c2] = ties[x]
                c2 += 1
        return pick(ties2, c2, u)
    return pick(ties, count, u)
