"""Sessions that share a server slow each other: closed-network time per job and the slots worth offering.

The paper's service model, and with it GBP-CR's and GCA's capacities, let a chain's c_k sessions run side by
side, each in T_k. A real server's step takes longer when it computes more sessions' steps: g_j(b) times one
session's step with b sessions batched (``ServerSpec.step_factor``: measured τp(b)/τp(1), or 1 + σ(b − 1) from a
serial fraction σ; PETALS' own task pool, one session at a time, is σ = 1). Each hop of a chain is then a
load-dependent station with demand D_j = τp_j·m_j per job: with i sessions at it, each progresses at
1/(D_j·g_j(i)). Its throughput saturates at 1/(D_j·g_j^∞) (g_j^∞ the marginal step factor), so beyond that slots
only stretch every session. :func:`cap_chains` keeps each chain's slots at the knee of the closed network's
asymptotic bounds (n* = T_k / (D_j·g_j^∞) at its busiest server, less what chains taken before it use there) and
gives it the time per job that exact load-dependent mean value analysis (MVA) predicts at that many sessions;
:func:`fit_serial_fraction` finds σ from a closed-loop probe, :func:`probe_throughput` predicts one.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from scipy.optimize import brentq

from petals_chain.model import Chain, ServerSpec, SpecError

_TOL = 1e-9
_MIN_RATE = 1e-12  # a slot that adds nothing (or a measured curve that dips) still counts as a slot


Factor = Callable[[int], float]


def _queue(i: int) -> float:
    """g(i) = i: a station that serves one session at a time (FCFS or processor sharing)."""
    return float(i)


def closed_chain_curve(demands_s: Sequence[float], delay_s: float, sessions: int,
                       factors: Sequence[Factor] | None = None) -> list[float]:
    """Jobs per second of the closed network of :func:`closed_chain` with n = 1..``sessions`` jobs in it (one pass
    of the recursion gives every population)."""
    if sessions < 1:
        raise SpecError(f"closed_chain: sessions must be >= 1, got {sessions}")
    factors = list(factors) if factors is not None else [_queue] * len(demands_s)
    if len(factors) != len(demands_s):
        raise SpecError(f"closed_chain: {len(factors)} step factors for {len(demands_s)} stations")
    g = [[f(i) for i in range(1, sessions + 1)] for f in factors]  # g[j][i-1]
    marg = [[1.0] for _ in demands_s]  # marg[j][i]: P(i jobs at station j) with n − 1 jobs in the network
    out = []
    for n in range(1, sessions + 1):
        times = [d * sum(g[j][i - 1] * marg[j][i - 1] for i in range(1, n + 1)) for j, d in enumerate(demands_s)]
        thr = n / (delay_s + sum(times))
        out.append(thr)
        for j, d in enumerate(demands_s):
            busy = [thr * d * g[j][i - 1] / i * marg[j][i - 1] for i in range(1, n + 1)]
            marg[j] = [max(0.0, 1.0 - sum(busy)), *busy]
    return out


def closed_chain(demands_s: Sequence[float], delay_s: float, sessions: int,
                 factors: Sequence[Factor] | None = None) -> tuple[float, float]:
    """Exact single-class MVA with load-dependent stations: ``sessions`` jobs cycling through one station per demand
    (seconds of service per job for one session alone) and a delay of ``delay_s``; returns (jobs per second,
    seconds per job). With i jobs at station j each progresses at 1/(D_j·g_j(i)), ``factors[j]`` = g_j; without
    factors every station serves one job at a time (g(i) = i, the plain MVA recursion)."""
    thr = closed_chain_curve(demands_s, delay_s, sessions, factors)[-1]
    return thr, sessions / thr


def _stations(chain: Chain, servers: Sequence[ServerSpec]) -> list[tuple[int, float]]:
    """(server, seconds of its compute per job) for every hop of the chain whose server's sessions slow each other."""
    return [(j, servers[j].tau_p_s * m) for j, m in zip(chain.servers, chain.blocks)
            if m > 0 and servers[j].contended]


def any_serial(servers: Sequence[ServerSpec]) -> bool:
    """Whether any server's sessions slow each other; if none, the paper's model holds."""
    return any(s.contended for s in servers)


def chain_rates(chain: Chain, servers: Sequence[ServerSpec], sessions: int) -> list[float]:
    """Jobs per second of ``chain`` (its paper-model T_k as built, before any cap) with n = 1..``sessions`` jobs
    in it, its servers' step factors applied (MVA); n/T_k where none of its servers is contended."""
    stations = _stations(chain, servers)
    if not stations:
        return [n / chain.service_time_s for n in range(1, sessions + 1)]
    compute = sum(d for _, d in stations)
    return list(_station_curve(tuple((d, servers[j]) for j, d in stations), chain.service_time_s - compute, sessions))


@functools.lru_cache(maxsize=4096)
def _station_curve(stations: tuple[tuple[float, ServerSpec], ...], delay_s: float,
                   sessions: int) -> tuple[float, ...]:
    """:func:`closed_chain_curve` for (demand, server) stations, remembered: the default composition caps the same
    chains again for every candidate prefix and every c (ServerSpec is frozen, so equal stations give equal
    curves)."""
    return tuple(closed_chain_curve([d for d, _ in stations], delay_s, sessions, [s.step_factor for _, s in stations]))


def chain_time(chain: Chain, servers: Sequence[ServerSpec], sessions: int) -> float:
    """Seconds per job of ``chain`` (as built, before any cap) with ``sessions`` jobs in it (MVA)."""
    return sessions / chain_rates(chain, servers, sessions)[-1]


def _capped(chains: Sequence[Chain], servers: Sequence[ServerSpec]) -> list[tuple[Chain, int]]:
    """(chain as built, slots kept) for every chain left at least one slot: each chain (in the given order, fastest
    first) keeps its slots up to the knee of what its servers have left once saturated."""
    left = [1.0] * len(servers)  # share of each server's saturated throughput not yet promised to an earlier chain
    out = []
    for ch in chains:
        stations = [(j, d * servers[j].marginal_step_factor) for j, d in _stations(ch, servers)]
        stations = [(j, d) for j, d in stations if d > 0]
        if not stations:
            out.append((ch, ch.capacity))
            continue
        knee = min(left[j] * ch.service_time_s / d for j, d in stations)
        slots = min(ch.capacity, math.ceil(knee - _TOL))
        if slots < 1:
            continue
        for j, d in stations:
            left[j] -= slots * d / ch.service_time_s
        out.append((ch, slots))
    return out


def cap_chains(chains: Sequence[Chain], servers: Sequence[ServerSpec]) -> tuple[Chain, ...]:
    """Each chain (in the given order, fastest first) with its slots cut to the knee of what its servers have left
    once saturated, its time per job the MVA time at that many sessions, and its ``load_rates`` (jobs per second
    with 1..c_k sessions in it, MVA); a chain left no slot is dropped. Unchanged where no server's sessions slow
    each other."""
    if not any_serial(servers):
        return tuple(chains)
    out = []
    for ch, slots in _capped(chains, servers):
        curve = tuple(chain_rates(ch, servers, slots))
        out.append(replace(ch, capacity=slots, service_time_s=slots / curve[-1], load_rates=curve))
    return tuple(out)


def bound_rates(chains: Sequence[Chain]) -> tuple[list[float], list[int]]:
    """The (rates, capacities) the Theorem 3.7 bounds take for ``chains``: each chain's μ_k with its c_k slots in the
    paper's model; for a chain with ``load_rates``, one entry per slot, the i-th adding r_k(i) − r_k(i−1) jobs per
    second. A chain's rate with n jobs is the sum of its first n slots, so the n fastest slots still bound what n
    jobs can do from above, and the n slowest from below. Each chain is taken alone: sessions of other chains on a
    shared server are not counted (:func:`cap_chains` already keeps the chains' total within each server's
    saturated throughput)."""
    rates: list[float] = []
    caps: list[int] = []
    for ch in chains:
        if not ch.load_rates:
            rates.append(ch.rate_per_s)
            caps.append(ch.capacity)
            continue
        before = 0.0
        for rate in ch.load_rates:
            rates.append(max(rate - before, _MIN_RATE))
            caps.append(1)
            before = rate
    return rates, caps


def probe_throughput(servers: Sequence[ServerSpec], sessions: Sequence[int], num_blocks: int,
                     serial_fraction: float | None = None) -> float:
    """Jobs per second of closed-loop whole-model jobs, ``sessions[j]`` at a time on server j (each its own chain),
    with each server's own step factors, or, given ``serial_fraction``, as if every server had that σ."""
    total = 0.0
    for s, n in zip(servers, sessions):
        if n > 0:
            if serial_fraction is not None:
                s = replace(s, serial_fraction=serial_fraction, batch_slowdown=())
            d = s.tau_p_s * num_blocks
            total += closed_chain([d], s.tau_c_s, n, [s.step_factor])[0]
    return total


def fit_serial_fraction(servers: Sequence[ServerSpec], sessions: Sequence[int], num_blocks: int,
                        measured_jobs_per_s: float) -> float:
    """The σ in [0, 1] whose predicted probe throughput equals the measured one (Brent's method; throughput falls as
    σ grows). Clipped: 0 if the probe beat even the paper's model, 1 if it fell short of full serialisation (then
    something beyond one server's queue, e.g. cores the servers share, slows them too)."""
    if not (math.isfinite(measured_jobs_per_s) and measured_jobs_per_s > 0):
        raise SpecError(f"fit_serial_fraction: measured throughput must be a number > 0, got {measured_jobs_per_s!r}")
    if measured_jobs_per_s >= probe_throughput(servers, sessions, num_blocks, 0.0):
        return 0.0
    if measured_jobs_per_s <= probe_throughput(servers, sessions, num_blocks, 1.0):
        return 1.0
    return float(brentq(lambda sigma: probe_throughput(servers, sessions, num_blocks, sigma) - measured_jobs_per_s,
                        0.0, 1.0, xtol=1e-12))
