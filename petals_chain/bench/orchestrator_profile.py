"""`python -m petals_chain.bench orchestrator-profile`: where an orchestrator's time per lease + release goes.

Runs ``python -m petals_chain.bench orchestrator`` (its HTTP part, the arguments after ``--``) under py-spy
(``py-spy record --subprocesses --idle --threads --nonblocking --format raw``), then splits each orchestrator child's
samples on its event-loop thread into the items below and prints a table per child (one per ``--persistence``
mode): the share of the loop's busy time and µs per round trip. ``--raw FILE`` splits a recording made before.

A busy sample counts once, for the first rule that matches: stdlib ``json``, ``logging`` or ``sqlite3`` anywhere on
its stack; else the innermost frame of the orchestrator's own code (credentials: the auth middleware and
``auth.py``; request validation: ``request_body.py`` and ``protocol/parsing.py``; persistence: ``persist.py``,
``store.py`` and the wait for the group commit; the policy call: ``dispatch/``; lease bookkeeping: ``leases.py``,
``migration.py``, ``recent.py``; the handlers, ``lease_json`` and responses: ``api.py``, ``core.py``,
``protocol/replies.py``); else aiohttp (the HTTP server) or asyncio (the event loop).
So aiohttp work a handler asks for (building its response) counts for the handler, not for aiohttp. Samples
before the server listens (imports, the first composition) and the loop's waits in ``select`` are left out; the
other threads (the store's commit worker) are reported apart. µs per round trip divide the samples by the rate and
by every round trip the child served (``--requests`` + the warm-up at each ``--concurrency`` level).
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
from pathlib import Path

LEAF = (("JSON encode/decode (stdlib json)", r"json/(encoder|decoder|__init__)\.py"),
        ("logging", r"logging/__init__\.py"),
        ("persistence (sqlite3)", r"sqlite3"))
OURS = (("credentials (auth middleware, auth.py)", r"orchestrator/trust/auth\.py|_auth_middleware|_authorize "),
        ("request validation (request_body.py, protocol/parsing.py)",
         r"orchestrator/http/request_body\.py|protocol/parsing\.py"),
        ("persistence (persist.py, store.py, the wait for the commit)",
         r"orchestrator/(persist|store)\.py"),
        ("the policy call (JFFC)", r"petals_chain/dispatch/"),
        ("lease bookkeeping (leases.py, migration.py, recent.py)", r"orchestrator/(leases|migration|recent)\.py"),
        ("handlers, lease_json, responses (api.py, core.py, protocol/replies.py)",
         r"orchestrator/(api|core|chains)\.py|protocol/replies\.py"),
        ("other petals_chain code", r"petals_chain/(?!bench/|orchestrator/event_loop\.py)"))
LIBRARIES = (("aiohttp HTTP server (parse, route, write)", r"aiohttp/"), ("asyncio event loop", r"asyncio/"))


def _item(code: list[str]) -> str:
    """The item one busy event-loop sample (its frames, outermost first) counts for."""
    for name, rx in LEAF:
        if any(re.search(rx, f) for f in code):
            return name
    for frame in reversed(code):
        for name, rx in OURS:
            if re.search(rx, frame):
                return name
    for name, rx in LIBRARIES:
        if any(re.search(rx, f) for f in code):
            return name
    return "other: " + code[-1][:60]


def split(raw: str) -> dict[str, dict[str, int]]:
    """Per orchestrator child (its py-spy process line): sample counts per item, plus '(startup)', '(idle)' and
    '(other threads busy)'."""
    out: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in raw.splitlines():
        m = re.match(r"^(.*) (\d+)$", line)
        if not m:
            continue
        frames, n = m.group(1).split(";"), int(m.group(2))
        procs = [f for f in frames if f.startswith("process ")]
        thread = next((f for f in frames if f.startswith("thread ")), "")
        code = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not procs or not code or "resource_tracker" in procs[-1]:
            continue
        if "spawn_main" not in procs[-1]:  # the driving process: the benchmark's HTTP clients
            if "_http_level" in line and not re.search(r"select \(selectors\.py", code[-1]):
                out["driver"]["(clients busy)"] += n
            continue
        child = procs[-1].split(":", 1)[0]
        if "MainThread" not in thread:
            waiting = re.search(r"wait|_worker \(concurrent|acquire", code[-1])
            out[child]["(other threads idle)" if waiting else "(other threads busy)"] += n
        elif not any("_run_once" in f for f in code) or any(
                re.search(r"<locals>\.main \(.*bench/orchestrator", f) or "importlib._bootstrap" in f for f in code):
            out[child]["(startup)"] += n
        elif re.search(r"select \(selectors\.py", code[-1]):
            out[child]["(idle)"] += n
        else:
            out[child][_item(code)] += n
    return {k: dict(v) for k, v in out.items()}


def report(counts: dict[str, dict[str, int]], rate: float, round_trips: int) -> None:
    """Print one table per child (in the order they started: --persistence order)."""
    per = 1e6 / rate / round_trips
    children = {k: v for k, v in counts.items() if k != "driver"}
    driver = counts.get("driver", {}).get("(clients busy)", 0) / max(1, len(children))  # it drives them in turns
    print(f"the driving process (the benchmark's aiohttp clients, on the same cores): {driver * per:.0f} µs busy per "
          "round trip")
    for child, items in sorted(children.items(), key=lambda kv: int(kv[0].split()[1])):
        busy = {k: v for k, v in items.items() if not k.startswith("(")}
        total = sum(busy.values())
        if total == 0:
            continue
        print(f"\n{child}: {total} busy samples on the event loop = {total * per:.0f} µs per round trip "
              f"({items.get('(idle)', 0)} idle, {items.get('(startup)', 0)} before serving; other threads: "
              f"{items.get('(other threads busy)', 0) * per:.0f} µs per round trip busy)")
        print("| where | share of the loop's busy time | µs per lease + release |")
        print("|---|---|---|")
        for name, v in sorted(busy.items(), key=lambda kv: -kv[1]):
            print(f"| {name} | {100 * v / total:.1f} % | {v * per:.0f} |")


def run(argv: list[str] | None = None) -> int:
    """Record (or read) the py-spy samples and print the split."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.bench orchestrator-profile", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--raw", type=Path, default=None, help="split this py-spy raw recording instead of recording")
    p.add_argument("--out", type=Path, default=Path("orchestrator-profile.raw"), help="where to write the recording")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--round-trips", type=int, default=None,
                   help="round trips each child served (default: from the bench arguments)")
    p.add_argument("bench", nargs=argparse.REMAINDER,
                   help="after '--': the arguments of `bench orchestrator` (default: --concurrency 32 --requests "
                        "20000 --persistence off normal --no-tls --pairs 2000 --loop asyncio: py-spy sees asyncio's "
                        "loop in Python, and tells its idle wait from its work; uvloop's runs in C)")
    args = p.parse_args(argv)
    bench = [a for a in args.bench if a != "--"] or ["--concurrency", "32", "--requests", "20000", "--persistence",
                                                     "off", "normal", "--no-tls", "--pairs", "2000", "--loop",
                                                     "asyncio"]
    if args.round_trips is None:
        b = argparse.ArgumentParser(add_help=False)
        b.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
        b.add_argument("--requests", type=int, default=2000)
        known, _ = b.parse_known_args(bench)
        args.round_trips = len(known.concurrency) * (known.requests + min(50, known.requests))
    if args.raw is None:
        spy = shutil.which("py-spy")
        if spy is None:
            print("error: py-spy is not installed (pip install py-spy)", file=sys.stderr)
            return 2
        cmd = [spy, "record", "--subprocesses", "--idle", "--threads", "--nonblocking", "--format", "raw",
               "--rate", str(args.rate), "-o", str(args.out), "--",
               sys.executable, "-m", "petals_chain.bench", "orchestrator", *bench]
        print(" ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0:
            print("error: the profiled benchmark failed", file=sys.stderr)
            return 1
        args.raw = args.out
    if not args.raw.is_file():
        print(f"error: no recording at {args.raw}", file=sys.stderr)
        return 2
    report(split(args.raw.read_text()), args.rate, args.round_trips)
    return 0
