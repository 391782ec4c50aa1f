"""Table 1 live: replay the Azure code trace against PETALS, BPRR, JFFC only and the proposed scheme on one testbed.

``experiments/table1.sh [--quick]`` (= ``python -m petals_chain.experiments.table1``) validates the
testbed, the trace and the profile before starting anything, brings the testbed up (namespaces,
delays), and for each method starts its servers (+ orchestrator or DHT), replays the first N
requests of the trace with one thread per request calling ``generate()``, and stops it. The trace
is time-scaled so that its mean rate is ``load`` × the testbed's capacity measured by the
profiler; token counts are scaled to the model's limits (prompts by ``input_scale`` and clipped to
the static job length the cache is sized for). Both factors are printed. Per request: arrival,
service start (lease granted; for PETALS the start of the routing attempt that got its cache),
end; waiting, service and response. Writes ``results/table1.{csv,md,png}`` and
``results/table1_{requests.csv,details.json}`` next to the paper's Table 1 (docs/model.md, "Paper settings").
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import math
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.experiments.common import REPO, Summary, plt, publish
from petals_chain.model import InfeasibleError, SpecError, span_json, span_text

DEFAULT_TESTBED = REPO / "experiments" / "testbeds" / "cpu_emulated.yaml"
DEFAULT_PROFILE = REPO / "results" / "profile" / "cpu-emulated.json"
METHOD_ORDER = ("petals", "bprr", "jffc_only", "proposed")

# Paper Table 1 (seconds).
PAPER: dict[str, dict[str, float]] = {
    "petals": {"response_mean": 31.4, "response_median": 27.8, "response_p95": 68.5, "response_p99": 89.3,
               "waiting_mean": 24.2, "waiting_median": 20.5, "waiting_p95": 61.3, "waiting_max": 142.6,
               "service_mean": 7.2, "service_median": 5.8, "service_p95": 18.9},
    "bprr": {"response_mean": 19.8, "response_median": 16.9, "response_p95": 44.2, "response_p99": 61.7,
             "waiting_mean": 12.6, "waiting_median": 9.7, "waiting_p95": 37.1, "waiting_max": 98.4,
             "service_mean": 7.2, "service_median": 5.9, "service_p95": 18.7},
    "jffc_only": {"response_mean": 10.0, "response_median": 8.5, "response_p95": 22.1, "response_p99": 29.6,
                  "waiting_mean": 1.5, "waiting_median": 0.1, "waiting_p95": 7.8, "waiting_max": 25.1,
                  "service_mean": 8.5, "service_median": 7.2, "service_p95": 20.3},
    "proposed": {"response_mean": 7.3, "response_median": 6.5, "response_p95": 15.2, "response_p99": 21.4,
                 "waiting_mean": 0.6, "waiting_median": 0.1, "waiting_p95": 4.8, "waiting_max": 24.3,
                 "service_mean": 6.7, "service_median": 5.7, "service_p95": 18.2},
}
PAPER_REDUCTION_PCT = {"petals": 0.0, "bprr": 36.9, "jffc_only": 68.2, "proposed": 76.8}
METRICS = ("response_mean", "response_median", "response_p95", "response_p99", "waiting_mean", "waiting_median",
           "waiting_p95", "waiting_max", "service_mean", "service_median", "service_p95")
ROWS = (("response mean / median", "response_mean", "response_median"),
        ("response P95 / P99", "response_p95", "response_p99"),
        ("waiting mean / median", "waiting_mean", "waiting_median"),
        ("waiting P95 / max", "waiting_p95", "waiting_max"),
        ("service mean / median", "service_mean", "service_median"),
        ("service P95", "service_p95", None))


class ReplayError(RuntimeError):
    """A replay could not complete (requests failed or never finished); the message says which."""


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

    ``serve`` returns a :class:`~petals_chain.launch.methods.RequestTiming` (monotonic times). A
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


def improvement_pct(value: float, petals: float) -> float:
    """Reduction of a time vs PETALS, percent (positive = faster than PETALS)."""
    return 100.0 * (petals - value) / petals if petals > 0 else math.nan


# ---- outputs ---------------------------------------------------------------------------------------------------


def write_outputs(out_dir: Path, stem: str, stats: dict[str, dict[str, float]], results: dict[str, ReplayResult],
                  plan: ReplayPlan, infos: dict[str, dict[str, Any]], command: str) -> dict[str, Path]:
    """results/STEM.csv (measured next to paper), STEM.md, STEM.png, STEM_details.json and STEM_requests.csv."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    base = stats.get("petals", {}).get("response_mean", math.nan)
    rows = []
    for m in METHOD_ORDER:
        s = stats.get(m)
        for metric in METRICS:
            ours = s.get(metric, math.nan) if s else math.nan
            pv = stats.get("petals", {}).get(metric, math.nan)
            rows.append({"method": m, "metric": metric, "measured_s": ours, "paper_s": PAPER[m][metric],
                         "improvement_vs_petals_pct": improvement_pct(ours, pv) if m != "petals" else 0.0,
                         "paper_improvement_vs_petals_pct": improvement_pct(PAPER[m][metric],
                                                                            PAPER["petals"][metric]),
                         "status": infos.get(m, {}).get("status", "not run")})
    paths["csv"] = out_dir / f"{stem}.csv"
    with paths["csv"].open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    paths["requests"] = out_dir / f"{stem}_requests.csv"
    recs = [asdict(r) for res in results.values() for r in res.records]
    with paths["requests"].open("w", newline="") as fh:
        if recs:
            w = csv.DictWriter(fh, fieldnames=list(recs[0]))
            w.writeheader()
            w.writerows(recs)
    paths["md"] = out_dir / f"{stem}.md"
    paths["md"].write_text(markdown(stats, plan, infos, results, command, base))
    paths["png"] = plot(out_dir / f"{stem}.png", stats, results)
    paths["json"] = out_dir / f"{stem}_details.json"
    paths["json"].write_text(json.dumps({"command": command, "plan": plan.describe(), "stats": stats,
                                         "infos": infos, "paper": PAPER}, indent=1, default=str))
    return paths


def _cell(s: dict[str, float] | None, a: str, b: str | None) -> str:
    """'x / y' (or 'x') in seconds, or a dash where nothing was measured."""
    if not s or not math.isfinite(s.get(a, math.nan)):
        return "–"
    return f"{s[a]:.1f}" if b is None else f"{s[a]:.1f} / {s[b]:.1f}"


def markdown(stats: dict[str, dict[str, float]], plan: ReplayPlan, infos: dict[str, dict[str, Any]],
             results: dict[str, ReplayResult], command: str, petals_mean: float) -> str:
    """Table 1 measured here next to the paper's, with the scalings, the methods' set-ups and Little's law."""
    head = "| metric (s) | " + " | ".join(f"{n} (here)" for n in _labels()) + " |"
    lines = ["# Table 1, live on the CPU-emulated testbed", "", f"Command: `{command}`", ""]
    lines += [f"- {d}" for d in plan.describe()]
    lines += ["", head, "|---" * (len(METHOD_ORDER) + 1) + "|"]
    for label, a, b in ROWS:
        lines.append(f"| {label} | " + " | ".join(_cell(stats.get(m), a, b) for m in METHOD_ORDER) + " |")
    red = []
    for m in METHOD_ORDER:
        s = stats.get(m)
        red.append("–" if m == "petals" or not s else f"{improvement_pct(s['response_mean'], petals_mean):.1f} %")
    lines.append("| mean response reduction vs PETALS | " + " | ".join(red) + " |")
    lines += ["", "Paper (LLaMA-2-7B on 3 × 3g.40gb + 6 × 2g.20gb, first 1000 requests, c = 35):", "",
              "| metric (s) | " + " | ".join(_labels()) + " |", "|---" * (len(METHOD_ORDER) + 1) + "|"]
    for label, a, b in ROWS:
        lines.append(f"| {label} | " + " | ".join(_cell(PAPER[m], a, b) for m in METHOD_ORDER) + " |")
    lines.append("| mean response reduction vs PETALS | – | "
                 + " | ".join(f"{PAPER_REDUCTION_PCT[m]:.1f} %" for m in METHOD_ORDER[1:]) + " |")
    lines += ["", "Methods as run:", ""]
    for m in METHOD_ORDER:
        info = infos.get(m, {})
        lines.append(f"- **{_labels()[METHOD_ORDER.index(m)]}**: {info.get('status', 'not run')}; "
                     f"{info.get('summary', '')}")
    lines += ["", "Checks (Little's law: sampled mean in flight vs λ̂·W̄ from the records):", ""]
    for m, res in results.items():
        s = stats[m]
        sampled, lw = littles_law(res)
        if s.get("censored"):
            lines.append(f"- {m}: {int(s['censored'])} request(s) still waiting at the cutoff are counted at the "
                         "cutoff: its response and waiting figures are lower bounds")
        lines.append(f"- {m}: {int(s['served'])}/{int(s['requests'])} served, mean failed routing attempts "
                     f"{s.get('failed_attempts_mean', math.nan):.2f}, L sampled {sampled:.2f} vs λW {lw:.2f}, "
                     f"replay wall {res.wall_s:.0f} s")
    return "\n".join(lines) + "\n"


def _labels() -> list[str]:
    """Column labels in method order."""
    from petals_chain.launch.methods import LABELS

    return [LABELS[m] for m in METHOD_ORDER]


def plot(path: Path, stats: dict[str, dict[str, float]], results: dict[str, ReplayResult]) -> Path:
    """Bars: measured mean waiting + service per method next to the paper's; right: response-time CDFs."""
    pyplot = plt()
    fig, (a, b) = pyplot.subplots(1, 2, figsize=(12, 4.5))
    labels = _labels()
    x = np.arange(len(METHOD_ORDER))
    for off, src, name, alpha in ((-0.2, stats, "here", 1.0), (0.2, PAPER, "paper", 0.45)):
        wait = [src.get(m, {}).get("waiting_mean", math.nan) for m in METHOD_ORDER]
        svc = [src.get(m, {}).get("service_mean", math.nan) for m in METHOD_ORDER]
        a.bar(x + off, wait, 0.38, color="tab:red", alpha=alpha, label=f"waiting ({name})")
        a.bar(x + off, svc, 0.38, bottom=np.nan_to_num(wait), color="tab:blue", alpha=alpha,
              label=f"service ({name})")
    a.set_xticks(x, labels)
    a.set(ylabel="mean time (s)", title="Table 1: mean response = waiting + service (left bar here, right paper)")
    a.legend(fontsize=8)
    for m, res in results.items():
        r = np.sort([q.response_s for q in res.records if not q.error])
        if r.size:
            b.step(r, np.arange(1, r.size + 1) / r.size, where="post", label=labels[METHOD_ORDER.index(m)])
    b.set(xlabel="response time (s)", ylabel="fraction of requests", title="response-time CDF (here)")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    pyplot.close(fig)
    return path


# ---- the whole experiment ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(prog="experiments/table1.sh", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short replay (about 15 minutes on 2 cores)")
    p.add_argument("--testbed", type=Path, default=DEFAULT_TESTBED)
    p.add_argument("--trace", type=Path, default=None, help="Azure trace CSV (default: the testbed file's trace)")
    p.add_argument("--profile", type=Path, default=DEFAULT_PROFILE,
                   help="profile JSON from python -m petals_chain.launch.profile (fitted τ and capacity)")
    p.add_argument("--requests", type=int, default=None, help="first N requests (default 40 quick, 200 full)")
    p.add_argument("--load", type=float, default=0.7, help="replay rate as a fraction of the measured capacity")
    p.add_argument("--input-scale", type=float, default=1 / 32, help="factor on prompt lengths")
    p.add_argument("--output-scale", type=float, default=1.0, help="factor on output lengths")
    p.add_argument("--methods", default=",".join(METHOD_ORDER), help="comma-separated subset, in this order")
    p.add_argument("--drain-timeout-s", type=float, default=None, help="wait after the last arrival (default 300/900)")
    p.add_argument("--out", type=Path, default=REPO / "results")
    p.add_argument("--stem", default="table1")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


@dataclass
class Prepared:
    """Everything validated before anything starts: testbed, model setup, profile, fitted servers, plan, prompts."""

    testbed: Any
    setup: Any
    profile: Any
    servers: list[Any]
    plan: ReplayPlan
    prompts: list[np.ndarray]
    methods: list[str]


def load_inputs(args: argparse.Namespace) -> tuple[Any, Any, Any, list[str]]:
    """Testbed, the first N requests of the trace, the model set-up and the methods; SpecError/TraceError if bad."""
    from petals_chain.launch.methods import model_setup
    from petals_chain.launch.testbed import load_testbed
    from petals_chain.data.azure import read_azure_trace

    methods = [m.strip() for m in str(args.methods).split(",") if m.strip()]
    if bad := [m for m in methods if m not in METHOD_ORDER]:
        raise SpecError(f"--methods: unknown method(s) {', '.join(bad)}; choose from {', '.join(METHOD_ORDER)}")
    tb = load_testbed(args.testbed)
    trace_path = args.trace or (tb.trace.path if tb.trace is not None else None)
    if trace_path is None:
        raise SpecError(f"no trace: give --trace or a 'trace' section in {args.testbed}")
    trace_path = Path(trace_path)
    if not trace_path.is_file():
        raise SpecError(f"trace file not found: {trace_path} (set PETALS_CHAIN_DATA to the folder holding "
                        "azure_llm_2023_code.csv, or pass --trace)")
    n = args.requests or (40 if args.quick else 200)
    if n < 2:
        raise SpecError(f"--requests must be >= 2, got {n}")
    trace = read_azure_trace(trace_path, first_n=n)  # TraceError (a ValueError) names the bad line
    if trace.n_jobs < n:
        raise SpecError(f"{trace_path}: {trace.n_jobs} requests, --requests asks for {n}")
    tb.require_model()
    return tb, trace, model_setup(tb), methods


def check_inputs(argv: Sequence[str]) -> int:
    """Exit status of validating the inputs (not the profile): 0 fine, 2 with one line naming what is wrong."""
    try:
        load_inputs(parse_args(argv))
    except (SpecError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def prepare(args: argparse.Namespace) -> Prepared:
    """Validate inputs and plan the replay; SpecError (naming the file/field) before any process is started."""
    from petals_chain.launch.methods import FittedServer
    from petals_chain.launch.profiler import load_profile

    tb, trace, setup, methods = load_inputs(args)
    profile = load_profile(args.profile)
    if profile.num_blocks != setup.num_blocks or profile.max_length != setup.max_length:
        raise SpecError(f"{args.profile}: profiled {profile.num_blocks} blocks / max_length {profile.max_length}, "
                        f"the testbed has {setup.num_blocks} / {setup.max_length}: profile this testbed again")
    missing = [s.name for s in tb.servers if s.name not in profile.fits]
    if missing:
        raise SpecError(f"{args.profile}: no fit for server(s) {', '.join(missing)} of {args.testbed}")
    if profile.capacity is None:
        raise SpecError(f"{args.profile}: no capacity measurement (profile again without --no-capacity)")
    fits = [profile.fits[s.name] for s in tb.servers]

    def mean_job_time(l_in: float, l_out: float) -> float:
        """Mean over servers of one whole-model job's fitted time (converts capacity between job shapes)."""
        return float(np.mean([f.job_time_s(setup.num_blocks, l_in, l_out) for f in fits]))

    plan = plan_replay(trace, capacity_per_s=profile.capacity.jobs_per_s, load=args.load,
                       input_scale=args.input_scale, output_scale=args.output_scale, max_length=setup.max_length,
                       job_time_s=mean_job_time,
                       capacity_job=(profile.capacity.input_tokens, profile.capacity.output_tokens))
    job = (float(plan.input_tokens.mean()), float(plan.output_tokens.mean()))
    servers = [FittedServer(s.name, s.memory_bytes, profile.fits[s.name].tau_p_s(*job),
                            profile.fits[s.name].tau_c_s(job[1]), profile.fits[s.name].inference_rps,
                            profile.fits[s.name].forward_rps) for s in tb.servers]
    from transformers import AutoConfig

    vocab = int(AutoConfig.from_pretrained(str(setup.model_dir)).vocab_size)
    return Prepared(tb, setup, profile, servers, plan, prompts_for(plan, vocab, args.seed), methods)


def run_live(args: argparse.Namespace, prep: Prepared, log: Callable[[str], None] = print) -> Summary:
    """Bring the testbed up, run every method's replay, write the outputs, tear everything down."""
    from tqdm import tqdm

    from petals_chain.launch.launcher import Launch
    from petals_chain.launch.methods import LABELS, LiveMethod, MethodError, TestbedSwarm, plan_method

    plan, setup = prep.plan, prep.setup
    logging.getLogger("petals").setLevel(logging.ERROR)  # PETALS' per-retry warnings would bury the progress
    drain = args.drain_timeout_s or (300.0 if args.quick else 900.0)
    command = "experiments/table1.sh " + " ".join(shlex.quote(a) for a in getattr(args, "argv", []))
    job = (int(round(plan.input_tokens.mean())), int(round(plan.output_tokens.mean())))
    for line in plan.describe():
        log(line)
    stats: dict[str, dict[str, float]] = {}
    results: dict[str, ReplayResult] = {}
    infos: dict[str, dict[str, Any]] = {}
    log_dir = Path("/tmp") / f"petals_chain_table1_{os.getpid()}"
    t_all = time.monotonic()
    launch = Launch(prep.testbed, log=log)
    try:
        launch.up()
        swarm = TestbedSwarm(launch, setup, log_dir)
        for method in prep.methods:
            t_m = time.monotonic()
            try:
                plan_method(method, prep.servers, setup.spec, plan.replay_rate_per_s)
            except InfeasibleError as exc:  # as the simulator does: the method cannot serve this cluster
                infos[method] = {"status": "infeasible", "summary": str(exc)}
                log(f"[{method}] infeasible: {exc}")
                continue
            log(f"[{method}] starting servers (logs in {log_dir})")
            live = LiveMethod(method, swarm, prep.servers, arrival_rate=plan.replay_rate_per_s, job=job)
            try:
                info = live.start()
                log(f"[{method}] ready after {info.startup_s:.0f} s: {_describe_info(info)}")
                bar = tqdm(total=plan.n, desc=f"{LABELS[method]:9}", unit="req")
                last = [0]

                def progress(arrived: int, done: int, total: int, bar: Any = bar, last: list[int] = last) -> None:
                    bar.set_postfix_str(f"arrived {arrived}/{total}, in flight {arrived - done}")
                    if done > last[0]:
                        bar.update(done - last[0])
                        last[0] = done

                res = replay(method, live.client.serve, plan, prep.prompts, drain_timeout_s=drain, progress=progress)
                bar.close()
            except MethodError as exc:
                infos[method] = {"status": "failed to start", "summary": str(exc).splitlines()[0]}
                log(f"[{method}] failed: {exc}")
                continue
            finally:
                live.stop()
            results[method] = res
            stats[method] = summarize(res.records)
            bad = [r for r in res.records if r.error]
            infos[method] = {"status": "ran" if not bad else f"ran, {len(bad)} request(s) failed",
                             "summary": _describe_info(live.info),
                             "placement": {n: span_json(a, b) for n, (a, b) in live.info.placement.items()},
                             "chains": live.info.chains, "notes": live.info.notes, "startup_s": live.info.startup_s,
                             "errors": sorted({r.error for r in bad})[:5]}
            s = stats[method]
            log(f"[{method}] done in {time.monotonic() - t_m:.0f} s: response mean {s['response_mean']:.2f} s, "
                f"waiting mean {s['waiting_mean']:.2f} s, service mean {s['service_mean']:.2f} s; "
                f"{int(s['served'])}/{int(s['requests'])} served")
            write_outputs(args.out, args.stem, stats, results, plan, infos, command)  # partial results survive
    finally:
        for problem in launch.down():
            log(f"teardown: {problem}")
    paths = write_outputs(args.out, args.stem, stats, results, plan, infos, command)
    lines = list(plan.describe())
    base = stats.get("petals", {}).get("response_mean", math.nan)
    for m in METHOD_ORDER:
        if m in stats:
            s = stats[m]
            red = "" if m == "petals" else (f", {improvement_pct(s['response_mean'], base):.1f} % below PETALS "
                                            f"(paper {PAPER_REDUCTION_PCT[m]:.1f} %)")
            lines.append(f"{LABELS[m]}: response mean {s['response_mean']:.2f} s (median {s['response_median']:.2f}, "
                         f"P95 {s['response_p95']:.2f}), waiting mean {s['waiting_mean']:.2f} s, service mean "
                         f"{s['service_mean']:.2f} s{red}")
        elif m in infos:
            lines.append(f"{LABELS[m]}: {infos[m]['status']} ({infos[m]['summary']})")
    lines.append(f"total wall time {time.monotonic() - t_all:.0f} s; outputs: "
                 + ", ".join(str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p) for p in paths.values()))
    return Summary("table1", "Table 1 live: PETALS vs BPRR vs JFFC only vs proposed on the CPU-emulated testbed",
                   command, lines, ["mean response reduction vs PETALS: BPRR 36.9 %, JFFC only 68.2 %, "
                                    "proposed 76.8 % (paper, Table 1)"], {"stats": stats})


def _describe_info(info: Any) -> str:
    """One line about a started method: chains/capacity or PETALS' own spans."""
    spans = ", ".join(f"{n}[{span_text(a, b)}]" for n, (a, b) in sorted(info.placement.items()))
    notes = ", ".join(f"{k}={v}" for k, v in info.notes.items() if k != "num_blocks")
    return f"{notes}; spans {spans}"


def run(args: argparse.Namespace) -> Summary:
    """Entry for ``python -m petals_chain.experiments table1`` (its options take their defaults here)."""
    full = parse_args(["--quick"] if getattr(args, "quick", False) else [])
    full.out = getattr(args, "out", full.out)
    full.seed = getattr(args, "seed", full.seed)
    full.argv = ["--quick"] if full.quick else []
    if os.geteuid() != 0:
        raise SpecError("table1 brings a testbed up and needs root (network namespaces)")
    return run_live(full, prepare(full))


def main(argv: Sequence[str] | None = None) -> int:
    """Validate (exit 2 with one line on bad input, before anything starts), run, record in results/README.md."""
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        prep = prepare(args)
        if os.geteuid() != 0:
            raise SpecError("table1 brings a testbed up and needs root (network namespaces)")
    except (SpecError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        summary = run_live(args, prep)
    except KeyboardInterrupt:
        print("interrupted: torn down", file=sys.stderr)
        return 130
    publish(args.out, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
