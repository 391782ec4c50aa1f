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
import logging
import math
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.compose.method_table import METHODS, Routing
from petals_chain.experiments.common import REPO, Summary, publish
from petals_chain.experiments.limit import distance_to_limit
from petals_chain.experiments.replay import (ReplayPlan, ReplayResult, check_littles_law, plan_replay, prompts_for,
                                             replay, summarize)
from petals_chain.experiments.table1_regime import PAPER_C, PAPER_DESIGN_RATE_FACTOR
from petals_chain.experiments.table1_report import (METHOD_ORDER, PAPER_REDUCTION_PCT, improvement_pct, load_finished,
                                                    write_outputs)
from petals_chain.model import InfeasibleError, SpecError, span_json, span_text

DEFAULT_TESTBED = REPO / "experiments" / "testbeds" / "cpu_emulated_regime.yaml"
DEFAULT_PROFILE = REPO / "results" / "profile" / "cpu-emulated-regime.json"
PAPER_CLUSTER = REPO / "experiments" / "clusters" / "llama2_7b_testbed.yaml"

# ---- the whole experiment ---------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(prog="experiments/table1.sh", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a short replay (about 15 minutes on 2 cores)")
    p.add_argument("--testbed", type=Path, default=DEFAULT_TESTBED)
    p.add_argument("--trace", type=Path, default=None, help="Azure trace CSV (default: the testbed file's trace)")
    p.add_argument("--profile", type=Path, default=DEFAULT_PROFILE,
                   help="profile JSON from python -m petals_chain.launch.profile_testbed (fitted τ and capacity)")
    p.add_argument("--requests", type=int, default=None, help="first N requests (default 40 quick, 200 full)")
    p.add_argument("--load", type=float, default=0.3, help="replay rate as a fraction of the measured capacity")
    p.add_argument("--input-scale", type=float, default=1 / 32, help="factor on prompt lengths")
    p.add_argument("--output-scale", type=float, default=1.0, help="factor on output lengths")
    p.add_argument("--methods", default=",".join(METHOD_ORDER), help="comma-separated subset, in this order")
    p.add_argument("--design-rate-factor", type=float, default=PAPER_DESIGN_RATE_FACTOR,
                   help="the paper composition is composed for this × the replay rate (the authors designed for "
                        "about 8 × the trace's rate)")
    p.add_argument("--paper-c", type=int, default=PAPER_C,
                   help="reserved concurrency c of the paper composition (published: 35; 0 = tune it)")
    p.add_argument("--regime", action="store_true",
                   help="print the regime report (ratios next to the paper's testbed's) and exit; no root needed")
    p.add_argument("--drain-timeout-s", type=float, default=None, help="wait after the last arrival (default 300/900)")
    p.add_argument("--out", type=Path, default=REPO / "results")
    p.add_argument("--stem", default="table1")
    p.add_argument("--resume", action="store_true",
                   help="keep the methods a previous run of the same plan finished (read from --out/--stem) and run "
                        "only the others")
    p.add_argument("--rerun", default="",
                   help="with --resume: comma-separated methods to replay again although a previous run finished them")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-batch-sessions", type=int, default=None,
                   help="the orchestrated servers' --max-batch-sessions (default: theirs; 1 = PETALS' one-at-a-time "
                        "pool, as every run before batching)")
    p.add_argument("--replot", action="store_true",
                   help="redraw --out/--stem.png and _limit.png from that replay's saved outputs; nothing runs")
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
    from petals_chain.launch.live_setup import model_setup
    from petals_chain.launch.testbed import load_testbed
    from petals_chain.data.azure import read_azure_trace

    methods = [m.strip() for m in str(args.methods).split(",") if m.strip()]
    if bad := [m for m in methods if m not in METHOD_ORDER]:
        raise SpecError(f"--methods: unknown method(s) {', '.join(bad)}; choose from {', '.join(METHOD_ORDER)}")
    if args.max_batch_sessions is not None and args.max_batch_sessions < 1:
        raise SpecError(f"--max-batch-sessions must be >= 1, got {args.max_batch_sessions}")
    rerun = [m.strip() for m in str(getattr(args, "rerun", "")).split(",") if m.strip()]
    if bad := [m for m in rerun if m not in methods]:
        raise SpecError(f"--rerun: {', '.join(bad)} not among --methods ({', '.join(methods)})")
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


def prepare(args: argparse.Namespace, strict: bool = True) -> Prepared:
    """Validate inputs and plan the replay; SpecError (naming the file/field) before any process is started.

    ``strict=False`` (the regime report) accepts a profile of another cache length."""
    from petals_chain.launch.live_setup import FittedServer
    from petals_chain.launch.profile_results import load_profile

    if not args.design_rate_factor > 0:
        raise SpecError(f"--design-rate-factor must be > 0, got {args.design_rate_factor!r}")
    if args.paper_c < 0:
        raise SpecError(f"--paper-c must be >= 1 (or 0 to tune c), got {args.paper_c!r}")
    tb, trace, setup, methods = load_inputs(args)
    profile = load_profile(args.profile)
    if strict and (profile.num_blocks != setup.num_blocks or profile.max_length != setup.max_length):
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
    sigma = profile.serial_fraction()
    servers = [FittedServer(s.name, s.memory_bytes, profile.fits[s.name].tau_p_s(*job),
                            profile.fits[s.name].tau_c_s(job[1]), profile.fits[s.name].inference_rps,
                            profile.fits[s.name].forward_rps, sigma, profile.fits[s.name].batch_slowdown)
               for s in tb.servers]
    from transformers import AutoConfig

    vocab = int(AutoConfig.from_pretrained(str(setup.model_dir)).vocab_size)
    return Prepared(tb, setup, profile, servers, plan, prompts_for(plan, vocab, args.seed), methods)


def run_live(args: argparse.Namespace, prep: Prepared, log: Callable[[str], None] = print) -> Summary:
    """Bring the testbed up, run every method's replay, write the outputs, tear everything down."""
    from tqdm import tqdm

    from petals_chain.launch.launcher import Launch
    from petals_chain.launch.live_methods import LiveMethod, plan_method
    from petals_chain.launch.swarm_procs import MethodError, TestbedSwarm

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
    if args.resume:  # a long run split over sessions: methods already replayed on this plan are kept
        rerun = {m.strip() for m in str(args.rerun).split(",") if m.strip()}
        stats, results, infos = load_finished(args.out, args.stem, plan, rerun)
        for m in stats:
            log(f"[{m}] kept from the previous run ({args.out / args.stem}_requests.csv)")
    log_dir = Path("/tmp") / f"petals_chain_table1_{os.getpid()}"
    t_all = time.monotonic()
    launch = Launch(prep.testbed, log=log)
    try:
        launch.up()
        swarm = TestbedSwarm(launch, setup, log_dir, max_batch_sessions=args.max_batch_sessions)
        for method in (m for m in prep.methods if m not in stats):
            t_m = time.monotonic()
            load_before = os.getloadavg()[0]  # other work on the machine skews a method's times: say how much
            rate, c = method_rate_c(args, method, plan.replay_rate_per_s)
            try:
                plan_method(method, prep.servers, setup.spec, rate, c=c)
            except InfeasibleError as exc:  # as the simulator does: the method cannot serve this cluster
                infos[method] = {"status": "infeasible", "summary": str(exc)}
                log(f"[{method}] infeasible: {exc}")
                continue
            log(f"[{method}] starting servers (logs in {log_dir})")
            live = LiveMethod(method, swarm, prep.servers, arrival_rate=rate, job=job, c=c)
            try:
                info = live.start()
                log(f"[{method}] ready after {info.startup_s:.0f} s: {_describe_info(info)}")
                bar = tqdm(total=plan.n, desc=f"{METHODS[method].label:9}", unit="req")
                last, bar_lock = [0], threading.Lock()

                def progress(arrived: int, done: int, total: int, bar: Any = bar, last: list[int] = last,
                             bar_lock: Any = bar_lock) -> None:
                    """Called from every request's thread: one at a time, or two may count the same request."""
                    with bar_lock:
                        bar.set_postfix_str(f"arrived {arrived}/{total}, in flight {arrived - done}")
                        if done > last[0]:
                            bar.update(done - last[0])
                            last[0] = done

                res = replay(method, live.client.serve, plan, prep.prompts, drain_timeout_s=drain, progress=progress)
                bar.close()
            except (MethodError, RuntimeError, OSError) as exc:  # one method failing loses none of the others
                infos[method] = {"status": "failed", "summary": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
                log(f"[{method}] failed: {type(exc).__name__}: {exc}")
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
                             "errors": sorted({r.error for r in bad})[:5], "wall_s": res.wall_s,
                             "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}
            if METHODS[method].routing is Routing.JFFC:  # fixed chains: how far from the Theorem 3.7 limit
                limit = distance_to_limit(res.records, live.info.chains)
                infos[method]["limit"] = limit.as_json()
                infos[method]["limit_line"] = limit.describe()
                log(f"[{method}] {limit.describe()}")
            little = check_littles_law(res)
            infos[method]["littles_law"] = little.as_json()
            infos[method]["littles_law_line"] = little.describe()
            if not little.ok:  # loud, but the run goes on: the records, not the monitor, give the table's figures
                log(f"[{method}] {little.describe()}")
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
            gain = improvement_pct(s['response_mean'], base)
            red = "" if m == "petals" else (f", {abs(gain):.1f} % {'below' if gain >= 0 else 'above'} PETALS "
                                            f"(paper {PAPER_REDUCTION_PCT[m]:.1f} % below)")
            lines.append(f"{METHODS[m].label}: response mean {s['response_mean']:.2f} s "
                         f"(median {s['response_median']:.2f}, "
                         f"P95 {s['response_p95']:.2f}), waiting mean {s['waiting_mean']:.2f} s, service mean "
                         f"{s['service_mean']:.2f} s{red}")
        elif m in infos:
            lines.append(f"{METHODS[m].label}: {infos[m]['status']} ({infos[m]['summary']})")
    lines += [f"{METHODS[m].label}: {infos[m]['limit_line']}" for m in METHOD_ORDER if m in infos
              and infos[m].get("limit_line")]
    lines += [f"{METHODS[m].label}: {infos[m]['littles_law_line']}" for m in METHOD_ORDER
              if m in infos and not infos[m].get("littles_law", {}).get("ok", True)]
    lines.append(f"total wall time {time.monotonic() - t_all:.0f} s; outputs: "
                 + ", ".join(str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(p) for p in paths.values()))
    return Summary("table1", "Table 1 live: PETALS vs BPRR vs JFFC only vs paper vs proposed on the CPU-emulated "
                   "testbed", command, lines, ["mean response reduction vs PETALS: BPRR 36.9 %, JFFC only 68.2 %, "
                                    "proposed 76.8 % (paper, Table 1)"], {"stats": stats})


def method_rate_c(args: argparse.Namespace, method: str, replay_rate: float) -> tuple[float, int | None]:
    """The rate a method composes for and its fixed c: the paper composition at its design rate and c."""
    if method == "paper":
        return replay_rate * args.design_rate_factor, (args.paper_c or None)
    return replay_rate, None


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


def regime_report(args: argparse.Namespace) -> list[str]:
    """The testbed's regime next to the paper's (petals_chain.experiments.table1_regime), for the replay's plan."""
    from petals_chain.experiments import table1_regime as tr

    prep = prepare(args, strict=False)
    methods = [m for m in METHOD_ORDER if m in prep.methods]
    paper_c = args.paper_c or None
    ours = tr.regime("this testbed", [s.spec for s in prep.servers], prep.setup.spec,
                     replay_rate=prep.plan.replay_rate_per_s,
                     design_rate=prep.plan.replay_rate_per_s * args.design_rate_factor, paper_c=paper_c,
                     methods=methods)
    paper, paper_kinds = tr.paper_side(str(PAPER_CLUSTER), methods, paper_c=paper_c,
                                       design_rate_factor=args.design_rate_factor)
    kinds = tr.emulated_kinds([s.name for s in prep.testbed.servers], [s.speed_factor for s in prep.testbed.servers])
    def rel(path: Path) -> str:
        """A path relative to the repository where it lies inside it."""
        path = Path(path).resolve()
        return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)

    header = [f"testbed {rel(args.testbed)}, profile {rel(args.profile)}"
              + ("" if prep.profile.max_length == prep.setup.max_length else
                 f" (profiled with a {prep.profile.max_length}-token cache, the testbed has {prep.setup.max_length})"),
              *prep.plan.describe(), ""]
    return tr.report_lines(ours, kinds, paper, paper_kinds, header)


def main(argv: Sequence[str] | None = None) -> int:
    """Validate (exit 2 with one line on bad input, before anything starts), run, record in results/README.md."""
    args = parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.replot:
        from petals_chain.experiments.table1_report import replot

        details = args.out / f"{args.stem}_details.json"
        if not details.is_file():
            print(f"error: --replot: {details} is missing (no finished replay to redraw)", file=sys.stderr)
            return 2
        for path in replot(args.out, args.stem):
            print(path)
        return 0
    try:
        if args.regime:
            for line in regime_report(args):
                print(line)
            return 0
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
