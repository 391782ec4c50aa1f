"""The JFFC mean response time a set of chains should expect at its design rate: exact where it is cheap, else a
seeded simulation with the project's own simulator; cached.

The Theorem 3.7 bounds bracket the mean, and at low load the lower bound is nearly the fastest chain's service
time even when JFFC must often use slower chains; where two candidate compositions' brackets overlap, this
estimate decides between them (compose/joint.py). Chains of equal rate are lumped (their slots are
interchangeable under JFFC), so one rate is Erlang C and two rates are the exact level recursion
(analysis/ctmc.py); more rates are simulated with exponential sizes (the model the bounds assume) on one fixed
seeded workload, so every candidate sees the same arrivals (common random numbers) and the result is
deterministic. The simulation is the chain simulator's own JFFC kernel (:mod:`petals_chain.kernels.chain_sim`,
the one ``sim.engine.simulate`` runs), called directly so that the analysis sits below the simulator and the
composer that uses this estimate. It averages waiting + 1/μ of the chain each job was given rather than the job's
drawn size / μ: JFFC assigns a job without looking at its size, so this has the same mean and a fraction of the
noise. With the default 40 000 jobs its standard deviation is about 0.3 % of the mean at load 0.5 and grows with
the load (about 3 % for three single-slot chains at 0.76). :class:`JffcMeans` gives the same numbers for many
chain sets at one λ with far fewer runs: a run answers every set that agrees with it on the chains it used.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from petals_chain import defaults
from petals_chain.analysis.bounds import _check_arrival_rate, check_rates_capacities
from petals_chain.analysis.ctmc import erlang_c_mean_response, exact_k2_mean_response
from petals_chain.kernels.chain_sim import central_kernel
from petals_chain.kernels.dispatch_rules import speed_order
from petals_chain.kernels.poisson import poisson_jobs
from petals_chain.model import SpecError

__all__ = ["ESTIMATORS", "JffcMeans", "MeanEstimate", "jffc_mean_estimate"]

ESTIMATORS = ("erlang-c", "exact-k2", "simulation", "unstable")
WARMUP_FRACTION = 0.1


@dataclass(frozen=True)
class MeanEstimate:
    """Estimated steady-state JFFC mean response time (s) and how it was obtained (one of ESTIMATORS)."""

    mean_s: float
    how: str


def _lumped(rates: np.ndarray, capacities: np.ndarray) -> tuple[tuple[float, ...], tuple[int, ...]]:
    """Distinct rates, fastest first, each with the summed capacity of its chains."""
    uniq, inverse = np.unique(rates, return_inverse=True)
    caps = np.bincount(inverse, weights=capacities).astype(np.int64)
    return tuple(uniq[::-1].tolist()), tuple(caps[::-1].tolist())


@lru_cache(maxsize=4)
def _unit_jobs(n_jobs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(arrival times, sizes): Poisson arrivals of rate 1 with Exp(1) sizes; scaled to any λ by dividing the times."""
    return poisson_jobs(1.0, n_jobs, np.random.default_rng(seed))


_NO_SERVICE_MATRIX = np.empty((0, 0), dtype=np.float64)  # sizes / μ_k give the service times


def _simulated(
    rates: tuple[float, ...], capacities: tuple[int, ...], arrival_rate: float, n_jobs: int, seed: int
) -> tuple[float, int]:
    """(mean of waiting + 1/μ_k over the jobs after warm-up, how many of the fastest chains any job used) of one
    seeded JFFC run at λ. The second says which other chain sets this run also answers (:class:`JffcMeans`)."""
    unit_arrival, size = _unit_jobs(n_jobs, seed)
    arrival = unit_arrival / arrival_rate
    mu = np.asarray(rates, dtype=np.float64)
    by_rank, _ = speed_order(rates)
    warm = int(WARMUP_FRACTION * n_jobs)
    start, _end, chain, _migrations, _area, _area_warm = central_kernel(
        arrival, size, _NO_SERVICE_MATRIX, False, mu, np.asarray(capacities, dtype=np.int64), by_rank, False, warm)
    waiting = start[warm:] - arrival[warm:]
    return float(np.mean(waiting + 1.0 / mu[chain[warm:]])), int(chain.max()) + 1


@lru_cache(maxsize=8192)
def _estimate(
    rates: tuple[float, ...], capacities: tuple[int, ...], arrival_rate: float, n_jobs: int, seed: int
) -> MeanEstimate:
    """jffc_mean_estimate on lumped, validated, hashable arguments."""
    if arrival_rate >= float(np.dot(rates, capacities)):
        return MeanEstimate(math.inf, "unstable")
    if len(rates) == 1:
        return MeanEstimate(erlang_c_mean_response(rates[0], capacities[0], arrival_rate), "erlang-c")
    if len(rates) == 2:
        return MeanEstimate(exact_k2_mean_response(rates, capacities, arrival_rate), "exact-k2")
    return MeanEstimate(_simulated(rates, capacities, arrival_rate, n_jobs, seed)[0], "simulation")


def jffc_mean_estimate(
    rates: Sequence[float],
    capacities: Sequence[int],
    arrival_rate: float,
    *,
    n_jobs: int = defaults.ESTIMATE_JOBS,
    seed: int = defaults.ESTIMATE_SEED,
) -> MeanEstimate:
    """JFFC mean response time of chains with rates μ_k and capacities c_k at Poisson rate λ (``inf`` if unstable).

    Exact for at most two distinct rates; otherwise one seeded simulation of ``n_jobs`` arrivals (same arrivals
    for every call with the same ``n_jobs`` and ``seed``)."""
    mu, cap = check_rates_capacities(rates, capacities)
    lam = _check_arrival_rate(arrival_rate)
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs < 100:
        raise SpecError(f"n_jobs = {n_jobs!r}: the simulated estimate needs an integer >= 100 jobs")
    lumped_rates, lumped_caps = _lumped(mu, cap)
    return _estimate(lumped_rates, lumped_caps, lam, n_jobs, int(seed))


class JffcMeans:
    """:func:`jffc_mean_estimate` for many chain sets at one λ, with one simulation answering many sets.

    The simulated estimate of a chain set depends only on its chains that some job used: if in the run of a set
    (lumped, fastest first) no job went past its first m chains, then every arrival found a free slot among
    them, and a set that agrees with it on those m (rates and capacities) and has anything slower after them
    sees, on the same arrivals, the very same assignments, waits and mean, bit for bit. The default composition
    asks for every prefix of a list of chains and most of them differ only in slow chains that the run never
    reaches (compose/joint.py), so each run is stored under the m chains it used and a later set is answered
    from any stored run whose used chains are its own first ones. Every answer equals
    ``jffc_mean_estimate(rates, capacities, arrival_rate, n_jobs=n_jobs, seed=seed)``."""

    def __init__(self, arrival_rate: float, *, n_jobs: int = defaults.ESTIMATE_JOBS,
                 seed: int = defaults.ESTIMATE_SEED) -> None:
        if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs < 100:
            raise SpecError(f"n_jobs = {n_jobs!r}: the simulated estimate needs an integer >= 100 jobs")
        self.arrival_rate = _check_arrival_rate(arrival_rate)
        self.n_jobs = n_jobs
        self.seed = int(seed)
        self._runs: dict[int, dict[tuple, float]] = {}  # m -> {(first m rates, their capacities): mean}
        self.simulations = 0  # runs made (the rest were answered from a stored run or exactly)

    def estimate(self, rates: Sequence[float], capacities: Sequence[int]) -> MeanEstimate:
        """The estimated JFFC mean of chains with rates μ_k and capacities c_k (see the class docstring)."""
        mu, cap = check_rates_capacities(rates, capacities)
        r, c = _lumped(mu, cap)
        lam = self.arrival_rate
        if lam >= float(np.dot(r, c)) or len(r) <= 2:
            return _estimate(r, c, lam, self.n_jobs, self.seed)
        for m in sorted(self._runs):
            if m > len(r):
                break
            mean = self._runs[m].get((r[:m], c[:m]))
            if mean is not None:
                return MeanEstimate(mean, "simulation")
        mean, used = _simulated(r, c, lam, self.n_jobs, self.seed)
        self.simulations += 1
        self._runs.setdefault(used, {})[(r[:used], c[:used])] = mean
        return MeanEstimate(mean, "simulation")
