"""Exact mean response time of JFFC: numeric CTMC (any K), level recursion (K = 2), Erlang C (K = 1).

These are the references that the Theorem 3.7 bounds (``bounds.py``) are checked
against. State of the JFFC chain: occupancy ``z_k ≤ c_k`` of every chain plus the
central queue length ``q``, which is nonzero only when every chain is full; an
arrival joins the fastest chain with a free slot, a departure from chain k takes
the queue head onto k.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.sparse.linalg

from petals_chain.analysis.bounds import _check_arrival_rate, check_rates_capacities
from petals_chain.model import SpecError

__all__ = [
    "DEFAULT_MAX_STATES",
    "K2Stationary",
    "ctmc_mean_response",
    "erlang_c_mean_response",
    "exact_k2_mean_response",
    "exact_k2_stationary",
    "queue_truncation",
]

DEFAULT_MAX_STATES = 200_000
"""Largest truncated state space ``ctmc_mean_response`` builds by default (sparse LU memory/time)."""


def _sorted_chains(rates: Sequence[float], capacities: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Validate and return (μ, c) sorted by rate, fastest first (JFFC's preference order)."""
    mu, cap = check_rates_capacities(rates, capacities)
    order = np.argsort(-mu, kind="stable")
    return mu[order], cap[order]


def queue_truncation(rho: float, total_slots: int, tol: float) -> int:
    """Smallest queue cap Q whose neglected tail (q > Q) weighs less than ``tol`` in the mean occupancy.

    Above Q the queue is a birth-death chain with ratio ρ, so the neglected part of
    E[N] relative to the mass at the all-full state is ≤ ρ^Q (C + Q + 1/(1-ρ)) / (1-ρ).
    """
    if not (0 < rho < 1):
        raise SpecError(f"rho = {rho!r}: the truncation needs 0 < rho < 1")
    if not (0 < tol < 1):
        raise SpecError(f"tol = {tol!r}: must be in (0, 1)")
    gap = 1.0 - rho
    log_rho = math.log(rho)
    q = max(1, math.ceil(math.log(tol * gap * gap) / log_rho))
    while q * log_rho + math.log(total_slots + q + 1.0 / gap) - math.log(gap) > math.log(tol):
        q += max(1, q // 8)
    return q


def ctmc_mean_response(
    rates: Sequence[float],
    capacities: Sequence[int],
    arrival_rate: float,
    tol: float = 1e-12,
    max_states: int = DEFAULT_MAX_STATES,
) -> float:
    """Mean JFFC response time (s) from the full CTMC, queue truncated where its tail is < ``tol``.

    States: every occupancy vector (Π(c_k+1) of them) plus queue lengths 1..Q. The
    generator is assembled with numpy, one balance equation is replaced by the
    normalisation, and ``scipy.sparse.linalg.spsolve`` gives π. Returns ``inf`` when
    λ ≥ ν; raises ``SpecError`` when the state space exceeds ``max_states``.
    """
    mu, cap = _sorted_chains(rates, capacities)
    lam = _check_arrival_rate(arrival_rate)
    nu = float(np.dot(mu, cap))
    if lam >= nu:
        return math.inf
    total_slots = int(cap.sum())
    q_max = queue_truncation(lam / nu, total_slots, tol)
    dims = tuple(int(c) + 1 for c in cap)
    n_occ = math.prod(dims)
    n_states = n_occ + q_max
    if n_states > max_states:
        raise SpecError(
            f"ctmc_mean_response: {n_states} states (Π(c_k+1) = {n_occ} occupancy states + {q_max} queue states)"
            f" exceed max_states = {max_states}; use exact_k2_mean_response (K = 2) or theorem37_bounds"
        )
    k_chains = mu.size
    idx = np.arange(n_occ)
    z = np.stack(np.unravel_index(idx, dims))  # (K, n_occ)
    strides = np.array([math.prod(dims[k + 1 :]) for k in range(k_chains)], dtype=np.int64)
    full = n_occ - 1  # every chain at capacity (last index in C order)

    src: list[np.ndarray] = []
    dst: list[np.ndarray] = []
    rate: list[np.ndarray] = []
    # Arrivals: fastest chain with a free slot, else the first queue state.
    free = z < cap[:, None]
    has_free = free.any(axis=0)
    first = np.argmax(free, axis=0)
    src.append(idx)
    dst.append(np.where(has_free, idx + strides[first], n_occ))
    rate.append(np.full(n_occ, lam))
    # Departures from chain k (no queue in these states, so the slot just frees up).
    for k in range(k_chains):
        busy = z[k] > 0
        src.append(idx[busy])
        dst.append(idx[busy] - strides[k])
        rate.append(z[k][busy] * mu[k])
    # Queue states q = 1..Q at indices n_occ + q - 1: births λ (below Q), deaths ν.
    qi = np.arange(q_max)
    src.append(n_occ + qi[:-1])
    dst.append(n_occ + qi[1:])
    rate.append(np.full(q_max - 1, lam))
    src.append(n_occ + qi)
    dst.append(np.where(qi == 0, full, n_occ + qi - 1))
    rate.append(np.full(q_max, nu))

    s = np.concatenate(src)
    d = np.concatenate(dst)
    r = np.concatenate(rate)
    out_rate = np.bincount(s, weights=r, minlength=n_states)
    # Balance π Q = 0, written as Qᵀ πᵀ = 0: row d gets +r at column s, row i gets -out_i at column i.
    rows = np.concatenate([d, np.arange(n_states)])
    cols = np.concatenate([s, np.arange(n_states)])
    vals = np.concatenate([r, -out_rate])
    keep = rows != 0  # equation 0 is replaced by Σ π = 1
    rows = np.concatenate([rows[keep], np.zeros(n_states, dtype=rows.dtype)])
    cols = np.concatenate([cols[keep], np.arange(n_states)])
    vals = np.concatenate([vals[keep], np.ones(n_states)])
    a = scipy.sparse.csc_matrix((vals, (rows, cols)), shape=(n_states, n_states))
    b = np.zeros(n_states)
    b[0] = 1.0
    pi = scipy.sparse.linalg.spsolve(a, b)
    jobs = np.concatenate([z.sum(axis=0), total_slots + qi + 1]).astype(float)
    mean_jobs = float(jobs @ pi) / float(pi.sum())
    return mean_jobs / lam


@dataclass(frozen=True)
class K2Stationary:
    """Stationary law of JFFC with two chains (chain 0 = the faster one).

    ``grid[z0, z1]`` is P(z0 jobs on the fast chain, z1 on the slow one, empty queue);
    ``queue_mass`` is P(q ≥ 1); ``mean_jobs`` is E[N] (queue included).
    """

    rates: tuple[float, float]
    capacities: tuple[int, int]
    grid: np.ndarray
    queue_mass: float
    mean_jobs: float


def _log_sum(logs: np.ndarray) -> float:
    """log Σ exp(logs), ignoring -inf entries."""
    top = float(np.max(logs))
    if top == -math.inf:
        return -math.inf
    return top + math.log(float(np.exp(logs - top).sum()))


def exact_k2_stationary(rates: Sequence[float], capacities: Sequence[int], arrival_rate: float) -> K2Stationary:
    """Exact stationary law of JFFC for K = 2 by a level recursion in O(c_fast · c_slow).

    Levels are the slow chain's occupancy b. Level b ≥ 1 is entered only at
    (c_fast, b) from (c_fast, b-1) (rate λ), so π on level b is λ π(c_fast, b-1) h_b,
    where h_b are expected times spent on level b per excursion above b-1. Going
    down from b = c_slow, h_b solves one tridiagonal system (the level's birth-death
    in the fast chain, killed at bμ_slow, whose jump from c_fast up and back re-enters
    with the return law g_{b+1} = (b+1)μ_slow h_{b+1}) — a rank-one correction closed in
    form. Level 0 follows from cut balances with positive terms only; the queue
    beyond the all-full state is geometric with ratio ρ. Scales are kept in logs.
    """
    mu, cap = _sorted_chains(rates, capacities)
    if mu.size != 2:
        raise SpecError(f"rates: exact_k2_* needs exactly 2 chains, got {mu.size}")
    lam = _check_arrival_rate(arrival_rate)
    mu_f, mu_s = float(mu[0]), float(mu[1])
    c_f, c_s = int(cap[0]), int(cap[1])
    nu = c_f * mu_f + c_s * mu_s
    if lam >= nu:
        raise SpecError(f"arrival_rate = {lam!r}: unstable, needs < total service rate {nu!r}")
    i = np.arange(c_f + 1, dtype=float)

    def level_tridiagonal(b: int, top: bool) -> np.ndarray:
        """Banded (transposed) form of T_b: diag λ+iμ_f+bμ_s, up -λ, down -iμ_f; top level drops λ at c_f."""
        ab = np.zeros((3, c_f + 1))
        diag = lam + i * mu_f + b * mu_s
        if top:
            diag[c_f] -= lam  # at the top level the jump to the queue returns to (c_f, c_s) itself
        ab[1] = diag
        # Tᵀ: super-diagonal of Tᵀ is T's sub-diagonal (-(i+1)μ_f), sub-diagonal of Tᵀ is T's super (-λ).
        ab[0, 1:] = -i[1:] * mu_f
        ab[2, :-1] = -lam
        return ab

    # h[b] for b = c_s .. 1 (expected times on level b per excursion entering at (c_f, b)).
    h: list[np.ndarray] = [np.empty(0)] * (c_s + 1)
    e_top = np.zeros(c_f + 1)
    e_top[c_f] = 1.0
    for b in range(c_s, 0, -1):
        ab = level_tridiagonal(b, top=(b == c_s))
        if b == c_s:
            h[b] = scipy.linalg.solve_banded((1, 1), ab, e_top)
            continue
        g = (b + 1) * mu_s * h[b + 1]
        g /= g.sum()  # the excursion above b returns surely; remove rounding drift
        uw = scipy.linalg.solve_banded((1, 1), ab, np.stack([e_top, g], axis=1))
        u, w = uw[:, 0], uw[:, 1]
        # h = u + λ h(c_f) w  and  1 - λ w(c_f) = bμ_s Σ w  (row sums of T_b are bμ_s + λ·[i = c_f]).
        h_top = u[c_f] / (b * mu_s * w.sum())
        h[b] = u + lam * h_top * w
    # Level 0 from cut balances between {≤ i} and {> i}, normalised to π(c_f, 0) = 1 (in logs):
    # λ x(i) = (i+1)μ_f x(i+1) + λ x(c_f) G(i), G = cumulative return law from level 1.
    g1 = mu_s * h[1]
    g1 /= g1.sum()
    cum_g = np.cumsum(g1)
    log_x0 = np.empty(c_f + 1)
    log_x0[c_f] = 0.0
    log_lam = math.log(lam)
    for k in range(c_f - 1, -1, -1):
        a_term = math.log((k + 1) * mu_f) + log_x0[k + 1]
        b_term = log_lam + math.log(cum_g[k]) if cum_g[k] > 0 else -math.inf
        log_x0[k] = np.logaddexp(a_term, b_term) - log_lam
    # Levels: log π(·, b) = log π(c_f, b-1) + log λ + log h_b.
    log_cols = np.empty((c_f + 1, c_s + 1))
    log_cols[:, 0] = log_x0
    with np.errstate(divide="ignore"):
        for b in range(1, c_s + 1):
            log_cols[:, b] = log_cols[c_f, b - 1] + log_lam + np.log(h[b])
    log_full = log_cols[c_f, c_s]
    gap = nu - lam
    rho = lam / nu
    log_q_mass = log_full + log_lam - math.log(gap)  # Σ_{q≥1} ρ^q = λ/(ν-λ)
    log_z = np.logaddexp(_log_sum(log_cols.ravel()), log_q_mass)
    grid = np.exp(log_cols - log_z)
    queue_mass = math.exp(log_q_mass - log_z)
    n_grid = i[:, None] + np.arange(c_s + 1, dtype=float)[None, :]
    # Σ_{q≥1} (C+q) ρ^q = Cρ/(1-ρ) + ρ/(1-ρ)²
    tail_jobs = math.exp(log_full - log_z) * ((c_f + c_s) * lam / gap + rho / (1.0 - rho) ** 2)
    mean_jobs = float((n_grid * grid).sum()) + tail_jobs
    return K2Stationary((mu_f, mu_s), (c_f, c_s), grid, queue_mass, mean_jobs)


def exact_k2_mean_response(rates: Sequence[float], capacities: Sequence[int], arrival_rate: float) -> float:
    """Exact JFFC mean response time (s) for two chains (Appendix A.3 analysis); ``inf`` if unstable."""
    mu, cap = check_rates_capacities(rates, capacities)
    lam = _check_arrival_rate(arrival_rate)
    if lam >= float(np.dot(mu, cap)):
        return math.inf
    return exact_k2_stationary(mu, cap, lam).mean_jobs / lam


def erlang_c_mean_response(rate: float, servers: int, arrival_rate: float) -> float:
    """M/M/c mean response time (s): 1/μ + C(c, λ/μ) / (cμ - λ); ``inf`` if λ ≥ cμ.

    Erlang B by its stable recursion B_n = aB_{n-1}/(n + aB_{n-1}), then C from B.
    """
    mu = float(rate)
    if not (math.isfinite(mu) and mu > 0):
        raise SpecError(f"rate = {rate!r}: a service rate must be finite and > 0")
    if isinstance(servers, bool) or not float(servers).is_integer() or servers < 1:
        raise SpecError(f"servers = {servers!r}: must be an integer >= 1")
    c = int(servers)
    lam = _check_arrival_rate(arrival_rate)
    if lam >= c * mu:
        return math.inf
    a = lam / mu
    erlang_b = 1.0
    for n in range(1, c + 1):
        erlang_b = a * erlang_b / (n + a * erlang_b)
    erlang_c = c * erlang_b / (c - a * (1.0 - erlang_b))
    return 1.0 / mu + erlang_c / (c * mu - lam)
