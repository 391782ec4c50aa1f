"""Sessions that share a server slow each other: the part of τp a server computes one session at a time.

The paper's service model, and with it GBP-CR's and GCA's capacities, let a chain's c_k sessions run side by
side, each in T_k. A PETALS server's task pool does not batch inference steps of different sessions: it runs
them one after another, so a server j whose serial fraction is σ_j is busy σ_j·τp_j·m_j per job, and every
chain through it together cannot finish more than 1/(σ_j·τp_j·m_j) jobs per second, whatever its slots.
Beyond that, slots only stretch every session. :func:`cap_chains` keeps each chain's slots at the knee of the
closed network's asymptotic bounds (n* = T_k / D_k, D_k the serial time per job of its busiest server, less
what chains taken before it use there) and gives it the time per job that exact mean value analysis (MVA)
predicts at that many sessions; :func:`fit_serial_fraction` finds σ from a closed-loop probe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from scipy.optimize import brentq

from petals_chain.model import Chain, ServerSpec, SpecError

_TOL = 1e-9


def closed_chain(demands_s: Sequence[float], delay_s: float, sessions: int) -> tuple[float, float]:
    """Exact single-class MVA: ``sessions`` jobs cycling through one queue per demand (FCFS/PS servers, seconds of
    busy time per job) and a delay of ``delay_s``; returns (jobs per second, seconds per job)."""
    if sessions < 1:
        raise SpecError(f"closed_chain: sessions must be >= 1, got {sessions}")
    queue = [0.0] * len(demands_s)
    for n in range(1, sessions + 1):
        times = [d * (1.0 + q) for d, q in zip(demands_s, queue)]
        resp = delay_s + sum(times)
        thr = n / resp
        queue = [thr * t for t in times]
    return thr, resp


def _demands(chain: Chain, servers: Sequence[ServerSpec]) -> list[tuple[int, float]]:
    """(server, serial seconds per job) for every hop of the chain whose server computes sessions one at a time."""
    return [(j, servers[j].serial_fraction * servers[j].tau_p_s * m)
            for j, m in zip(chain.servers, chain.blocks) if m > 0 and servers[j].serial_fraction > 0]


def any_serial(servers: Sequence[ServerSpec]) -> bool:
    """Whether any server computes (part of) its sessions one at a time; if none, the paper's model holds."""
    return any(s.serial_fraction > 0 for s in servers)


def cap_chains(chains: Sequence[Chain], servers: Sequence[ServerSpec]) -> tuple[Chain, ...]:
    """Each chain (in the given order, fastest first) with its slots cut to the knee of what its serial servers have
    left, and its time per job the MVA time at that many sessions; a chain left no slot is dropped.
    Unchanged where no server is serial."""
    if not any_serial(servers):
        return tuple(chains)
    left = [1.0] * len(servers)  # share of each server's serial time not yet promised to an earlier chain
    out = []
    for ch in chains:
        demands = _demands(ch, servers)
        if not demands:
            out.append(ch)
            continue
        knee = min(left[j] * ch.service_time_s / d for j, d in demands)
        slots = min(ch.capacity, math.ceil(knee - _TOL))
        if slots < 1:
            continue
        for j, d in demands:
            left[j] -= slots * d / ch.service_time_s
        serial = sum(d for _, d in demands)
        _, per_job = closed_chain([d for _, d in demands], ch.service_time_s - serial, slots)
        out.append(replace(ch, capacity=slots, service_time_s=per_job))
    return tuple(out)


def probe_throughput(servers: Sequence[ServerSpec], sessions: Sequence[int], num_blocks: int,
                     serial_fraction: float) -> float:
    """Jobs per second of closed-loop whole-model jobs, ``sessions[j]`` at a time on server j (each its own chain),
    if every server's serial fraction were ``serial_fraction``."""
    total = 0.0
    for s, n in zip(servers, sessions):
        if n > 0:
            d = serial_fraction * s.tau_p_s * num_blocks
            total += closed_chain([d], s.tau_c_s + s.tau_p_s * num_blocks - d, n)[0]
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
