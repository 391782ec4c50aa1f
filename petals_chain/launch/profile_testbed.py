"""Profile a testbed's servers live, fit τ, plot, write a cluster: the command that drives the profiling run.

``python -m petals_chain.launch.profile_testbed TESTBED.yaml [--quick]`` brings the testbed up (namespaces,
delays), starts a whole-model PETALS server per testbed server, times prefill and decode steps over several block
counts, input and output lengths (one server at a time, :mod:`petals_chain.launch.profile_live`), fits the
paper's model (:mod:`petals_chain.launch.profile_fit`), measures τp(b) with b sessions batched (the servers' own
step logs; ``--unbatched`` profiles PETALS' one-at-a-time pool instead), probes the testbed's capacity with
closed-loop jobs, and
writes ``OUT/STEM.json``, ``OUT/STEM_samples.csv``, ``OUT/STEM.png`` (measured vs model, paper Figs 9-10) and
``OUT/STEM_cluster.yaml`` (the fitted τ for the composer: ``python -m petals_chain compose OUT/STEM_cluster.yaml``).
Everything is torn down at the end. Exit codes: 0 done, 2 bad input or the testbed could not be brought up.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from petals_chain.launch.testbed import TestbedError, load_testbed
from petals_chain.launch.testbed_format import REPO_ROOT
from petals_chain.model import SpecError

DEFAULT_JOB = (64, 24)  # τ are written for this job (≈ the Table 1 replay's mean scaled job)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.launch.profile_testbed",
                                description=__doc__.splitlines()[0])
    p.add_argument("testbed", help="testbed YAML (docs/testbed.md)")
    p.add_argument("--quick", action="store_true", help="fewer jobs per server and a shorter capacity probe")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "profile", help="output folder")
    p.add_argument("--stem", default=None, help="output file stem (default: the testbed's name)")
    p.add_argument("--servers", default="", help="profile only these servers (comma-separated names)")
    p.add_argument("--job-input-tokens", type=int, default=DEFAULT_JOB[0], help="l_in of the job τ are written for")
    p.add_argument("--job-output-tokens", type=int, default=DEFAULT_JOB[1], help="l_out of the job τ are written for")
    p.add_argument("--capacity-streams", type=int, default=None, help="closed-loop clients (default 2 per server)")
    p.add_argument("--capacity-s", type=float, default=None, help="probe length after warm-up (default 60, quick 30)")
    p.add_argument("--no-capacity", action="store_true", help="skip the capacity probe")
    p.add_argument("--batch-sizes", default="1,2,4,8",
                   help="sessions at once in the batch probe (comma-separated; default 1,2,4,8)")
    p.add_argument("--batch-steps", type=int, default=16, help="decode steps per session in the batch probe")
    p.add_argument("--unbatched", action="store_true",
                   help="profile PETALS' own pool (one session at a time): no batch probe, the old profile")
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Validate, bring up, measure, fit, write, tear down."""
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from petals_chain.launch.launcher import Launch, LaunchError
    from petals_chain.launch.live_setup import model_setup
    from petals_chain.launch.swarm_procs import MethodError
    from petals_chain.launch.profile_fit import FULL_GRID, QUICK_GRID, batch_slowdown, fit_server
    from petals_chain.launch.profile_results import Profile, write_batch_steps_csv, write_outputs
    from petals_chain.launch.profile_live import LiveProfiler

    try:
        tb = load_testbed(args.testbed)
        tb.require_model()
        setup = model_setup(tb)
        names = [n.strip() for n in args.servers.split(",") if n.strip()] or [s.name for s in tb.servers]
        known = {s.name for s in tb.servers}
        if unknown := [n for n in names if n not in known]:
            raise SpecError(f"--servers: unknown server(s) {', '.join(unknown)} (testbed has {', '.join(known)})")
        job = (args.job_input_tokens, args.job_output_tokens)
        if min(job) < 1 or sum(job) > setup.max_length:
            raise SpecError(f"--job-input-tokens/--job-output-tokens must be >= 1 with a sum <= {setup.max_length}")
        sizes = sorted({int(b) for b in args.batch_sizes.split(",") if b.strip()})
        if not sizes or sizes[0] < 1 or 1 not in sizes or args.batch_steps < 1:
            raise SpecError("--batch-sizes must list integers >= 1 including 1, and --batch-steps must be >= 1")
        if os.geteuid() != 0:
            raise SpecError("bringing a testbed up needs root (network namespaces)")
    except (TestbedError, SpecError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    grid = QUICK_GRID if args.quick else FULL_GRID
    stem = args.stem or tb.name
    streams = args.capacity_streams or 2 * len(names)
    probe_s = args.capacity_s or (30.0 if args.quick else 60.0)
    rng = np.random.default_rng(args.seed)
    log_dir = Path("/tmp") / f"petals_chain_profile_{os.getpid()}"
    print(f"profiling {len(names)} server(s) of {tb.name} ({setup.name}, {setup.num_blocks} blocks); "
          f"{len(grid.jobs(setup.num_blocks))} jobs each; logs in {log_dir}", flush=True)
    t0 = time.monotonic()
    launch = Launch(tb)
    try:
        launch.up()
        with LiveProfiler(launch, setup, log_dir, servers=names, session_tokens=max(grid.max_length(), sum(job)),
                          sessions_per_server=max(4, sizes[-1]), batched=not args.unbatched) as p:
            print(f"servers online after {time.monotonic() - t0:.0f} s", flush=True)
            from tqdm import tqdm

            bar = tqdm(total=len(names) * len(grid.jobs(setup.num_blocks)), desc="profile", unit="job")

            def progress(name: str, i: int, n: int) -> None:
                bar.set_postfix_str(name)
                bar.update(1)

            samples = p.measure(grid, rng, progress)
            bar.close()
            from petals_chain.launch.profile_results import write_samples_csv

            write_samples_csv(args.out / f"{stem}_samples.csv", samples)  # kept even if the probe below fails
            steps = {}
            if not args.unbatched:
                print(f"batch probe: {','.join(map(str, sizes))} sessions at once, {args.batch_steps} decode steps "
                      "each, per server", flush=True)
                steps = p.batch_probe(sizes, grid.base_input, args.batch_steps, seed=args.seed)
                write_batch_steps_csv(args.out / f"{stem}_batch_steps.csv", steps)
            cap = None
            if not args.no_capacity:
                print(f"capacity probe: {streams} closed-loop streams of l_in={job[0]}, l_out={job[1]} for "
                      f"{probe_s:g} s (+10 s warm-up)", flush=True)
                try:
                    cap = p.capacity(job[0], job[1], streams=streams, duration_s=probe_s, warmup_s=10.0,
                                     seed=args.seed)
                except RuntimeError as err:  # the fits are still worth writing; Table 1 then refuses the profile
                    print(f"warning: {err}; the profile is written without a capacity (probe again with a "
                          "longer --capacity-s)", file=sys.stderr, flush=True)
        servers = {s.name: s for s in tb.servers}
        fits = {n: fit_server(samples, n, rtt_s=servers[n].rtt_s, speed_factor=servers[n].speed_factor)
                for n in names}
        fits = {n: replace(f, batch_slowdown=batch_slowdown(steps[n], n)) if n in steps else f
                for n, f in fits.items()}
        profile = Profile(tb.name, setup.name, setup.num_blocks, setup.max_length, fits, cap, job,
                          datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          "python -m petals_chain.launch.profile_testbed " + " ".join(shlex.quote(a) for a in
                                                                              (argv or sys.argv[1:])))
        paths = write_outputs(args.out, stem, profile, samples, setup, {n: servers[n].memory_bytes for n in names},
                              grid)
        if steps:
            from petals_chain.launch.profile_results import plot_batch_curves

            paths["batch png"] = plot_batch_curves(args.out / f"{stem}_batch.png", steps, fits,
                                                   f"tau_p(b) of {tb.name}: measured inside each server")
    except (LaunchError, MethodError, RuntimeError, SpecError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: tearing down", file=sys.stderr)
        return 130
    finally:
        for problem in launch.down():
            print(f"teardown: {problem}", file=sys.stderr)
    li, lo = job
    print(f"{'server':8} {'speed':>5} {'RTT':>8} {'r (round trip)':>14} {'t_in':>9} {'t_out':>9} {'tau_p':>9} "
          f"{'tau_c':>8} {'model tau_c':>11} {'R2':>6}")
    for n, f in fits.items():
        print(f"{n:8} {f.speed_factor:5.3f} {f.rtt_s * 1e3:6.1f}ms {f.round_trip_s * 1e3:12.1f}ms "
              f"{f.t_in_s * 1e6:7.1f}us {f.t_out_s * 1e3:7.2f}ms {f.tau_p_s(li, lo) * 1e3:7.1f}ms "
              f"{f.tau_c_s(lo):7.3f}s {f.model_tau_c_s(lo):10.3f}s {f.r2:6.3f}")
    for n, f in fits.items():
        if f.batch_slowdown:
            print(f"{n}: tau_p(b)/tau_p(1) = {', '.join(f'{g:.2f}' for g in f.batch_slowdown)} (b = 1..)")
    if cap is not None:
        print(f"capacity: {cap.jobs_per_s:.3f} jobs/s of (l_in={cap.input_tokens}, l_out={cap.output_tokens}) with "
              f"{cap.streams} streams ({cap.completed} jobs in {cap.window_s:.0f} s, mean job {cap.mean_job_s:.2f} s)")
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")
    print(f"done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
