"""The optimal allocation: Theorem 1's closed form of the LP (P), its HiGHS oracle, and the multi-class
split (Q) by water-filling with its own LP oracle (docs/moldable.md, "Theorem 1" and "Several classes")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog

from petals_chain.model import InfeasibleError, SpecError
from petals_chain.moldable.speedup import SpeedUp

TIE = 1e-12


class LoadError(InfeasibleError):
    """The offered load is outside (0, 1]: no allocation keeps every job served (Proposition 1)."""


@dataclass(frozen=True)
class Allocation:
    """y[i-1] = optimal fraction of servers' worth of jobs on i servers; p[i-1] = s_i y_i / λ; D* = Σ y / λ."""

    load: float
    y: np.ndarray
    p: np.ndarray
    execution_time: float
    case: str  # "i" (λ <= a_d), "ii" (λ = some a_i) or "iii" (mix of two neighbours)

    @property
    def support(self) -> tuple[int, ...]:
        """I*: the server counts with y_i > 0 (1-based)."""
        return tuple(int(i) + 1 for i in np.flatnonzero(self.y > 0))


def check_load(load: float, field: str = "load") -> float:
    """λ as a float; LoadError unless 0 < λ <= 1 (λ > 1 saturates n servers even at full efficiency)."""
    try:
        lam = float(load)
    except (TypeError, ValueError):
        raise SpecError(f"{field}: {load!r} is not a number") from None
    if not np.isfinite(lam) or lam <= 0:
        raise LoadError(f"{field}: must be finite and > 0, got {load!r}")
    if lam > 1 + TIE:
        raise LoadError(f"{field}: λ = {lam!r} > 1 is infeasible: even one server per job cannot carry it "
                        "(Proposition 1)")
    return min(lam, 1.0)


def optimal_allocation(speedup: SpeedUp, load: float) -> Allocation:
    """Theorem 1: the solution of (P) in closed form; at most two neighbouring server counts are used."""
    lam = check_load(load)
    s = speedup.array()
    a = speedup.efficiency()
    d = speedup.d
    y = np.zeros(d)
    scale = TIE * max(1.0, lam)
    if lam <= a[-1] + scale:
        y[-1] = lam / s[-1]
        case = "i"
    else:
        equal = np.flatnonzero(np.abs(a - lam) <= scale)
        if equal.size:
            i1 = int(equal.max()) + 1
            y[i1 - 1] = 1.0 / i1
            case = "ii"
        else:
            i = int(np.flatnonzero(a > lam).max()) + 1  # a_i > λ > a_{i+1}
            g = a[i - 1] - a[i]
            y[i - 1] = (lam - a[i]) / (i * g)
            y[i] = (a[i - 1] - lam) / ((i + 1) * g)
            case = "iii"
    return Allocation(lam, y, s * y / lam, float(y.sum() / lam), case)


def lp_allocation(speedup: SpeedUp, load: float) -> tuple[float, np.ndarray]:
    """(P) solved by HiGHS: min (1/λ)Σy s.t. Σ s_i y_i = λ, Σ i y_i <= 1, y >= 0; returns (D*, y)."""
    lam = check_load(load)
    s = speedup.array()
    d = speedup.d
    res = linprog(np.ones(d) / lam, A_ub=np.arange(1, d + 1, dtype=float)[None, :], b_ub=[1.0],
                  A_eq=s[None, :], b_eq=[lam], bounds=(0, None), method="highs")
    if res.status != 0:
        raise LoadError(f"load: HiGHS found (P) infeasible at λ = {lam!r} ({res.message})")
    return float(res.fun), np.asarray(res.x)


@dataclass(frozen=True)
class JobClass:
    """One class of moldable jobs: its speed-up, arrival rate λ_j (per server) and mean size E[S_j]."""

    speedup: SpeedUp
    arrival_rate: float
    mean_size: float = 1.0

    def __post_init__(self) -> None:
        """Arrival rate and mean size must be finite and positive."""
        for name in ("arrival_rate", "mean_size"):
            v = getattr(self, name)
            if not (np.isfinite(v) and v > 0):
                raise SpecError(f"class: {name} must be finite and > 0, got {v!r}")

    @property
    def load(self) -> float:
        """ρ_j = λ_j E[S_j]: servers' worth of work it brings."""
        return self.arrival_rate * self.mean_size


@dataclass(frozen=True)
class ClassAllocation:
    """The split of servers b_j, the per-class optimal y_{ij} (servers' fractions) and p*_j, and D*."""

    share: np.ndarray
    y: tuple[np.ndarray, ...]
    p: tuple[np.ndarray, ...]
    execution_time: float


def _check_classes(classes: Sequence[JobClass]) -> tuple[np.ndarray, float]:
    """Loads ρ_j and total arrival rate; LoadError when Σ ρ_j > 1."""
    if not classes:
        raise SpecError("classes: at least one class is required")
    rho = np.array([c.load for c in classes])
    if rho.sum() > 1 + TIE:
        raise LoadError(f"classes: total load Σρ_j = {rho.sum():.6g} > 1 is infeasible")
    return rho, float(sum(c.arrival_rate for c in classes))


def segment_gains(speedup: SpeedUp) -> np.ndarray:
    """G_i = (s_{i+1} - s_i) / ((i+1) s_i - i s_{i+1}), i = 1..d-1: minus λ times the slope of f_j on segment i
    (inf where a_i = a_{i+1}, a segment of zero length)."""
    s = speedup.array()
    i = np.arange(1, speedup.d)
    den = (i + 1) * s[:-1] - i * s[1:]
    with np.errstate(divide="ignore"):
        return np.where(den > TIE, (s[1:] - s[:-1]) / np.maximum(den, TIE), np.inf)


def water_fill(classes: Sequence[JobClass]) -> ClassAllocation:
    """Solve (Q): give each class b_j = ρ_j servers, then the rest segment by segment, best gain G first."""
    rho, lam = _check_classes(classes)
    share = rho.copy()
    segments = []
    for j, c in enumerate(classes):
        a = c.speedup.efficiency()
        for i, gain in enumerate(segment_gains(c.speedup)):
            if a[i] - a[i + 1] > TIE:
                segments.append((-gain, j, i, rho[j] * (1 / a[i + 1] - 1 / a[i])))
    left = 1.0 - share.sum()
    for _, j, _, length in sorted(segments):
        if left <= 0:
            break
        take = min(length, left)
        share[j] += take
        left -= take
    ys, ps = [], []
    for j, c in enumerate(classes):
        alloc = optimal_allocation(c.speedup, min(1.0, rho[j] / share[j]))
        ys.append(share[j] * alloc.y)
        ps.append(alloc.p)
    return ClassAllocation(share, tuple(ys), tuple(ps), float(sum(y.sum() for y in ys) / lam))


def lp_classes(classes: Sequence[JobClass]) -> float:
    """(Q) solved by HiGHS over all y_{ij} at once; returns D* (the oracle for water_fill)."""
    rho, lam = _check_classes(classes)
    sizes = [c.speedup.d for c in classes]
    nv = sum(sizes)
    a_eq = np.zeros((len(classes), nv))
    a_ub = np.zeros((1, nv))
    off = 0
    for j, c in enumerate(classes):
        a_eq[j, off:off + sizes[j]] = c.speedup.array()
        a_ub[0, off:off + sizes[j]] = np.arange(1, sizes[j] + 1)
        off += sizes[j]
    res = linprog(np.ones(nv) / lam, A_ub=a_ub, b_ub=[1.0], A_eq=a_eq, b_eq=rho, bounds=(0, None), method="highs")
    if res.status != 0:
        raise LoadError(f"classes: HiGHS found (Q) infeasible ({res.message})")
    return float(res.fun)
