"""Exact references for one slot's packing (docs/mell.md, "Exact reference"): the bin-packing optimum by
ILP (scipy milp / HiGHS), the size lower bound ⌈ΣS/C⌉ and first fit decreasing's count (an upper bound)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp


def size_lower_bound(sizes: Sequence[int], capacity: int) -> int:
    """⌈Σ S_i / C⌉: no packing uses fewer GPUs."""
    if capacity <= 0:
        raise ValueError(f"capacity must be > 0, got {capacity}")
    total = int(sum(sizes))
    return -(-total // capacity)


def martello_toth_bound(sizes: Sequence[int], capacity: int) -> int:
    """Martello and Toth's L2 lower bound (at least ⌈ΣS/C⌉): for each threshold α ≤ C/2, the items above C − α
    and those above C/2 each need a bin of their own, and the items in [α, C/2] fill what the latter leave free."""
    best = size_lower_bound(sizes, capacity)
    half = capacity / 2
    for a in {0, *(s for s in sizes if s <= half)}:
        big = sum(1 for s in sizes if s > capacity - a)
        mid = [s for s in sizes if half < s <= capacity - a]
        small = sum(s for s in sizes if a <= s <= half)
        spill = small - (len(mid) * capacity - sum(mid))
        best = max(best, big + len(mid) + max(0, -(-spill // capacity)))
    return best


def fits_in_bins(sizes: Sequence[int], capacity: int, bins: int, *, node_limit: int = 5_000_000) -> bool:
    """Whether the sizes fit ``bins`` bins of ``capacity``: depth-first search, largest item first, one branch per
    distinct bin load, cut where the room no remaining item can use exceeds the total slack. Exact; raises
    RuntimeError past ``node_limit`` nodes."""
    items = sorted((int(s) for s in sizes), reverse=True)
    slack = bins * capacity - sum(items)
    if slack < 0 or (items and items[0] > capacity):
        return False
    loads = [0] * bins
    nodes = 0

    def place(i: int) -> bool:
        nonlocal nodes
        if i == len(items):
            return True
        nodes += 1
        if nodes > node_limit:
            raise RuntimeError(f"fits_in_bins: no answer within {node_limit} nodes")
        x, tried = items[i], set()
        smallest_left = items[-1] if i + 1 < len(items) else capacity + 1
        for b in range(bins):
            if loads[b] + x > capacity or loads[b] in tried:
                continue
            tried.add(loads[b])
            loads[b] += x
            waste = sum(capacity - v for v in loads if capacity - v < smallest_left)
            if waste <= slack and place(i + 1):
                return True
            loads[b] -= x
        return False

    return place(0)


def optimum(sizes: Sequence[int], capacity: int, *, ilp_time_limit_s: float = 3.0) -> tuple[int, str]:
    """The fewest GPUs for ``sizes`` and how it was proved: ``"bound"`` where first fit decreasing meets
    :func:`martello_toth_bound` (no solver runs), else ``"ilp"`` (:func:`optimal_bins`), or ``"search"``
    (:func:`fits_in_bins` for each count from the bound up) where the ILP found no proof within its time limit."""
    if any(s <= 0 or s > capacity for s in sizes):
        raise ValueError(f"sizes must lie in (0, capacity={capacity}]")
    lower, upper = martello_toth_bound(sizes, capacity), first_fit_decreasing(sizes, capacity)
    if lower == upper:
        return lower, "bound"
    try:
        return optimal_bins(sizes, capacity, time_limit_s=ilp_time_limit_s), "ilp"
    except RuntimeError:
        k = lower
        while k < upper and not fits_in_bins(sizes, capacity, k):
            k += 1
        return k, "search"


def optimal_bins(sizes: Sequence[int], capacity: int, *, time_limit_s: float = 30.0) -> int:
    """Fewest GPUs of capacity C that hold every size: assignment ILP x[i,b], y[b] with symmetry breaking.

    Meant for small instances (≤ ~25 items). Raises ValueError for a size outside (0, C], RuntimeError if
    HiGHS does not prove optimality within ``time_limit_s``.
    """
    s = np.asarray(sizes, dtype=float)
    if s.size == 0:
        return 0
    if np.any(s <= 0) or np.any(s > capacity):
        raise ValueError(f"sizes must lie in (0, capacity={capacity}]")
    n = s.size
    first_fit = first_fit_decreasing(list(map(int, s)), capacity)
    nb = first_fit  # an upper bound on the bins needed
    nx = n * nb
    c = np.concatenate([np.zeros(nx), np.ones(nb)])
    rows, lo, hi = [], [], []
    for i in range(n):  # every item in exactly one bin
        a = np.zeros(nx + nb)
        a[i * nb:(i + 1) * nb] = 1
        rows.append(a), lo.append(1), hi.append(1)
    for b in range(nb):  # capacity, and only in open bins
        a = np.zeros(nx + nb)
        a[b:nx:nb] = s
        a[nx + b] = -capacity
        rows.append(a), lo.append(-np.inf), hi.append(0)
    for b in range(nb - 1):  # bins open in order
        a = np.zeros(nx + nb)
        a[nx + b], a[nx + b + 1] = -1, 1
        rows.append(a), lo.append(-np.inf), hi.append(0)
    for i in range(n):  # item i only in bins 0..i (symmetry breaking)
        if i + 1 < nb:
            a = np.zeros(nx + nb)
            a[i * nb + i + 1:(i + 1) * nb] = 1
            rows.append(a), lo.append(0), hi.append(0)
    order = np.argsort(-s, kind="stable")
    if not np.array_equal(order, np.arange(n)):
        return optimal_bins(list(s[order].astype(int)), capacity, time_limit_s=time_limit_s)
    res = milp(c, constraints=LinearConstraint(np.array(rows), lo, hi), integrality=np.ones(nx + nb),
               bounds=Bounds(0, 1), options={"time_limit": time_limit_s})
    if res.status != 0 or res.x is None:
        raise RuntimeError(f"optimal_bins: HiGHS did not prove optimality ({res.message})")
    return int(round(res.fun))


def first_fit_decreasing(sizes: Sequence[int], capacity: int) -> int:
    """Bins used by first fit decreasing (an upper bound for the optimum, and the ILP's bin count)."""
    free: list[int] = []
    for x in sorted(sizes, reverse=True):
        for k, f in enumerate(free):
            if f >= x:
                free[k] -= x
                break
        else:
            free.append(capacity - x)
    return len(free)
