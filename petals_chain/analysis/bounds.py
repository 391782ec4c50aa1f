"""Theorem 3.7: closed-form lower/upper bounds on the JFFC mean response time.

The JFFC system with ``n`` jobs departs at a rate between ``ν̲_n`` (jobs on the
slowest chains) and ``ν̄_n`` (jobs on the fastest chains); the birth-death
processes with those death rates bound the mean occupancy, and Little's law
turns occupancy into response time. Everything is O(C) numpy in log space, so
``C = Σ c_k`` in the thousands and loads next to 1 neither overflow nor underflow.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from petals_chain.model import SpecError

__all__ = [
    "ResponseBounds",
    "birth_death_mean_jobs",
    "check_rates_capacities",
    "prefix_lower_bounds",
    "slot_death_rates",
    "theorem37_bounds",
]

_LOG_TINY = -700.0


@dataclass(frozen=True)
class ResponseBounds:
    """Lower and upper bound (seconds) on the steady-state mean response time under JFFC.

    Both are ``math.inf`` when the system is unstable (arrival rate ≥ total service rate).
    """

    lower_s: float
    upper_s: float


def check_rates_capacities(rates: Sequence[float], capacities: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Validate per-chain rates μ_k (finite, > 0) and capacities c_k (integers ≥ 1); return numpy arrays."""
    try:
        mu = np.asarray(rates, dtype=float)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"rates: not a sequence of numbers ({exc})") from None
    try:
        cap_raw = np.asarray(capacities)
        cap_f = cap_raw.astype(float)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"capacities: not a sequence of integers ({exc})") from None
    if mu.ndim != 1 or mu.size == 0:
        raise SpecError(f"rates: need a non-empty 1-D sequence, got shape {mu.shape}")
    if cap_f.shape != mu.shape:
        raise SpecError(f"capacities: shape {cap_f.shape} differs from rates shape {mu.shape}")
    bad = ~(np.isfinite(mu) & (mu > 0))
    if bad.any():
        k = int(np.argmax(bad))
        raise SpecError(f"rates[{k}] = {mu[k]!r}: a service rate must be finite and > 0")
    bad = ~(np.isfinite(cap_f) & (cap_f >= 1) & (cap_f == np.floor(cap_f))) | (cap_raw.dtype == bool)
    if np.any(bad):
        k = int(np.argmax(np.broadcast_to(bad, cap_f.shape)))
        raise SpecError(f"capacities[{k}] = {cap_raw[k]!r}: a capacity must be an integer >= 1")
    return mu, cap_f.astype(np.int64)


def _check_arrival_rate(arrival_rate: float) -> float:
    """Return ``arrival_rate`` as a float after checking it is finite and > 0."""
    try:
        lam = float(arrival_rate)
    except (TypeError, ValueError):
        raise SpecError(f"arrival_rate = {arrival_rate!r}: must be a number") from None
    if not (math.isfinite(lam) and lam > 0):
        raise SpecError(f"arrival_rate = {arrival_rate!r}: must be finite and > 0")
    return lam


def slot_death_rates(rates: np.ndarray, capacities: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """Return (ν̄_1..ν̄_C, ν̲_1..ν̲_C, ν): departure rates with n jobs on the fastest / slowest slots.

    Each chain contributes ``c_k`` slots of rate ``μ_k``; ν̄_n sums the n fastest
    slots, ν̲_n the n slowest, so both are O(C) cumulative sums.
    """
    order = np.argsort(rates)  # O(K log K): sort chains, not slots
    slots = np.repeat(rates[order], capacities[order])  # ascending: slowest first
    slowest_first = np.cumsum(slots)
    fastest_first = np.cumsum(slots[::-1])
    total = float(fastest_first[-1])
    # Make the two sequences end on the very same float so that homogeneous rates give equal bounds.
    slowest_first[-1] = total
    return fastest_first, slowest_first, total


def birth_death_mean_jobs(arrival_rate: float, death_rates: np.ndarray | Sequence[float], total_rate: float) -> float:
    """Stationary mean of the birth-death chain: birth rate λ, death rate ν_n (given for n=1..C), ν beyond C.

    ``death_rates[n-1]`` is ν_n for n = 1..C (all > 0); for n > C the death rate is
    ``total_rate``. Returns ``math.inf`` when λ ≥ ``total_rate`` (no stationary law).
    Computed as a log-sum-exp over φ_n ∝ Π_{i≤n} λ/ν_i plus the geometric tail
    φ_C ρ^{n-C}, so it is exact in floating point for any C and any ρ < 1.
    """
    lam = float(arrival_rate)
    nu = float(total_rate)
    if not (math.isfinite(lam) and lam > 0):
        raise SpecError(f"arrival_rate = {arrival_rate!r}: must be finite and > 0")
    if not (nu > 0 and math.isfinite(nu)):
        raise SpecError(f"total_rate = {total_rate!r}: must be finite and > 0")
    d = np.asarray(death_rates, dtype=float)
    if d.ndim != 1 or d.size == 0:
        raise SpecError(f"death_rates: need a non-empty 1-D array, got shape {d.shape}")
    if not (np.all(d > 0) and np.all(np.isfinite(d))):
        k = int(np.argmax(~((d > 0) & np.isfinite(d))))
        raise SpecError(f"death_rates[{k}] = {d[k]!r}: must be finite and > 0")
    if lam >= nu:
        return math.inf
    c = d.size
    # log φ_n / φ_0 for n = 0..C (log_phi[0] = 0).
    log_phi = np.empty(c + 1)
    log_phi[0] = 0.0
    np.cumsum(math.log(lam) - np.log(d), out=log_phi[1:])
    # Tail n ≥ C: Σ φ_C ρ^{n-C} = φ_C · ν/(ν-λ);  Σ n φ_C ρ^{n-C} = φ_C · (C ν/(ν-λ) + λν/(ν-λ)²).
    gap = nu - lam
    log_tail_mass = log_phi[c] + math.log(nu) - math.log(gap)
    log_tail_n = log_tail_mass + math.log(c + lam / gap)
    head = log_phi[:c]  # n = 0..C-1
    shift = max(float(head.max()), log_tail_mass, log_tail_n)
    w = np.exp(np.maximum(head - shift, _LOG_TINY))  # clip: e^-700 terms are negligible, and never underflow
    norm = float(w.sum()) + math.exp(log_tail_mass - shift)
    # An elementwise product and numpy's pairwise sum, not a BLAS dot: BLAS picks its kernel (and so its summation
    # order) by CPU, which moved near-ties between c values by one ulp from machine to machine.
    mean_n = float(np.sum(np.arange(c, dtype=float) * w)) + math.exp(log_tail_n - shift)
    return mean_n / norm


def theorem37_bounds(rates: Sequence[float], capacities: Sequence[int], arrival_rate: float) -> ResponseBounds:
    """Theorem 3.7 bounds on the JFFC mean response time for chains with rates μ_k and capacities c_k.

    Chains may be given in any order. Lower bound: birth-death with ν̄_n; upper:
    with ν̲_n; both divided by λ (Little). Unstable systems (λ ≥ ν) get ``inf``.
    """
    mu, cap = check_rates_capacities(rates, capacities)
    lam = _check_arrival_rate(arrival_rate)
    fast, slow, total = slot_death_rates(mu, cap)
    if lam >= total:
        return ResponseBounds(math.inf, math.inf)
    lower = birth_death_mean_jobs(lam, fast, total) / lam
    upper = birth_death_mean_jobs(lam, slow, total) / lam
    return ResponseBounds(lower_s=lower, upper_s=upper)


def prefix_lower_bounds(rates: Sequence[float], capacities: Sequence[int], arrival_rate: float) -> np.ndarray:
    """The Theorem 3.7 lower bound of every prefix of chains given fastest first (``rates`` non-increasing):
    entry k − 1 is ``theorem37_bounds(rates[:k], capacities[:k], λ).lower_s`` up to rounding, ``inf`` where the
    prefix is unstable; all K of them in one O(C) pass.

    Why one pass: with chains fastest first, the n fastest slots of a prefix are the n fastest of the whole list,
    so every prefix shares ν̄_n and φ_n ∝ Π_{i≤n} λ/ν̄_i below its own C_k; only its tail (ν = ν̄_{C_k} beyond C_k)
    is its own. Running sums of φ_n and n·φ_n give every prefix's head. They are shifted by the largest log φ_n,
    which for every stable prefix lies in its head (log φ_n rises while ν̄_n < λ < ν), so nothing overflows;
    the sums are sequential rather than pairwise, so an entry may differ from ``theorem37_bounds`` in the last
    dozen bits (relative error well below 1e-9 for C in the tens of thousands). The default composition uses it
    to rule out candidates before computing their bounds exactly (compose/joint.py)."""
    mu, cap = check_rates_capacities(rates, capacities)
    lam = _check_arrival_rate(arrival_rate)
    if np.any(np.diff(mu) > 0):
        raise SpecError("prefix_lower_bounds: rates must be given fastest first (non-increasing)")
    fast = np.cumsum(np.repeat(mu, cap))  # ν̄_n for n = 1..C
    ends = np.cumsum(cap)  # C_k
    log_phi = np.empty(fast.size + 1)
    log_phi[0] = 0.0
    np.cumsum(math.log(lam) - np.log(fast), out=log_phi[1:])
    shift = float(log_phi.max())
    w = np.exp(np.maximum(log_phi[:-1] - shift, _LOG_TINY))  # n = 0..C-1
    mass = np.cumsum(w)
    jobs = np.cumsum(np.arange(fast.size, dtype=float) * w)
    nu = fast[ends - 1]
    out = np.full(mu.size, math.inf)
    stable = nu > lam
    gap = nu[stable] - lam
    c_k = ends[stable]
    tail_mass = np.exp(np.minimum(log_phi[c_k] - shift, 0.0)) * nu[stable] / gap
    tail_jobs = tail_mass * (c_k + lam / gap)
    out[stable] = (jobs[c_k - 1] + tail_jobs) / (mass[c_k - 1] + tail_mass) / lam
    return out
