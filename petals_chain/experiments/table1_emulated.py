"""Table 1 in the paper's own regime: servers that keep an A100 slice's time, the code trace at its native pace.

``experiments/table1-emulated.sh`` (= ``python -m petals_chain.experiments.table1_emulated``) brings up the
emulated testbed (``experiments/testbeds/paper_emulated.yaml``: nine servers standing for 3g.40gb and 2g.20gb MIG
slices serving LLaMA-2-7B, each computing on a tiny LLaMA-shaped checkpoint and waiting out the slice's time per
step, server/device_clock.py) and replays the first N rows of the Azure code trace as the paper did: native
timestamps, full input and output lengths. Every duration (device time, round trip, inter-arrival gap, timeouts)
is dilated by k so that two cores keep the servers on time; reported times are divided by k.

Every configuration replays the same arrivals, in rounds (A B C … G, A B C … G, …): PETALS, BPRR, JFFC only, the
paper's Algorithm 1 and proposed on batching servers, and the paper's and proposed on one-at-a-time servers
(``-b1``). Each replay is written as soon as it ends (``replays/CONFIG-rR.json`` and ``_requests.csv``); a rerun
goes on with the next missing one. A replay counts only if at least 99 % of its servers' steps finished their real
compute before the device time (the step logs say). ``--report`` aggregates what is there
(:mod:`petals_chain.experiments.table1_emulated_report`).

Requests longer than PETALS' ``inference_max_length`` for LLaMA-2 (2048 tokens) keep their output length and the
last ``2048 − output`` tokens of their prompt, for every method alike.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain import defaults
from petals_chain.compose.method_table import METHODS, Routing
from petals_chain.device_profile import device
from petals_chain.experiments.common import REPO
from petals_chain.experiments.replay import ReplayPlan, prompts_for, replay, scale_tokens, summarize
from petals_chain.model import SpecError
from petals_chain.service_time import PER_TOKEN_OVERHEAD_S

DEFAULT_TESTBED = REPO / "experiments" / "testbeds" / "paper_emulated.yaml"
DEFAULT_OUT = REPO / "results" / "table1-emulated"
VALID_SHARE = 0.99  # a replay counts only if this share of steps kept the device's time
DRAIN_NATIVE_S = 300.0  # wait after the last arrival, in native seconds (× k): twice the paper's longest PETALS wait


@dataclass(frozen=True)
class Config:
    """One configuration of Table 1: a method on servers that batch (or not)."""

    name: str
    method: str
    max_batch_sessions: int | None  # None: the servers' default; 1: one session's step at a time

    @property
    def batching(self) -> bool:
        """Whether the orchestrated servers batch their sessions' steps (PETALS' own never do)."""
        return self.method != "petals" and self.max_batch_sessions != 1


# The order of every round (PETALS and the default first: a run stopped inside a round keeps the headline pair).
CONFIGS: dict[str, Config] = {c.name: c for c in (
    Config("petals", "petals", None), Config("proposed", "proposed", None), Config("paper", "paper", None),
    Config("jffc_only", "jffc_only", None), Config("bprr", "bprr", None),
    Config("proposed-b1", "proposed", 1), Config("paper-b1", "paper", 1))}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(prog="experiments/table1-emulated.sh", description=__doc__.splitlines()[0])
    p.add_argument("--testbed", type=Path, default=DEFAULT_TESTBED)
    p.add_argument("--trace", type=Path, default=None, help="Azure code trace CSV (default: the testbed's)")
    p.add_argument("--requests", type=int, default=1000, help="the first N rows of the trace (paper: 1000)")
    p.add_argument("--skip", type=int, default=0, help="start at this row of the trace (a short check of a burst)")
    p.add_argument("--time-dilation", type=float, default=None, help="k (default: the testbed file's)")
    p.add_argument("--compose-rate", type=float, default=None,
                   help="the arrival rate (native req/s) the methods compose for (default: the replayed rows' mean; "
                        "give the whole trace's 1.92 when --skip replays one burst of it)")
    p.add_argument("--replays", type=int, default=3, help="rounds of every configuration")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {', '.join(CONFIGS)}")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--budget-min", type=float, default=math.inf,
                   help="start no replay after this many minutes (the run resumes where it stopped)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--preflight", action="store_true", help="print the preflight of every configuration and exit")
    p.add_argument("--report", action="store_true", help="aggregate the replays in --out; nothing runs")
    return p.parse_args(argv)


# ---- the workload ------------------------------------------------------------------------------------------------


def plan_native(trace: Any, k: float, max_length: int, compose_rate: float | None = None) -> ReplayPlan:
    """The trace at its own timestamps (× k), full token counts, each job within ``max_length`` (prompt cut); the
    plan's replay rate (what the methods compose for, dilated) is the rows' mean unless ``compose_rate`` is given."""
    inp, out = scale_tokens(trace.input_tokens, trace.output_tokens, input_scale=1.0, output_scale=1.0,
                            max_length=max_length)
    arrival = (np.asarray(trace.arrival_s, dtype=float) - float(trace.arrival_s[0])) * k
    span = float(trace.arrival_s[-1] - trace.arrival_s[0])
    rate = (trace.n_jobs - 1) / span if span > 0 else math.nan
    target = compose_rate if compose_rate is not None else rate
    return ReplayPlan(arrival, inp, out, k, 1.0, 1.0, rate, target / k, math.nan, math.nan, max_length,
                      getattr(trace, "source", ""))


def describe_plan(plan: ReplayPlan, trace: Any) -> list[str]:
    """The workload in words (native units)."""
    cut = int(np.sum(np.asarray(trace.input_tokens) > plan.input_tokens))
    k = plan.time_scale
    return [f"workload: {plan.n} requests of the code trace over {plan.arrival_s[-1] / k:.1f} s native "
            f"({plan.trace_rate_per_s:.2f} req/s), time dilated x{k:g} ({plan.arrival_s[-1]:.0f} s of wall clock)",
            f"tokens: mean {np.mean(trace.input_tokens):.1f} in / {np.mean(trace.output_tokens):.1f} out in the trace; "
            f"served {plan.input_tokens.mean():.1f} / {plan.output_tokens.mean():.1f} (max {plan.input_tokens.max()} / "
            f"{plan.output_tokens.max()}): {cut} prompt(s) cut to fit {plan.max_length} tokens with their output"]


# ---- the servers as the composer sees them --------------------------------------------------------------------


def fitted_servers(testbed: Any, job: tuple[float, float], k: float, config: Config) -> list[Any]:
    """Every server's τp, τc and τp(b) from its emulated device (dilated by k): what the orchestrator composes with,
    and PETALS' per-block speeds for its throughput cache."""
    from petals_chain.launch.live_setup import FittedServer

    out = []
    sessions = defaults.MAX_BATCH_SESSIONS if config.max_batch_sessions is None else config.max_batch_sessions
    for s in testbed.servers:
        d = device(s.device).dilated(k)
        tau_p = d.job_s(*job)
        tau_c = job[1] * (s.rtt_s + PER_TOKEN_OVERHEAD_S * k)
        slowdown = d.batch_slowdown(*job, sessions) if config.batching else ()
        out.append(FittedServer(s.name, s.memory_bytes, tau_p, tau_c, 1.0 / d.block_step_s([1], [int(job[0])]),
                                1.0 / d.t_in_s, 0.0 if config.batching else 1.0, slowdown))
    return out


def preflight(config: Config, testbed: Any, setup: Any, plan: ReplayPlan, k: float,
              servers: Sequence[Any] | None = None) -> dict[str, Any]:
    """Session slots against the offered concurrency, and each server's emulated τp(b) against the composer's
    (``servers``: the configuration's fitted_servers, when the caller has them already)."""
    from petals_chain.compose.capacity import slots_left
    from petals_chain.compose.petals_default import DEFAULT_CACHE_JOBS
    from petals_chain.launch.live_methods import petals_num_blocks, plan_method

    job = (float(plan.input_tokens.mean()), float(plan.output_tokens.mean()))
    servers = list(servers) if servers is not None else fitted_servers(testbed, job, k, config)
    rate = plan.replay_rate_per_s
    out: dict[str, Any] = {"config": config.name, "rate_per_s_native": rate * k,
                           "replayed_rate_per_s_native": plan.trace_rate_per_s}
    # PETALS and BPRR route per request, mostly whole-model hops here: the servers' mean whole-model job, native
    whole_model_s = float(np.mean([s.tau_c_s + s.tau_p_s * setup.num_blocks for s in servers])) / k
    if config.method == "petals":
        m = petals_num_blocks([s.spec for s in servers], setup.spec)
        slots = DEFAULT_CACHE_JOBS * sum(1 for mj in m if mj > 0)
        out |= {"slots": slots, "service_s": whole_model_s, "spans": dict(zip([s.name for s in servers], m))}
    elif config.method == "bprr":  # routes per request over its placement: slots by the block-cut bound
        comp = plan_method(config.method, servers, setup.spec, rate)
        per = {}
        for j, spec in enumerate(comp.servers):
            if comp.placement.hosts(j):
                a, b = comp.placement.span(j)
                jobs = slots_left(spec.memory_bytes, setup.spec.block_bytes, setup.spec.cache_bytes, b - a) // (b - a)
                per[j] = (a, b, jobs)
        slots = min(sum(n for a, b, n in per.values() if a <= blk < b) for blk in range(setup.num_blocks))
        out |= {"slots": slots, "service_s": whole_model_s, "c": int(comp.c),
                "jobs_per_server": {comp.servers[j].name: n for j, (a, b, n) in per.items()},
                "spans": {comp.servers[j].name: [a, b] for j, (a, b, n) in per.items()}}
    else:
        comp = plan_method(config.method, servers, setup.spec, rate)
        chains = [{"servers": [comp.servers[j].name for j in ch.servers], "blocks": list(ch.blocks),
                   "capacity": int(ch.capacity), "service_s": float(ch.service_time_s) / k}
                  for ch in comp.chains]
        slots = sum(c["capacity"] for c in chains)
        service = sum(c["capacity"] * c["service_s"] for c in chains) / max(1, slots)
        out |= {"slots": slots, "service_s": service, "chains": chains, "c": int(comp.c),
                "spans": {comp.servers[j].name: list(comp.placement.span(j)) for j in range(len(comp.servers))
                          if comp.placement.hosts(j)}}
    out["offered_concurrency"] = plan.trace_rate_per_s * out["service_s"]
    taus = []
    for s, t in zip(testbed.servers, servers):
        d = device(s.device).dilated(k)
        bs = [1, 2, 4, 8, 16] if config.batching else [1, 2, 4]
        # what the device does with b sessions: batched on a batching server, one after another on the others
        table = d.batch_slowdown(*job, bs[-1]) if config.batching else tuple(map(float, range(1, bs[-1] + 1)))
        emulated = [table[b - 1] for b in bs]
        composer = [t.spec.step_factor(b) for b in bs]
        taus.append({"server": s.name, "device": s.device, "tau_p_ms_native": 1e3 * t.tau_p_s / k, "b": bs,
                     "emulated_g": [round(g, 3) for g in emulated], "composer_g": [round(g, 3) for g in composer]})
    out["servers"] = taus
    return out


def preflight_lines(pf: dict[str, Any]) -> list[str]:
    """The preflight in words."""
    lines = [f"[{pf['config']}] {pf['slots']} session slots for an offered concurrency of "
             f"{pf['offered_concurrency']:.1f} (λ {pf['replayed_rate_per_s_native']:.2f}/s × service "
             f"{pf['service_s']:.2f} s native{', c = ' + str(pf['c']) if pf.get('c') is not None else ''})"]
    for s in pf["servers"]:
        lines.append(f"    {s['server']} {s['device']}: τp {s['tau_p_ms_native']:.1f} ms/block; g(b) at b = "
                     f"{s['b']}: emulated {s['emulated_g']}, composer {s['composer_g']}")
    return lines


# ---- one replay ------------------------------------------------------------------------------------------------


def replay_paths(out: Path, config: str, r: int) -> tuple[Path, Path]:
    """Where replay r of a configuration is kept (details JSON, per-request CSV)."""
    base = out / "replays" / f"{config}-r{r}"
    return base.with_suffix(".json"), base.parent / f"{base.name}_requests.csv"


def device_validity(log_dir: Path) -> dict[str, Any]:
    """Per server and overall: steps, the share that kept the device's time, real and device seconds."""
    from petals_chain.server.device_clock import read_log

    per = {p.stem: read_log(p) for p in sorted(log_dir.glob("*.csv"))}
    steps = sum(v["steps"] for v in per.values())
    valid = sum(v["valid_share"] * v["steps"] for v in per.values() if v["steps"])
    return {"steps": steps, "valid_share": valid / steps if steps else math.nan, "servers": per}


def _progress_printer(name: str, r: int, total: int, log: Callable[[str], None]) -> Callable[[int, int, int], None]:
    """A progress callback for replay(): one line at every tenth of the requests answered."""
    import threading

    lock, shown = threading.Lock(), [0]

    def progress(arrived: int, done: int, n: int) -> None:
        """Called from the requests' threads."""
        with lock:
            if done * 10 // total > shown[0]:
                shown[0] = done * 10 // total
                log(f"[{name} r{r}] {done}/{n} answered, {arrived - done} in flight ({time.strftime('%H:%M:%S')})")

    return progress


def run_one(config: Config, r: int, args: argparse.Namespace, launch: Any, setup: Any, plan: ReplayPlan,
            prompts: list[np.ndarray], log: Callable[[str], None]) -> dict[str, Any]:
    """Start the configuration's swarm, replay, stop it; write and return the replay's details."""
    from petals_chain.experiments.limit import distance_to_limit
    from petals_chain.experiments.table1_report import write_requests_csv
    from petals_chain.launch.live_methods import LiveMethod
    from petals_chain.launch.swarm_procs import MethodError, TestbedSwarm

    from petals_chain.model import InfeasibleError

    k = launch.testbed.time_dilation
    job = (float(plan.input_tokens.mean()), float(plan.output_tokens.mean()))
    servers = fitted_servers(launch.testbed, job, k, config)
    js, csv_path = replay_paths(args.out, config.name, r)
    js.parent.mkdir(parents=True, exist_ok=True)
    try:
        pf = preflight(config, launch.testbed, setup, plan, k, servers)
    except InfeasibleError as exc:  # as in the simulator: the method cannot serve this cluster at this rate
        details = {"config": config.name, "method": config.method, "round": r, "status": "infeasible",
                   "error": str(exc), "valid": False}
        js.write_text(json.dumps(details, indent=1) + "\n")
        log(f"[{config.name} r{r}] infeasible: {exc}")
        return details
    for line in preflight_lines(pf):
        log(line)
    log_dir = Path("/tmp") / f"petals_chain_t1e_{os.getpid()}_{config.name}_r{r}"
    swarm = TestbedSwarm(launch, setup, log_dir, max_batch_sessions=config.max_batch_sessions)
    swarm.device_log_dir = log_dir / "device"
    load_before = os.getloadavg()[0]
    live = LiveMethod(config.method, swarm, servers, arrival_rate=plan.replay_rate_per_s,
                      job=(int(round(job[0])), int(round(job[1]))), ready_timeout_s=600.0)
    details: dict[str, Any] = {"config": config.name, "method": config.method, "round": r, "time_dilation": k,
                               "preflight": pf, "command": getattr(args, "command", "")}
    try:
        info = live.start()
        log(f"[{config.name} r{r}] ready after {info.startup_s:.0f} s; replaying {plan.n} requests "
            f"over {plan.arrival_s[-1]:.0f} s")
        for p in swarm.device_log_dir.glob("*.csv"):  # the warm-up's steps are not the replay's
            p.write_text(p.read_text().splitlines(keepends=True)[0])
        res = replay(config.name, live.client.serve, plan, prompts, drain_timeout_s=DRAIN_NATIVE_S * k,
                     progress=_progress_printer(config.name, r, plan.n, log))
    except (MethodError, RuntimeError, OSError) as exc:
        details |= {"status": "failed", "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
        log(f"[{config.name} r{r}] failed: {details['error']}")
        return details
    finally:
        live.stop()
    validity = device_validity(swarm.device_log_dir)
    stats = summarize(res.records)
    details |= {"status": "ran", "stats_dilated": stats, "validity": validity,
                "valid": bool(validity["valid_share"] >= VALID_SHARE), "wall_s": res.wall_s,
                "placement": {n: list(span) for n, span in live.info.placement.items()},
                "chains": live.info.chains, "notes": live.info.notes,
                "loadavg_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
                "errors": sorted({rec.error for rec in res.records if rec.error})[:5]}
    if METHODS[config.method].routing is Routing.JFFC and live.info.chains:
        details["limit"] = distance_to_limit(res.records, live.info.chains).as_json()
    write_requests_csv(csv_path, res.records)  # dilated seconds, as measured
    js.write_text(json.dumps(details, indent=1, default=float) + "\n")
    kept = f"device time kept on {100 * validity['valid_share']:.2f} % of {validity['steps']} steps"
    if details["valid"]:
        log(f"[{config.name} r{r}] response mean {stats.get('response_mean', math.nan) / k:.2f} s, waiting "
            f"{stats.get('waiting_mean', math.nan) / k:.2f} s (native); {int(stats['served'])}/{plan.n} served; {kept}")
    else:  # its times are kept on file for diagnosis, never reported
        log(f"[{config.name} r{r}] INVALID: {kept} (below {100 * VALID_SHARE:g} %): not reported; "
            f"{int(stats['served'])}/{plan.n} served")
    return details


# ---- the whole run ---------------------------------------------------------------------------------------------


def prepare(args: argparse.Namespace) -> tuple[Any, Any, Any, ReplayPlan, list[np.ndarray], list[Config]]:
    """Validate everything before anything starts: testbed, dilation, trace, model, configurations."""
    from transformers import AutoConfig

    from petals_chain.data.azure import read_azure_trace
    from petals_chain.launch.live_setup import model_setup
    from petals_chain.launch.testbed import load_testbed

    names = [c.strip() for c in str(args.configs).split(",") if c.strip()]
    if bad := [c for c in names if c not in CONFIGS]:
        raise SpecError(f"--configs: unknown {', '.join(bad)}; choose from {', '.join(CONFIGS)}")
    if args.replays < 1 or args.requests < 2 or args.skip < 0:
        raise SpecError("--replays must be >= 1, --requests >= 2 and --skip >= 0")
    tb = load_testbed(args.testbed)
    if not tb.emulated:
        raise SpecError(f"{args.testbed}: its servers emulate no device (a 'device' on each of cpu_servers)")
    if args.time_dilation is not None:
        tb = tb.with_dilation(args.time_dilation)
    path = args.trace or (tb.trace.path if tb.trace is not None else None)
    if path is None or not Path(path).is_file():
        raise SpecError(f"trace file not found: {path} (set PETALS_CHAIN_DATA or pass --trace)")
    trace = read_azure_trace(Path(path), first_n=args.skip + args.requests)
    if trace.n_jobs < args.skip + args.requests:
        raise SpecError(f"{path}: {trace.n_jobs} requests, asked for {args.skip + args.requests}")
    if args.skip:
        from dataclasses import replace

        trace = replace(trace, arrival_s=trace.arrival_s[args.skip:], input_tokens=trace.input_tokens[args.skip:],
                        output_tokens=trace.output_tokens[args.skip:])
    tb.require_model()
    setup = model_setup(tb)
    if args.compose_rate is not None and not args.compose_rate > 0:
        raise SpecError(f"--compose-rate must be > 0 req/s, got {args.compose_rate}")
    plan = plan_native(trace, tb.time_dilation, setup.max_length, args.compose_rate)
    vocab = int(AutoConfig.from_pretrained(str(setup.model_dir)).vocab_size)
    return tb, trace, setup, plan, prompts_for(plan, vocab, args.seed), [CONFIGS[c] for c in names]


def main(argv: Sequence[str] | None = None) -> int:
    """Validate (exit 2 with one line on bad input), then run the missing replays round by round, or report."""
    args = parse_args(argv)
    args.command = "experiments/table1-emulated.sh " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.report:
        from petals_chain.experiments.table1_emulated_report import report

        for line in report(args.out):
            print(line)
        return 0
    try:
        tb, trace, setup, plan, prompts, configs = prepare(args)
    except (SpecError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for line in describe_plan(plan, trace):
        print(line)
    if args.preflight:
        for c in configs:
            for line in preflight_lines(preflight(c, tb, setup, plan, tb.time_dilation)):
                print(line)
        return 0
    if os.geteuid() != 0:
        print("error: the testbed needs root (network namespaces)", file=sys.stderr)
        return 2
    from petals_chain.launch.launcher import Launch

    logging.getLogger("petals").setLevel(logging.ERROR)
    (args.out / "replays").mkdir(parents=True, exist_ok=True)
    (args.out / "plan.json").write_text(json.dumps({"testbed": str(args.testbed), "requests": args.requests,
                                                    "skip": args.skip, "time_dilation": tb.time_dilation,
                                                    "seed": args.seed, "lines": describe_plan(plan, trace)},
                                                   indent=1) + "\n")
    t0 = time.monotonic()
    launch = Launch(tb, log=print)
    try:
        launch.up()
        for r in range(1, args.replays + 1):
            for c in configs:
                if replay_paths(args.out, c.name, r)[0].is_file():
                    continue
                if (time.monotonic() - t0) / 60 > args.budget_min:
                    print(f"budget of {args.budget_min:g} min spent: stopping before {c.name} r{r} (rerun to resume)")
                    return 0
                run_one(c, r, args, launch, setup, plan, prompts, print)
    finally:
        for problem in launch.down():
            print(f"teardown: {problem}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
