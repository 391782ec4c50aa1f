"""Timing for the benchmarks: the fastest of several calls (the one a noisy shared machine disturbed least), or their
median where it is compared with medians measured elsewhere."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def best_time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Fastest wall time (seconds) of ``repeat`` calls of ``fn``, and the last call's value."""
    best, value = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        value = fn()
        best = min(best, time.perf_counter() - t0)
    return best, value


def best_of(fn: Callable[[], Any], repeat: int) -> float:
    """Fastest wall time (seconds) of ``repeat`` calls of ``fn``."""
    return best_time(fn, repeat)[0]


def median_of(fn: Callable[[], Any], repeat: int) -> float:
    """Median wall time (seconds) of ``repeat`` calls of ``fn``."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
