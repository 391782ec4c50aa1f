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


def optimum(sizes: Sequence[int], capacity: int, *, time_limit_s: float = 30.0) -> tuple[int, bool]:
    """The fewest GPUs for ``sizes`` and whether the ILP had to prove it: where first fit decreasing already meets
    the size bound, that is the optimum and no ILP runs; otherwise :func:`optimal_bins` solves it."""
    if any(s <= 0 or s > capacity for s in sizes):
        raise ValueError(f"sizes must lie in (0, capacity={capacity}]")
    lower = size_lower_bound(sizes, capacity)
    if first_fit_decreasing(sizes, capacity) == lower:
        return lower, False
    return optimal_bins(sizes, capacity, time_limit_s=time_limit_s), True


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
