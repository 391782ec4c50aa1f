"""Merge profiles of disjoint server groups of one testbed into one profile (fits, samples, capacity).

On a shared machine a testbed can be profiled a few servers at a time (``profile --servers s0,s3,s4``), which
keeps the live swarm small; each server's fit only ever uses its own steps (one server is timed at a time),
so the fits do not depend on the grouping. The capacity probe does: each group's probe measures that group
alone. On a CPU testbed whose servers all share the same cores the groups' capacities are each about what
the cores give, so the merged capacity is the median group's (``sum`` is the choice for a testbed whose
groups have their own hardware, as the paper's GPUs do). ``python -m petals_chain.launch.profile_merge
TESTBED.yaml PART_STEM... --stem STEM [--capacity median|sum]``.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from petals_chain.launch.profile_fit import FULL_GRID, Capacity, StepSample
from petals_chain.launch.profile_results import (
    Profile,
    load_profile,
    plot_batch_curves,
    read_batch_steps_csv,
    read_samples_csv,
    write_batch_steps_csv,
    write_outputs,
)
from petals_chain.model import SpecError

CAPACITY_RULES = ("median", "sum")


def merge_capacity(caps: Sequence[Capacity], rule: str = "median") -> Capacity:
    """One capacity for the whole testbed from the groups' probes: the median group's, or their sum."""
    if rule not in CAPACITY_RULES:
        raise SpecError(f"--capacity must be one of {', '.join(CAPACITY_RULES)}, got {rule!r}")
    if not caps:
        raise SpecError("no capacity probe in any part (profile the groups without --no-capacity)")
    if len({(c.input_tokens, c.output_tokens) for c in caps}) > 1:
        raise SpecError("the parts' capacity probes used different job shapes; profile them with the same job")
    ranked = sorted(caps, key=lambda c: c.jobs_per_s)
    if rule == "median":
        return ranked[(len(ranked) - 1) // 2]
    return replace(ranked[0], jobs_per_s=sum(c.jobs_per_s for c in caps), streams=sum(c.streams for c in caps),
                   completed=sum(c.completed for c in caps))


def merge_profiles(parts: Sequence[Profile], command: str, rule: str = "median", testbed: str | None = None) -> Profile:
    """The parts' fits together, named ``testbed`` (default the first part's); SpecError if a server is in two
    parts or the parts differ in model, cache or job. Parts may come from testbed files that share servers (a
    group's own file, e.g. one A100's worth): :func:`check_servers` checks they are the same servers."""
    if not parts:
        raise SpecError("no profiles to merge")
    first = parts[0]
    fits = {}
    for p in parts:
        if (p.model, p.num_blocks, p.max_length, p.job) != (first.model, first.num_blocks, first.max_length,
                                                            first.job):
            raise SpecError(f"profile of {p.testbed} ({p.model}, {p.num_blocks} blocks, max_length {p.max_length}, "
                            f"job {p.job}) differs from the first part's ({first.model}, "
                            f"{first.num_blocks}, {first.max_length}, {first.job})")
        if dup := sorted(set(fits) & set(p.fits)):
            raise SpecError(f"server(s) {', '.join(dup)} profiled in two parts")
        fits.update(p.fits)
    # a part's probe ran on that part's servers (older parts did not record them)
    caps = [c if c.servers else replace(c, servers=tuple(p.fits)) for p in parts if (c := p.capacity) is not None]
    return Profile(testbed or first.testbed, first.model, first.num_blocks, first.max_length, fits,
                   merge_capacity(caps, rule), first.job, max(p.created for p in parts), command)


def check_servers(profile: Profile, servers: dict[str, tuple[float, float]], where: str) -> None:
    """Every fitted server is in the testbed with the same RTT and speed factor ((rtt_s, speed_factor) by name)."""
    for n, f in profile.fits.items():
        if n not in servers:
            raise SpecError(f"{where}: no server {n}")
        rtt, speed = servers[n]
        if not (math.isclose(f.rtt_s, rtt, rel_tol=1e-6) and math.isclose(f.speed_factor, speed, rel_tol=1e-6)):
            raise SpecError(f"{where}: server {n} has RTT {rtt * 1e3:.3f} ms and speed {speed:g}, its profile "
                            f"{f.rtt_s * 1e3:.3f} ms and {f.speed_factor:g}: not the same server")


def main(argv: Sequence[str] | None = None) -> int:
    """Read the parts (STEM.json + STEM_samples.csv each), merge, write the outputs as the profiler does."""
    from petals_chain.launch.live_setup import model_setup
    from petals_chain.launch.testbed import TestbedError, load_testbed
    from petals_chain.launch.testbed_format import REPO_ROOT

    p = argparse.ArgumentParser(prog="python -m petals_chain.launch.profile_merge", description=__doc__.splitlines()[0])
    p.add_argument("testbed")
    p.add_argument("parts", nargs="+", help="stems of the parts' outputs (PATH/STEM without .json)")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "results" / "profile")
    p.add_argument("--stem", required=True)
    p.add_argument("--capacity", default="median", choices=CAPACITY_RULES)
    args = p.parse_args(argv)
    try:
        tb = load_testbed(args.testbed)
        parts = [load_profile(f"{s}.json") for s in args.parts]
        samples: list[StepSample] = []
        for s in args.parts:
            samples += read_samples_csv(Path(f"{s}_samples.csv"))
        cmds = "; ".join(re.sub(r" --out \S+", "", p.command) for p in parts)  # the parts' folder is scratch
        profile = merge_profiles(parts, f"{cmds}; merged with --capacity {args.capacity}", args.capacity, tb.name)
        servers = {s.name: s for s in tb.servers}
        check_servers(profile, {n: (s.rtt_s, s.speed_factor) for n, s in servers.items()}, str(args.testbed))
        paths = write_outputs(args.out, args.stem, profile, samples, model_setup(tb),
                              {n: servers[n].memory_bytes for n in profile.fits}, FULL_GRID)
        steps: dict = {}
        for s in args.parts:  # the batch probes' batches, where the parts ran one
            if Path(f"{s}_batch_steps.csv").is_file():
                steps |= read_batch_steps_csv(Path(f"{s}_batch_steps.csv"))
        if steps:
            paths["batch steps"] = write_batch_steps_csv(args.out / f"{args.stem}_batch_steps.csv", steps)
            paths["batch png"] = plot_batch_curves(args.out / f"{args.stem}_batch.png", steps, profile.fits,
                                                   f"tau_p(b) of {tb.name}: measured inside each server")
    except (SpecError, TestbedError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for kind, path in paths.items():
        print(f"wrote {kind}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
