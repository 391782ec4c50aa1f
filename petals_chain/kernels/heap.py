"""The binary min-heaps of the numba event loops, written once.

* The departure heap: parallel arrays ``ht`` (float64 event times) and ``hp`` (int64, three columns per entry),
  ordered by time and, at equal times, by ``hp[:, 0]`` (a sequence number, or any int key that breaks ties), so
  two events at the same instant come out in a fixed order. The other two columns are the caller's payload: the
  chain simulator keeps (sequence, job, chain), the moldable simulators (slot, servers, class). Its size is
  passed in and returned; :func:`heap_grow` doubles full storage.
* The int min-heap ``a[:size]``: JFFC's chains with a free slot, keyed by speed rank
  (:mod:`petals_chain.kernels.dispatch_rules`).

Users: :mod:`petals_chain.kernels.chain_sim`, :mod:`petals_chain.moldable.kernel`,
:mod:`petals_chain.moldable.classes_sim` and the dispatch rules.
"""

from __future__ import annotations

import numpy as np

from petals_chain.kernels.jit import njit

__all__ = ["heap_grow", "heap_pop", "heap_push", "iheap_pop", "iheap_push"]

# ---- departure heap: (time, key) ordered, three int columns per entry -----------------------------------------


@njit(cache=True)
def heap_push(ht, hp, size, t, seq, job, chain):
    """Push (t, seq, job, chain) onto the departure heap of ``size`` entries; return the new size."""
    pos = size
    while pos > 0:
        parent = (pos - 1) >> 1
        pt = ht[parent]
        if pt < t or (pt == t and hp[parent, 0] < seq):
            break
        ht[pos] = pt
        hp[pos, 0] = hp[parent, 0]
        hp[pos, 1] = hp[parent, 1]
        hp[pos, 2] = hp[parent, 2]
        pos = parent
    ht[pos] = t
    hp[pos, 0] = seq
    hp[pos, 1] = job
    hp[pos, 2] = chain
    return size + 1


@njit(cache=True)
def heap_pop(ht, hp, size):
    """Remove the root of the departure heap (read it first); return the new size."""
    size -= 1
    if size == 0:
        return 0
    t = ht[size]
    s = hp[size, 0]
    j = hp[size, 1]
    k = hp[size, 2]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        right = child + 1
        if right < size and (ht[right] < ht[child] or (ht[right] == ht[child] and hp[right, 0] < hp[child, 0])):
            child = right
        if ht[child] < t or (ht[child] == t and hp[child, 0] < s):
            ht[pos] = ht[child]
            hp[pos, 0] = hp[child, 0]
            hp[pos, 1] = hp[child, 1]
            hp[pos, 2] = hp[child, 2]
            pos = child
        else:
            break
    ht[pos] = t
    hp[pos, 0] = s
    hp[pos, 1] = j
    hp[pos, 2] = k
    return size


@njit(cache=True)
def heap_grow(ht, hp):
    """Double the departure heap's storage."""
    n = ht.shape[0]
    ht2 = np.empty(2 * n, np.float64)
    hp2 = np.empty((2 * n, 3), np.int64)
    ht2[:n] = ht
    hp2[:n] = hp
    return ht2, hp2


# ---- int min-heap -------------------------------------------------------------------------------------------------


@njit(cache=True)
def iheap_push(a, size, v):
    """Push int ``v`` onto the min-heap ``a[:size]``; return the new size."""
    pos = size
    while pos > 0:
        parent = (pos - 1) >> 1
        if a[parent] <= v:
            break
        a[pos] = a[parent]
        pos = parent
    a[pos] = v
    return size + 1


@njit(cache=True)
def iheap_pop(a, size):
    """Remove the minimum of the int min-heap ``a[:size]``; return the new size."""
    size -= 1
    v = a[size]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= size:
            break
        if child + 1 < size and a[child + 1] < a[child]:
            child += 1
        if a[child] < v:
            a[pos] = a[child]
            pos = child
        else:
            break
    if size > 0:
        a[pos] = v
    return size
