"""``python -m petals_chain.launch TESTBED.yaml [--plan] [--apply] [--measure] [--hold] [--keep]`` and ``--teardown``.

Without flags (or with ``--plan``) it validates the testbed and prints the plan: MIG commands or
CPU emulation, namespaces, delays and which delay method this host supports. ``--apply`` brings
the testbed up (MIG instances, refused with exit 2 where no MIG-capable GPU matches; namespaces;
delays); ``--measure`` brings the network up and prints configured vs measured RTTs; ``--hold``
keeps it up until Ctrl-C. Everything is torn down on exit unless ``--keep``.
``--teardown [--tag T]`` removes what crashed launches left behind. Exit codes: 0 ok, 1 a
measured RTT out of tolerance or teardown incomplete, 2 bad input or refused.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from petals_chain.launch import latency, mig, mig_smi, plan, state
from petals_chain.launch.launcher import Launch, LaunchError
from petals_chain.launch.testbed import Testbed, TestbedError, load_testbed
from petals_chain.launch.testbed_format import DELAY_METHODS


def _teardown(tag: str | None) -> int:
    """Clean up after crashed launches (or the one ``tag`` names)."""
    cleaned, problems = state.teardown_stale(tag, lambda entries: mig.teardown_entries(entries))
    print(f"teardown: cleaned {', '.join(cleaned)}" if cleaned else "teardown: nothing to clean")
    for p in problems:
        print(f"teardown: {p}", file=sys.stderr)
    return 1 if problems else 0


def _mig_plan(tb: Testbed, smi: mig_smi.NvidiaSmi) -> tuple[mig.MigPlan, str, bool]:
    """The MIG plan (checked on this host's GPUs when it has matching ones), a note, and whether it can be applied."""
    gpus, why = mig.probe_gpus(smi)
    if gpus:
        problems = mig.check_gpus(tb, gpus)
        if not problems:
            return mig.plan_mig(tb, gpus), "checked on this host's GPUs", True
        why = "; ".join(problems)
    return mig.plan_mig(tb), f"NOT applicable here: {why}; profile IDs from NVIDIA's documented tables", False


def main(argv: list[str] | None = None) -> int:
    """CLI entry point."""
    ap = argparse.ArgumentParser(prog="python -m petals_chain.launch", description=__doc__.splitlines()[0])
    ap.add_argument("testbed", nargs="?", help="testbed YAML file (format: docs/testbed.md)")
    ap.add_argument("--plan", action="store_true", help="only validate and print the plan (the default)")
    ap.add_argument("--apply", action="store_true", help="bring the testbed up, MIG instances included")
    ap.add_argument("--measure", action="store_true", help="bring the network up, measure RTTs, compare")
    ap.add_argument("--hold", action="store_true", help="keep the testbed up until Ctrl-C / SIGTERM")
    ap.add_argument("--keep", action="store_true", help="leave it up after exit (undo with --teardown --tag T)")
    ap.add_argument("--method", choices=DELAY_METHODS, default=None,
                    help="override the testbed's latency.method")
    ap.add_argument("--count", type=int, default=20, help="round trips per measurement (default 20)")
    ap.add_argument("--pairs", default="", help="also measure between servers: 'i:j,k:l' (indices, i -> j)")
    ap.add_argument("--json", default=None, help="write the measurements to this JSON file")
    ap.add_argument("--teardown", action="store_true", help="remove what crashed launches left behind")
    ap.add_argument("--tag", default=None, help="with --teardown: only this launch (even if its owner runs)")
    args = ap.parse_args(argv)

    if args.teardown:
        return _teardown(args.tag)
    if not args.testbed:
        ap.error("a testbed file is required (or --teardown)")
    try:
        tb = load_testbed(args.testbed)
        pairs = [tuple(int(x) for x in p.split(":")) for p in args.pairs.split(",") if p.strip()]
        if any(len(p) != 2 or not all(0 <= x < len(tb.servers) for x in p) for p in pairs):
            raise TestbedError(f"--pairs: expected 'i:j' with server indices 0..{len(tb.servers) - 1}")
    except (TestbedError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2

    smi = mig_smi.NvidiaSmi()
    mig_plan, mig_note, mig_ok = _mig_plan(tb, smi) if tb.is_mig else (None, "", True)
    bring_up = args.apply or args.measure or args.hold
    launch = Launch(tb, method=args.method, smi=smi, keep=args.keep)
    method, detection = None, "not root: cannot create namespaces" if os.geteuid() != 0 else ""
    try:
        if os.geteuid() == 0:
            try:
                method = launch.detect()
                detection = launch.probe.detail
            except latency.DelayMethodError as err:
                print(f"error: {err}", file=sys.stderr)
                return 2
        print(plan.describe(tb, tag=launch.tag if launch.record else "TAG", method=method, detection=detection,
                            mig_plan=mig_plan, mig_note=mig_note), flush=True)
        if not bring_up:
            return 0
        if args.apply and tb.is_mig and not mig_ok:
            print("error: refusing to apply: no MIG-capable GPU matches this testbed (the plan above is what would "
                  "run on one)", file=sys.stderr)
            return 2
        if os.geteuid() != 0:
            print("error: bringing a testbed up needs root (network namespaces, MIG)", file=sys.stderr)
            return 2
        launch.up(with_mig=args.apply and tb.is_mig)
        for name, uuid in launch.mig_uuids.items():
            print(f"{name}: CUDA_VISIBLE_DEVICES={uuid}")
        rc = 0
        if args.measure:
            results = launch.measure(count=args.count, pairs=pairs)
            print(latency.format_results(results, launch.method), flush=True)
            if args.json:
                with open(args.json, "w") as fh:
                    json.dump({"testbed": tb.name, "method": launch.method, "detection": launch.probe.detail,
                               "results": [{**r.__dict__, "error_s": r.error_s, "ok": r.ok} for r in results]},
                              fh, indent=1)
            rc = 0 if all(r.ok for r in results) else 1
        print(f"ready tag={launch.tag} method={launch.method}", flush=True)
        if args.hold:
            print("holding: Ctrl-C (SIGINT) or SIGTERM tears the testbed down", flush=True)
            while True:
                signal.pause()
        if args.keep:
            print(f"kept: python -m petals_chain.launch --teardown --tag {launch.detach()}")
        return rc
    except (LaunchError, mig_smi.MigError, latency.DelayMethodError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: tearing down", file=sys.stderr)
        return 130
    finally:
        for p in launch.down():
            print(f"teardown: {p}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
