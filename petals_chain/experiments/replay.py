"""Replay a request trace against a live serving method: scaling to the testbed, one thread per request, records.

The trace is time-scaled so that its mean rate is ``load`` × the testbed's measured capacity, and its token
counts are scaled to the model's limits. Every request is timed (arrival, service start, end); the result
is summarised and checked against Little's law. Used by Table 1 (:mod:`petals_chain.experiments.table1`).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from petals_chain.model import SpecError


METRICS = ("response_mean", "response_median", "response_p95", "response_p99", "waiting_mean", "waiting_median",
           "waiting_p95", "waiting_max", "service_mean", "service_median", "service_p95")


# ---- the trace, scaled to the testbed ------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayPlan:
    """The requests to replay: scaled arrival times (s from the first) and token counts, and how they were scaled."""

    arrival_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    time_scale: float  # replay inter-arrival = trace inter-arrival × time_scale
    input_scale: float
    output_scale: float
    trace_rate_per_s: float
    replay_rate_per_s: float
    capacity_per_s: float
    load: float
    max_length: int
    source: str

    @property
    def n(self) -> int:
        """Number of requests."""
        return int(self.arrival_s.size)

    def describe(self) -> list[str]:
        """The two scalings in words (printed before the replay and kept in the results)."""
        return [f"time scale x{self.time_scale:.3f}: the trace's {self.trace_rate_per_s:.3f} req/s become "
                f"{self.replay_rate_per_s:.3f} req/s = load {self.load:g} x measured capacity "
                f"{self.capacity_per_s:.3f} jobs/s ({self.n} requests over {self.arrival_s[-1]:.0f} s)",
                f"token scale: input x{self.input_scale:g}, output x{self.output_scale:g}, each job clipped to the "
                f"static cache length {self.max_length} tokens: mean {self.input_tokens.mean():.1f} in / "
                f"{self.output_tokens.mean():.1f} out (max {self.input_tokens.max()} / {self.output_tokens.max()})"]


def scale_tokens(input_tokens: np.ndarray, output_tokens: np.ndarray, *, input_scale: float, output_scale: float,
                 max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Token counts for the testbed's model: scaled, at least 1 each, and l_in + l_out ≤ max_length."""
    if not (input_scale > 0 and output_scale > 0):
        raise SpecError(f"token scales must be > 0, got input {input_scale!r}, output {output_scale!r}")
    if max_length < 2:
        raise SpecError(f"max_length must be >= 2 tokens, got {max_length}")
    out = np.clip(np.rint(np.asarray(output_tokens) * output_scale), 1, max_length - 1).astype(np.int64)
    inp = np.clip(np.rint(np.asarray(input_tokens) * input_scale), 1, None).astype(np.int64)
    return np.minimum(inp, max_length - out), out


def plan_replay(trace: Any, *, capacity_per_s: float, load: float, input_scale: float, output_scale: float,
                max_length: int, job_time_s: Callable[[float, float], float] | None = None,
                capacity_job: tuple[int, int] | None = None) -> ReplayPlan:
    """Scale a trace: tokens to the model's limits, then time so that its mean rate is load × capacity.

    ``capacity_per_s`` is measured for jobs of shape ``capacity_job``; with ``job_time_s`` (the
    fitted single-job time of a shape) it is converted to the replay's mean job shape.
    """
    if trace.n_jobs < 2:
        raise SpecError(f"the replay needs at least 2 requests, the trace gives {trace.n_jobs}")
    if not (capacity_per_s > 0 and math.isfinite(capacity_per_s)):
        raise SpecError(f"capacity must be > 0 jobs/s, got {capacity_per_s!r}")
    if not 0 < load:
        raise SpecError(f"load must be > 0, got {load!r}")
    inp, out = scale_tokens(trace.input_tokens, trace.output_tokens, input_scale=input_scale,
                            output_scale=output_scale, max_length=max_length)
    cap = capacity_per_s
    if job_time_s is not None and capacity_job is not None:
        cap = capacity_per_s * job_time_s(*capacity_job) / job_time_s(float(inp.mean()), float(out.mean()))
    span = float(trace.arrival_s[-1] - trace.arrival_s[0])
    if not span > 0:
        raise SpecError("the trace's requests all arrive at the same instant; cannot scale its rate")
    trace_rate = (trace.n_jobs - 1) / span
    target = load * cap
    scale = trace_rate / target
    arrival = (np.asarray(trace.arrival_s, dtype=float) - trace.arrival_s[0]) * scale
    return ReplayPlan(arrival, inp, out, scale, input_scale, output_scale, trace_rate, target, cap, load, max_length,
                      getattr(trace, "source", ""))


def prompts_for(plan: ReplayPlan, vocab_size: int, seed: int) -> list[np.ndarray]:
    """Prompt token ids per request (seeded, identical for every method), avoiding the first 100 (special) ids."""
    rng = np.random.default_rng(seed)
    return [rng.integers(100, vocab_size, int(n)) for n in plan.input_tokens]


# ---- one replay ------------------------------------------------------------------------------------------------


@dataclass
class RequestRecord:
    """One replayed request (seconds from the replay's start)."""

    method: str
    request: int
    arrival_s: float
    start_s: float
    end_s: float
    waiting_s: float
    service_s: float
    response_s: float
    input_tokens: int
    output_tokens: int
    generated: int
    failed_attempts: int
    dispatch_lag_s: float
    route: str
    error: str = ""
    censored: bool = False  # unfinished at the cutoff: response and waiting are lower bounds (end = cutoff)


@dataclass(frozen=True)
class ReplayResult:
    """Records of one method's replay and the in-flight counts a monitor sampled while it ran."""

    method: str
    records: list[RequestRecord]
    samples: np.ndarray  # (time_s, requests in flight)
    wall_s: float


def replay(method: str, serve: Callable[[Any, int], Any], plan: ReplayPlan, prompts: Sequence[np.ndarray], *,
           drain_timeout_s: float, progress: Callable[[int, int, int], None] | None = None,
           sample_period_s: float = 0.05) -> ReplayResult:
    """Issue request i at its scaled arrival time in its own thread (``serve(prompt, new_tokens)``); wait for all.

    ``serve`` returns a :class:`~petals_chain.launch.live_clients.RequestTiming` (monotonic times). A
    monitor thread samples the number of requests in flight (arrived, not finished) for the
    Little's-law check. Requests unfinished ``drain_timeout_s`` after the last arrival are
    recorded with an error.
    """
    import torch

    n = plan.n
    results: list[Any] = [None] * n
    dispatched = [math.nan] * n
    t0 = time.monotonic() + 1.0
    lock = threading.Lock()
    state = {"arrived": 0, "done": 0}
    stop = threading.Event()
    samples: list[tuple[float, int]] = []

    def one(i: int) -> None:
        """Serve request i and keep its timing."""
        timing = serve(torch.tensor(prompts[i], dtype=torch.long)[None, :], int(plan.output_tokens[i]))
        with lock:
            results[i] = timing
            state["done"] += 1
        if progress is not None:
            progress(state["arrived"], state["done"], n)

    def monitor() -> None:
        """Sample requests in flight until the replay ends."""
        while not stop.is_set():
            now = time.monotonic() - t0
            with lock:
                samples.append((now, sum(1 for i in range(state["arrived"]) if results[i] is None)))
            stop.wait(sample_period_s)

    threads = []
    mon = threading.Thread(target=monitor, daemon=True)
    while time.monotonic() < t0:
        time.sleep(0.01)
    mon.start()
    for i in range(n):
        wait = t0 + float(plan.arrival_s[i]) - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        with lock:
            state["arrived"] += 1
        dispatched[i] = time.monotonic() - t0
        th = threading.Thread(target=one, args=(i,), daemon=True, name=f"req-{i}")
        th.start()
        threads.append(th)
        if progress is not None:
            progress(state["arrived"], state["done"], n)
    deadline = time.monotonic() + drain_timeout_s
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    stop.set()
    mon.join()
    wall = time.monotonic() - t0
    with lock:
        snapshot = list(results)
    records = []
    for i in range(n):
        arrival = float(plan.arrival_s[i])
        r = snapshot[i]
        if r is None:  # still waiting or running at the cutoff: counted at the cutoff, as a lower bound
            records.append(RequestRecord(method, i, arrival, math.nan, wall, wall - arrival, math.nan, wall - arrival,
                                         int(plan.input_tokens[i]), int(plan.output_tokens[i]), 0, 0,
                                         dispatched[i] - arrival, "", f"not finished {drain_timeout_s:g} s after "
                                         "the last arrival (censored at the cutoff)", censored=True))
            continue
        start = r.start_s - t0 if r.start_s is not None else math.nan
        end = r.end_s - t0 if r.end_s is not None else math.nan
        err = r.error or ""
        if not err and r.tokens != int(plan.output_tokens[i]):
            err = f"generated {r.tokens} tokens, expected {int(plan.output_tokens[i])}"
        records.append(RequestRecord(method, i, arrival, start, end, start - arrival, end - start, end - arrival,
                                     int(plan.input_tokens[i]), int(plan.output_tokens[i]), int(r.tokens),
                                     int(r.failed_attempts), dispatched[i] - arrival, r.route, err))
    return ReplayResult(method, records, np.array(samples, dtype=float).reshape(-1, 2), wall)


# ---- statistics ------------------------------------------------------------------------------------------------


def summarize(records: Sequence[RequestRecord]) -> dict[str, float]:
    """Mean/median/P95/P99 response, waiting mean/median/P95/max, service mean/median/P95 over served requests.

    Requests unfinished at the cutoff (censored) enter response and waiting at their cutoff values, so
    those statistics are then lower bounds; service statistics use served requests only.
    """
    ok = [r for r in records if not r.error]
    cut = [r for r in records if r.censored]
    out: dict[str, float] = {"requests": float(len(records)), "served": float(len(ok)), "censored": float(len(cut))}
    if not ok:
        return out | {m: math.nan for m in METRICS}
    resp = np.array([r.response_s for r in ok + cut])
    wait = np.array([r.waiting_s for r in ok + cut])
    svc = np.array([r.service_s for r in ok])
    out |= {"response_mean": resp.mean(), "response_median": np.median(resp),
            "response_p95": np.percentile(resp, 95), "response_p99": np.percentile(resp, 99),
            "waiting_mean": wait.mean(), "waiting_median": np.median(wait), "waiting_p95": np.percentile(wait, 95),
            "waiting_max": wait.max(), "service_mean": svc.mean(), "service_median": np.median(svc),
            "service_p95": np.percentile(svc, 95),
            "failed_attempts_mean": float(np.mean([r.failed_attempts for r in ok]))}
    return {k: float(v) for k, v in out.items()}


def littles_law(result: ReplayResult) -> tuple[float, float]:
    """(time-average of the sampled in-flight count over [first arrival, last end], λ̂·W̄ from the records).

    Both equal ∫N(t)dt / window when the records are consistent with what was really in flight. Each
    sample holds until the next one (a step function): a monitor thread starved of CPU while many
    requests run samples busy periods less often, and a plain mean of the samples would under-count them.
    """
    ok = [r for r in result.records if not r.error or r.censored]
    if not ok or result.samples.size == 0:
        return math.nan, math.nan
    lo = min(r.arrival_s for r in ok)
    hi = max(r.end_s for r in ok)
    order = np.argsort(result.samples[:, 0], kind="stable")
    t, n = result.samples[order, 0], result.samples[order, 1]
    inside = (t >= lo) & (t <= hi)
    if inside.any():
        ti, ni = t[inside], n[inside]
        held = np.diff(np.append(ti, hi))  # each sample until the next one; the last until the window ends
        sampled = float(np.dot(ni, held) / held.sum()) if held.sum() > 0 else float(ni.mean())
    else:
        sampled = math.nan
    lam = len(ok) / (hi - lo)
    return sampled, lam * float(np.mean([r.response_s for r in ok]))


LITTLES_LAW_TOLERANCE = 0.10  # a replay whose sampled L and λW differ by more than this share is flagged


@dataclass(frozen=True)
class LittlesLawCheck:
    """Little's law on one replay: the monitor's time-weighted L against λ̂·W̄ from the records, and why they differ.

    ``records_l`` is the records' own in-flight count (arrived, not ended) at the monitor's sample instants,
    time-weighted the same way. If it agrees with ``sampled_l`` the two bookkeepings agree wherever the
    monitor looked, and a miss comes from where it did not look (``cause = "sampling"``: long gaps between
    samples while the count moved); if it agrees with ``lambda_w`` instead, the monitor and the records
    disagree about what was in flight (``cause = "accounting"``).
    """

    sampled_l: float
    lambda_w: float
    records_l: float
    rel_gap: float  # |sampled L − λW| / λW
    max_sample_gap_s: float
    tolerance: float = LITTLES_LAW_TOLERANCE

    @property
    def ok(self) -> bool:
        """True when the miss is within the tolerance (NaN, e.g. no samples, is not ok)."""
        return bool(self.rel_gap <= self.tolerance)

    @property
    def cause(self) -> str:
        """'' when ok; else 'sampling' or 'accounting' (whichever side records_l is nearer), 'unknown' if NaN."""
        if self.ok:
            return ""
        if not (math.isfinite(self.records_l) and math.isfinite(self.sampled_l)):
            return "unknown"
        return "sampling" if abs(self.records_l - self.sampled_l) <= abs(self.records_l - self.lambda_w) \
            else "accounting"

    def describe(self) -> str:
        """One line: both figures, the miss, and on a miss a loud WARNING with its likely cause."""
        line = (f"L sampled {self.sampled_l:.2f} vs λW {self.lambda_w:.2f} (miss {100 * self.rel_gap:.1f} %; "
                f"records' L at the samples {self.records_l:.2f}, longest sampling gap {self.max_sample_gap_s:.2f} s)")
        if self.ok:
            return line
        return (f"WARNING: Little's law missed by more than {100 * self.tolerance:.0f} %: {line}; likely cause: "
                f"{self.cause}")

    def as_json(self) -> dict[str, Any]:
        """The fields and the verdict, for the details JSON."""
        return {"sampled_l": self.sampled_l, "lambda_w": self.lambda_w, "records_l": self.records_l,
                "rel_gap": self.rel_gap, "max_sample_gap_s": self.max_sample_gap_s, "tolerance": self.tolerance,
                "ok": self.ok, "cause": self.cause}


def check_littles_law(result: ReplayResult, tolerance: float = LITTLES_LAW_TOLERANCE) -> LittlesLawCheck:
    """Little's law on a replay (:func:`littles_law`), with the records' count at the sample instants as witness."""
    if not 0 < tolerance < 1:
        raise SpecError(f"tolerance must be in (0, 1), got {tolerance!r}")
    sampled, lw = littles_law(result)
    ok = [r for r in result.records if not r.error or r.censored]
    if not ok or result.samples.size == 0:
        return LittlesLawCheck(sampled, lw, math.nan, math.nan, math.nan, tolerance)
    lo, hi = min(r.arrival_s for r in ok), max(r.end_s for r in ok)
    t = np.sort(result.samples[:, 0], kind="stable")
    t = t[(t >= lo) & (t <= hi)]
    if t.size == 0:
        return LittlesLawCheck(sampled, lw, math.nan, math.nan, math.nan, tolerance)
    # the monitor counts a request from its dispatch (its planned arrival plus the replay thread's lag, which a busy
    # machine makes visible), so the witness does too
    arrivals = np.sort([r.arrival_s + (r.dispatch_lag_s if math.isfinite(r.dispatch_lag_s) else 0.0) for r in ok])
    ends = np.sort([r.end_s for r in ok])
    in_flight = np.searchsorted(arrivals, t, side="right") - np.searchsorted(ends, t, side="right")
    held = np.diff(np.append(t, hi))
    records_l = float(np.dot(in_flight, held) / held.sum()) if held.sum() > 0 else float(in_flight.mean())
    gaps = np.diff(np.concatenate(([lo], t, [hi])))
    rel = abs(sampled - lw) / lw if lw > 0 else math.nan
    return LittlesLawCheck(sampled, lw, records_l, rel, float(gaps.max()), tolerance)
