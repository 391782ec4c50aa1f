"""Computable Stein-method bounds of the finite-n gap to the optimum (docs/moldable.md, "Bounds").

They hold for greedy(p*) at n servers and load λ < 1; for |I*| = 2 they are loose (vacuous at the paper's n),
so they serve as sanity checks of the simulator, not as predictions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from petals_chain.model import SpecError
from petals_chain.moldable.optimal import LoadError, optimal_allocation
from petals_chain.moldable.speedup import SpeedUp


@dataclass(frozen=True)
class SteinBounds:
    """Proposition 2's B, the distance bound E >= E||x - y*||_1, and the implied bounds on P_b and E[D]."""

    n: int
    load: float
    delta: float
    drift: float  # B of Proposition 2
    distance: float  # E = 1/n + sqrt(2B)
    blocking: float  # P_b <= d E / λ (capped at 1)
    execution_gap: float  # |E[D] - D*| <= this (from λ|E[D]-D*| <= (E + P_b)/(1 - P_b)); inf when P_b bound >= 1
    execution_gap_single: float | None  # |I*| = 1: E[D] - D* <= 1/(nλ(1 - P_b)) with P_b at its bound


def best_delta(d: int, gap: float, n: int, load: float) -> float:
    """δ = min(sqrt(2 d g / (n λ)), 1 - λ) balances Proposition 2's δ terms (kept inside (0, 1 - λ))."""
    return min(math.sqrt(2 * d * gap / (n * load)), 1 - load) if gap > 0 else (1 - load) / 2


def stein_bounds(speedup: SpeedUp, n: int, load: float, delta: float | None = None) -> SteinBounds:
    """Evaluate the bounds for greedy(p*) with n servers at per-server load λ in (0, 1)."""
    if int(n) != n or n < 1:
        raise SpecError(f"n: must be an integer >= 1, got {n!r}")
    alloc = optimal_allocation(speedup, load)
    lam = alloc.load
    if lam >= 1:
        raise LoadError("load: the bounds need λ < 1 (they use δ in (0, 1 - λ))")
    d = speedup.d
    sup = alloc.support
    a = speedup.efficiency()
    gap = float(a[sup[0] - 1] - a[sup[-1] - 1]) if len(sup) == 2 else 0.0
    if delta is None:
        delta = best_delta(d, gap, n, lam)
    if not 0 < delta < 1 - lam:
        raise SpecError(f"delta: must lie in (0, 1 - λ) = (0, {1 - lam:.6g}), got {delta!r}")
    drift = (1 + 2 * d) / n
    if len(sup) == 2:
        drift += (2 * d / n) * (1 / lam + 1 / gap) + 4 * d / (n * lam * delta) + 2 * delta / gap
    distance = 1 / n + math.sqrt(2 * drift)
    pb = min(1.0, d * distance / lam)
    gap_d = (distance + pb) / ((1 - pb) * lam) if pb < 1 else math.inf
    single = 1 / (n * lam * (1 - pb)) if len(sup) == 1 and pb < 1 else None
    return SteinBounds(int(n), lam, float(delta), drift, distance, pb, gap_d, single)


def lemma3_tail(speedup: SpeedUp, n: int, load: float, delta: float, kappa: float) -> float:
    """Lemma 3: P(r > λ + δ) <= (s_d / λ)(κ + 2 / (n δ)) for any κ > 0 (capped at 1)."""
    if delta <= 0 or kappa <= 0:
        raise SpecError("delta and kappa must be > 0")
    return min(1.0, speedup.s[-1] / load * (kappa + 2 / (n * delta)))
