"""Validated speed-up functions s_1..s_d (docs/moldable.md, "Model"): increasing, concave, s_1 = 1."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from petals_chain.model import SpecError

TOL = 1e-12


class SpeedUpError(SpecError):
    """A speed-up vector breaks P1 (0 = s_0 < 1 = s_1 < ... < s_d) or P2 (concavity); the message says where."""


@dataclass(frozen=True)
class SpeedUp:
    """s[i-1] = speed of a job on i servers, i = 1..d; checked increasing and concave with s_1 = 1 on creation."""

    s: tuple[float, ...]

    def __post_init__(self) -> None:
        """Check P1 (s_1 = 1, strictly increasing) and P2 (concave); store the entries as floats."""
        s = np.asarray(self.s, dtype=float)
        if s.ndim != 1 or s.size < 1:
            raise SpeedUpError("speedup: give at least s_1")
        if not np.all(np.isfinite(s)):
            raise SpeedUpError(f"speedup: every entry must be finite, got {list(self.s)}")
        if abs(s[0] - 1.0) > TOL:
            raise SpeedUpError(f"speedup: s_1 must be 1 (sizes are measured on one server), got {s[0]!r}")
        full = np.concatenate([[0.0], s])
        inc = np.diff(full)
        bad = np.flatnonzero(inc <= TOL)
        if bad.size:
            i = int(bad[0]) + 1
            raise SpeedUpError(f"speedup: s_{i} = {full[i]!r} must exceed s_{i - 1} = {full[i - 1]!r} (increasing)")
        bad = np.flatnonzero(np.diff(inc) > 1e-9 * max(1.0, float(s[-1])))
        if bad.size:
            i = int(bad[0]) + 1
            raise SpeedUpError(f"speedup: not concave at i = {i}: s_{i + 1} - s_{i} = {inc[i]!r} > "
                               f"s_{i} - s_{i - 1} = {inc[i - 1]!r}")
        object.__setattr__(self, "s", tuple(float(v) for v in s))

    @property
    def d(self) -> int:
        """Largest number of servers a job may use."""
        return len(self.s)

    def array(self) -> np.ndarray:
        """s_1..s_d as a float array (index i-1 for i servers)."""
        return np.asarray(self.s, dtype=float)

    def efficiency(self) -> np.ndarray:
        """a_i = s_i / i, non-increasing by concavity (eq. 2)."""
        return self.array() / np.arange(1, self.d + 1)


def linear(d: int) -> SpeedUp:
    """s_i = i: perfect parallelism up to d servers."""
    if d < 1:
        raise SpeedUpError(f"speedup: d must be >= 1, got {d}")
    return SpeedUp(tuple(float(i) for i in range(1, d + 1)))


def amdahl(d: int, parallel_fraction: float) -> SpeedUp:
    """Amdahl's law s_i = 1 / ((1 - f) + f / i) with parallel fraction f in (0, 1]."""
    if d < 1:
        raise SpeedUpError(f"speedup: d must be >= 1, got {d}")
    if not 0 < parallel_fraction <= 1:
        raise SpeedUpError(f"speedup: parallel_fraction must be in (0, 1], got {parallel_fraction!r}")
    i = np.arange(1, d + 1)
    return SpeedUp(tuple(1.0 / ((1 - parallel_fraction) + parallel_fraction / i)))


def from_table(values: Sequence[float]) -> SpeedUp:
    """A speed-up given as s_1..s_d (validated, not repaired)."""
    return SpeedUp(tuple(float(v) for v in values))


def parse(text: str) -> SpeedUp:
    """A comma-separated list such as '1,1.8,2.5,3,3.4' (for the command line)."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SpeedUpError(f"speedup: {text!r} is not a comma-separated list of numbers") from None
    return from_table(values)


def concave_hull(servers: Sequence[int], speeds: Sequence[float], d: int | None = None) -> SpeedUp:
    """The least concave majorant through (0, 0) of measured points (i, s(i)), normalised to s_1 = 1.

    Points need not cover every i; the hull is evaluated at i = 1..d (default: the largest measured i).
    It is made strictly increasing by stopping where it would flatten (more servers than that never help).
    """
    i = np.asarray(servers, dtype=float)
    v = np.asarray(speeds, dtype=float)
    if i.shape != v.shape or i.size == 0:
        raise SpeedUpError("speedup: servers and speeds must be non-empty and of equal length")
    if np.any(i < 1) or np.any(i != np.round(i)):
        raise SpeedUpError("speedup: server counts must be integers >= 1")
    if np.any(~np.isfinite(v)) or np.any(v <= 0):
        raise SpeedUpError("speedup: measured speeds must be finite and > 0")
    if 1 not in set(i.astype(int)):
        raise SpeedUpError("speedup: a measurement at one server (i = 1) is required for the normalisation")
    d = int(i.max()) if d is None else int(d)
    base = float(np.max(v[i == 1]))
    px = np.concatenate([[0.0], i])
    py = np.concatenate([[0.0], v / base])
    best = {}
    for x, y in zip(px, py):
        best[x] = max(best.get(x, -np.inf), y)
    xs = sorted(best)
    hull: list[tuple[float, float]] = []
    for x in xs:  # upper hull, monotone chain
        y = best[x]
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (y - y1) - (y2 - y1) * (x - x1) >= 0:
                hull.pop()
            else:
                break
        hull.append((x, y))
    hx, hy = np.array([h[0] for h in hull]), np.array([h[1] for h in hull])
    grid = np.arange(1, d + 1, dtype=float)
    s = np.interp(grid, hx, hy)
    s = s / s[0]
    keep = 1
    while keep < d and s[keep] - s[keep - 1] > TOL:
        keep += 1
    return SpeedUp(tuple(s[:keep]))
