"""Server-level simulation of systems that route every request over the placement graph: PETALS and BPRR.

Unlike :mod:`petals_chain.sim.engine` (fixed chains with capacities), these
systems pick a path per request in the feasible-edge DAG of a placement
(docs/model.md, "Placement and chains": a hop at server j covers blocks p .. a_j+m_j-1, m_ij = a_j+m_j-p),
and the only shared resource is each server's cache: M̃_j slots (eq. 3); a job
on a path holds m_ij slots at every hop j for its whole service (memory eq. 1).
Service time = job size (Exp(1)) × Σ_hops (τc_j + τp_j m_ij), the paper's model.

What is modelled, exactly:

PETALS (:func:`simulate_petals`), after ``petals/client/routing/sequence_manager.py``
and ``petals/client/inference_session.py`` (petals 2.2):
  * on arrival and on every retry the client runs Dijkstra (min-latency) with
    edge cost τc_j + τp_j·m_ij, plus ``alloc_delay`` (10 s) when server j has
    fewer free slots than its whole span m_j (PETALS' pessimistic
    ``_has_cache_for`` checks the whole span, not the blocks actually used);
  * the client sees every server's free cache exactly and instantly (no DHT
    staleness); edges whose m_ij exceeds M̃_j (never feasible) are left out;
  * if every hop of the chosen path has m_ij free slots the session starts and
    allocates them atomically; otherwise the attempt fails at no time cost
    (servers answer ``AllocationFailed`` at once: the client sends no
    ``alloc_timeout``), and after the k-th failure the client sleeps
    min(1 s · 2^(k-1), 60 s) — 1, 2, 4, … 32, 60, 60 … s — and routes again.
    PETALS' 0 s retry right after the first failure is omitted: with exact
    state it would see the same servers at the same instant and fail again;
  * there is no central queue: a departure wakes nobody, waiting sessions only
    notice free cache at their next retry.

BPRR WS-RR (:func:`simulate_bprr`), after Sun et al. (Performance Evaluation 2025); the policy itself
(routing decision, believed calendar, commit FIFO, start rule, learning) is
:mod:`petals_chain.dispatch.ws_rr`, which the live orchestrator's
:class:`~petals_chain.orchestrator.leasing.ws_rr.WsRrLeaseManager` drives too:
  * each server's M̃_j slots form a calendar: slot q is believed free from time F_jq on;
  * per request, on arrival, Dijkstra with edge cost w_j(m_ij) + τc_j + τp_j·m_ij,
    where w_j(m) = (m-th smallest F_jq − now)⁺ is the wait until m slots free at j;
  * the request is committed to that path at once, believed to start at
    S = max(now, max over hops of the m_ij-th smallest F_jq), when every hop has
    its cache; at each hop it reserves the m_ij slots with the latest F_jq ≤ S (best
    fit) and sets them to its believed end. Committed slots are never lent to later
    requests in the meantime (no backfilling).
  * ``estimate="mean"`` (the default of the fig8 ``bprr`` method, and what the
    live orchestrator runs): the scheduler believes every job has the mean size
    (it learns real starts and ends as they happen), and a committed request
    really starts when it heads the FIFO of committed requests at each of its
    servers and each has its m_ij slots free (:class:`~petals_chain.dispatch.ws_rr.WsRr`);
  * ``estimate="exact"`` (the oracle, simulator only): the scheduler knows every
    job's size, so the calendar is exact and every job starts at its S, taking the
    reserved slots; the most favourable reading for BPRR. It shares WS-RR's
    routing decision and best fit and runs as one numba loop.

Both simulators record the same per-job records as the chain engine
(:data:`~petals_chain.sim.engine.RECORD_DTYPE`; ``chain`` is the index of the
job's route in :attr:`SystemResult.routes`), check Little's law, and check the
cache of every server from the records (a sweep over all jobs' hop intervals):
a run that over-commits any server raises :class:`SimulationError`.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from petals_chain.compose.routes import Route, RouteGraph
from petals_chain.dispatch.ws_rr import WsRr, best_fit_slots, ws_rr_route
from petals_chain.model import InfeasibleError
from petals_chain.sim.engine import LITTLE_RTOL, SimResult, SimulationError, build_records
from petals_chain.sim.workloads import Workload

try:  # the per-request route search runs thousands of times per run: numba makes it ~50x faster
    from numba import njit as _njit
except ImportError:  # pragma: no cover - exercised only where numba is missing
    _njit = None

ALLOC_DELAY_S = 10.0  # PETALS' routing penalty for a span lacking free cache
MIN_BACKOFF_S = 1.0  # PETALS ClientConfig.min_backoff
MAX_BACKOFF_S = 60.0  # PETALS ClientConfig.max_backoff

__all__ = ["BPRR_ESTIMATES", "Route", "RouteGraph", "SystemResult", "backoff_s", "cache_use_peaks", "simulate_bprr",
           "simulate_petals"]


def _bprr_exact_loop(arrival, size, first, end, tau_c, tau_p, slots, order, starts, num_blocks, free_at,
                     start_out, end_out, hop_servers, hop_blocks, num_hops):
    """BPRR WS-RR told every job's size, over all arrivals; returns -1 on success, else the unroutable job.

    ``free_at[j]`` is local server j's calendar, kept sorted; the routing decision and the best fit are WS-RR's
    own (:func:`~petals_chain.dispatch.ws_rr.ws_rr_route`, :func:`~petals_chain.dispatch.ws_rr.best_fit_slots`),
    and every job starts at its calendar start S, which is exact here.
    """
    n = arrival.shape[0]
    L1 = num_blocks + 1
    dist = np.empty(L1 + 1, dtype=np.float64)
    best_server = np.empty(L1 + 1, dtype=np.int64)
    best_prev = np.empty(L1 + 1, dtype=np.int64)
    penalty = np.zeros(first.shape[0], dtype=np.float64)
    hs = np.empty(hop_servers.shape[1], dtype=np.int64)
    hb = np.empty(hop_servers.shape[1], dtype=np.int64)
    pick = np.empty(free_at.shape[1], dtype=np.int64)
    for i in range(n):
        hops, s, t_path = ws_rr_route(first, end, tau_c, tau_p, slots, order, starts, num_blocks, penalty, free_at,
                                      arrival[i], dist, best_server, best_prev, hs, hb)
        if hops == 0:
            return i
        e_time = s + size[i] * t_path
        for h in range(hops):
            j = hs[h]
            m = hb[h]
            k = slots[j]
            best_fit_slots(free_at[j], k, s, m, pick)
            for x in range(m):
                free_at[j, pick[x]] = e_time
            free_at[j, :k] = np.sort(free_at[j, :k])
            hop_servers[i, h] = j
            hop_blocks[i, h] = m
        num_hops[i] = hops
        start_out[i] = s
        end_out[i] = e_time
    return -1


if _njit is not None:
    _bprr_exact_loop_fast = _njit(cache=True)(_bprr_exact_loop)
else:  # pragma: no cover
    _bprr_exact_loop_fast = _bprr_exact_loop


@dataclass(frozen=True)
class SystemResult(SimResult):
    """A :class:`SimResult` plus what routing systems add: the routes used, retries, and cache peaks."""

    routes: tuple[Route, ...] = ()
    attempts: np.ndarray | None = None  # failed attempts of each kept job (PETALS; zeros for BPRR)
    slots: tuple[int, ...] = ()
    peak_slots_used: tuple[int, ...] = ()  # over all jobs, warm-up included
    start_order: np.ndarray | None = None  # every job (warm-up included) in the order it started (BPRR-mean)

    def summary(self) -> dict[str, float | int | str]:
        """The chain engine's summary plus retry counts."""
        out = super().summary()
        att = self.attempts if self.attempts is not None else np.zeros(0)
        out["mean_failed_attempts"] = float(att.mean()) if att.size else 0.0
        out["routes_used"] = len(self.routes)
        return out


def cache_use_peaks(start_s: np.ndarray, end_s: np.ndarray, job_routes: Sequence[Route],
                    num_servers: int) -> np.ndarray:
    """Peak slots held at each server over time, from job intervals [start, end) and routes (ends free first)."""
    srv, t, delta = [], [], []
    for s, e, r in zip(start_s.tolist(), end_s.tolist(), job_routes):
        for j, m in r:
            srv += [j, j]
            t += [s, e]
            delta += [m, -m]
    peaks = np.zeros(num_servers, dtype=np.int64)
    if not srv:
        return peaks
    srv_a, t_a, d_a = np.array(srv), np.array(t), np.array(delta)
    o = np.lexsort((d_a, t_a, srv_a))  # by server, then time, releases (negative) before takes
    run = np.cumsum(d_a[o])  # each server's deltas sum to 0, so the global sum restarts per server
    np.maximum.at(peaks, srv_a[o], run)
    return peaks


def _time_integral(arrival: np.ndarray, end: np.ndarray, t0: float) -> float:
    """∫_{t0}^{∞} N(t) dt by a sweep over arrival (+1) and departure (−1) events."""
    times = np.concatenate([arrival, end])
    delta = np.concatenate([np.ones(arrival.size), -np.ones(end.size)])
    o = np.lexsort((delta, times))
    times, n_after = times[o], np.cumsum(delta[o])
    lo = np.maximum(times[:-1], t0)
    return float(np.sum(n_after[:-1] * np.clip(times[1:] - lo, 0.0, None)))


def _assemble(name: str, graph: RouteGraph, workload: Workload, start: np.ndarray, end: np.ndarray,
              job_routes: list[Route], attempts: np.ndarray, area_total: float, warmup_jobs: int) -> SystemResult:
    """Records in the chain engine's dtype; checks every job finished, Little's law and every server's cache."""
    unfinished = np.flatnonzero(~np.isfinite(end))
    if unfinished.size:
        raise SimulationError(f"{name}: {unfinished.size} job(s) never finished (first: job {unfinished[0]})")
    arrival = workload.arrival_s
    response = end - arrival
    response_sum = float(response.sum())
    if abs(area_total - response_sum) > LITTLE_RTOL * max(response_sum, 1.0):
        raise SimulationError(f"{name}: Little's law broken: ∫N dt = {area_total!r} but Σ response = {response_sum!r}")
    peaks = cache_use_peaks(start, end, job_routes, len(graph.servers))
    over = np.flatnonzero(peaks > graph.slots)
    if over.size:
        j = int(over[0])
        raise SimulationError(f"{name}: server {graph.servers[j].name!r} held {int(peaks[j])} cache slots of "
                              f"{int(graph.slots[j])}")
    route_id: dict[Route, int] = {}
    ids = np.array([route_id.setdefault(r, len(route_id)) for r in job_routes], dtype=np.int32)
    keep = slice(warmup_jobs, None)
    rec = build_records(arrival, start, end, ids, 0, warmup_jobs)
    t_w = float(arrival[warmup_jobs])
    area_w = _time_integral(arrival, end, t_w)
    return SystemResult(name, "system", rec, workload.n_jobs, warmup_jobs, float(area_total), response_sum, t_w,
                        float(end.max()), area_w, routes=tuple(route_id), attempts=attempts[keep].copy(),
                        slots=tuple(int(x) for x in graph.slots), peak_slots_used=tuple(int(x) for x in peaks))


def _check_inputs(workload: Workload, warmup_jobs: int) -> None:
    """Raise ValueError for an empty workload or a warm-up outside [0, n)."""
    if workload.n_jobs < 1:
        raise ValueError("system simulation: the workload has no jobs")
    if not 0 <= warmup_jobs < workload.n_jobs:
        raise ValueError(f"system simulation: warmup_jobs must be in [0, {workload.n_jobs}), got {warmup_jobs}")
    if workload.service_s is not None:
        raise ValueError("system simulation: per-chain service-time matrices do not apply to routed systems; "
                         "give job sizes")


def backoff_s(failures: int, min_backoff_s: float = MIN_BACKOFF_S, max_backoff_s: float = MAX_BACKOFF_S) -> float:
    """PETALS' sleep after the k-th failed attempt: min(min_backoff · 2^(k−1), max_backoff)."""
    if failures < 1:
        raise ValueError(f"backoff: failures must be >= 1, got {failures}")
    return min(min_backoff_s * 2.0 ** (failures - 1), max_backoff_s)


def simulate_petals(graph: RouteGraph, workload: Workload, warmup_jobs: int = 0, *,
                    alloc_delay_s: float = ALLOC_DELAY_S, min_backoff_s: float = MIN_BACKOFF_S,
                    max_backoff_s: float = MAX_BACKOFF_S) -> SystemResult:
    """PETALS: per-attempt min-latency routing with the alloc penalty, start if cached everywhere, else back off."""
    _check_inputs(workload, warmup_jobs)
    n = workload.n_jobs
    arrival = workload.arrival_s.tolist()
    size = workload.size.tolist()
    free = graph.local_slots.copy()
    local_of = {int(j): k for k, j in enumerate(graph.index)}
    span = graph.span
    start = np.full(n, math.nan)
    end = np.full(n, math.nan)
    routes: list[Route | None] = [None] * n
    failures = np.zeros(n, dtype=np.int64)
    heap: list[tuple[float, int, int, int]] = []  # (time, kind 0 departure / 2 retry, seq, job)
    seq = 0
    i = 0
    in_sys = 0
    area = 0.0
    t_last = 0.0
    while i < n or heap:
        if heap and (i >= n or (heap[0][0], heap[0][1]) < (arrival[i], 1)):
            t, kind, _, job = heapq.heappop(heap)
        else:
            t, kind, job = arrival[i], 1, i
            i += 1
        if kind != 2:
            area += in_sys * (t - t_last)
            t_last = t
        if kind == 0:  # departure: release the cache at every hop
            in_sys -= 1
            for j, m in routes[job]:
                free[local_of[j]] += m
            continue
        if kind == 1:
            in_sys += 1
        penalty = np.where(free < span, alloc_delay_s, 0.0)
        route = graph.route(penalty)
        if route is None:
            raise InfeasibleError(f"PETALS: no route through the placement fits job {job}")
        if all(free[local_of[j]] >= m for j, m in route):
            for j, m in route:
                free[local_of[j]] -= m
                if free[local_of[j]] < 0:  # cannot happen: checked above; kept as the per-event invariant
                    raise SimulationError(f"PETALS: server {graph.servers[j].name!r} over-committed at t={t}")
            routes[job] = route
            start[job] = t
            end[job] = t_end = t + size[job] * graph.route_time_s(route)
            heapq.heappush(heap, (t_end, 0, seq, job))
        else:
            failures[job] += 1
            heapq.heappush(heap, (t + backoff_s(int(failures[job]), min_backoff_s, max_backoff_s), 2, seq, job))
        seq += 1
    return _assemble("PETALS", graph, workload, start, end, routes, failures, area, warmup_jobs)


BPRR_ESTIMATES = ("exact", "mean")


def simulate_bprr(graph: RouteGraph, workload: Workload, warmup_jobs: int = 0, *,
                  estimate: str = "exact") -> SystemResult:
    """BPRR WS-RR: per-request Dijkstra with cache-wait edge costs, committed at arrival (see module docstring).

    ``estimate="exact"``: the scheduler knows every job's size (calendar model);
    ``"mean"``: it knows starts and completions but assumes every job has the mean
    size (:func:`_simulate_bprr_mean`, driving :class:`~petals_chain.dispatch.ws_rr.WsRr`).
    """
    _check_inputs(workload, warmup_jobs)
    if estimate not in BPRR_ESTIMATES:
        raise ValueError(f"simulate_bprr: estimate must be one of {BPRR_ESTIMATES}, got {estimate!r}")
    if estimate == "mean":
        return _simulate_bprr_mean(graph, workload, warmup_jobs)
    n = workload.n_jobs
    k = graph.index.size
    width = int(max(graph.local_slots.max(initial=0), 1))
    free_at = np.full((k, width), np.inf)
    for q in range(k):
        free_at[q, : graph.local_slots[q]] = 0.0
    start = np.full(n, math.nan)
    end = np.full(n, math.nan)
    hop_s = np.full((n, graph.max_hops), -1, dtype=np.int64)
    hop_b = np.zeros((n, graph.max_hops), dtype=np.int64)
    num_hops = np.zeros(n, dtype=np.int64)
    bad = _bprr_exact_loop_fast(workload.arrival_s, workload.size, graph.first, graph.end, graph.tau_c,
                                graph.tau_p, graph.local_slots, graph.order, graph.starts, graph.model.num_blocks,
                                free_at, start, end, hop_s, hop_b, num_hops)
    if bad >= 0:
        raise InfeasibleError(f"BPRR: no route through the placement fits job {bad}")
    idx = graph.index.tolist()
    hs, hb, nh = hop_s.tolist(), hop_b.tolist(), num_hops.tolist()
    routes = [tuple((idx[hs[r][h]], hb[r][h]) for h in range(nh[r])) for r in range(n)]
    area = _time_integral(workload.arrival_s, end, 0.0)
    return _assemble("BPRR", graph, workload, start, end, routes, np.zeros(n, dtype=np.int64), area, warmup_jobs)


def _simulate_bprr_mean(graph: RouteGraph, workload: Workload, warmup_jobs: int) -> SystemResult:
    """WS-RR when sizes are unknown: the :class:`~petals_chain.dispatch.ws_rr.WsRr` policy, driven by events.

    The policy routes and commits each arrival and says who starts at each arrival and departure (its
    believed calendar, commit FIFO and start rule); the simulator only keeps time: a job that starts at t
    ends at t + size × T_route. A departure at the same instant as an arrival is processed first, and
    departures at one instant in start order.
    """
    n = workload.n_jobs
    arrival = workload.arrival_s.tolist()
    size = workload.size.tolist()
    policy = WsRr(graph)
    start = np.full(n, math.nan)
    end = np.full(n, math.nan)
    routes: list[Route] = [()] * n
    order: list[int] = []  # jobs in start order
    heap: list[tuple[float, int, int]] = []  # (end time, seq, job)
    seq, i, in_sys, area, t_last = 0, 0, 0, 0.0, 0.0
    while i < n or heap:
        if heap and (i >= n or heap[0][0] <= arrival[i]):
            t, _, job = heapq.heappop(heap)
            area += in_sys * (t - t_last)
            t_last = t
            in_sys -= 1
            started = policy.on_departure(job, t)
        else:
            t, job = arrival[i], i
            i += 1
            area += in_sys * (t - t_last)
            t_last = t
            in_sys += 1
            try:
                started = policy.on_arrival(job, t)
            except InfeasibleError:
                raise InfeasibleError(f"BPRR: no route through the placement fits job {job}") from None
        for j in started:
            start[j] = t
            end[j] = t_end = t + size[j] * policy.route_time_s(j)
            routes[j] = policy.route(j)
            order.append(j)
            heapq.heappush(heap, (t_end, seq, j))
            seq += 1
    res = _assemble("BPRR-mean", graph, workload, start, end, routes, np.zeros(n, dtype=np.int64), area,
                    warmup_jobs)
    return dataclasses.replace(res, start_order=np.array(order, dtype=np.int64))
