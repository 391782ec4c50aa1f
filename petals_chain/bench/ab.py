"""``python -m petals_chain.bench ab --base REV [--turns N] -- BENCH [options]``: one benchmark on an older commit and
on the working tree, in turns, in one run.

A speed claim ("no slowdown", "x times faster") needs its baseline measured beside it on the same machine at the
same time, not taken from an old file. This checks ``REV`` out into a temporary git worktree, then runs
``python -m petals_chain.bench BENCH ...`` there ("old") and in the working tree ("new") ``--turns`` times each, the
order alternating (old new, new old, ...) so that a drift of the machine falls on both sides, and prints each run's
output under a header with the side, the turn and the load average. Both sides use this interpreter and its installed
packages; each side imports its own ``petals_chain`` (``PYTHONPATH`` is its checkout).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _run_side(checkout: Path, bench: list[str]) -> tuple[int, str]:
    """Run the benchmark with ``checkout``'s petals_chain; (exit code, its stdout, and the last lines of its stderr
    if it failed: progress bars and warnings are not figures)."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    proc = subprocess.run([sys.executable, "-m", "petals_chain.bench", *bench], cwd=checkout, env=env,
                          capture_output=True, text=True)
    tail = "" if proc.returncode == 0 else "\n".join(proc.stderr.splitlines()[-5:])
    return proc.returncode, proc.stdout + tail


def run(argv: list[str] | None = None) -> int:
    """Parse, make the worktree, run the turns, remove the worktree; 2 on bad input, 1 if a run failed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    bench = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m petals_chain.bench ab", description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the older commit (any git revision) to measure against")
    p.add_argument("--turns", type=int, default=3, help="runs of each side (default 3)")
    args = p.parse_args(own)
    if not bench or bench[0] == "ab":
        print("error: give the benchmark after '--', e.g. -- orchestrator --client raw", file=sys.stderr)
        return 2
    if args.turns < 1:
        print("error: --turns must be >= 1", file=sys.stderr)
        return 2
    rev = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=REPO, capture_output=True, text=True)
    if rev.returncode != 0:
        print(f"error: --base {args.base!r} is not a git revision of {REPO}", file=sys.stderr)
        return 2
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "worktree", "add", "--detach", str(old), rev.stdout.strip()], cwd=REPO, check=True,
                       capture_output=True)
        try:
            print(f"# python -m petals_chain.bench {' '.join(bench)}")
            print(f"# old = {rev.stdout.strip()}, new = working tree on {head.strip()}; {args.turns} turns, order "
                  "alternating; load averages with each run")
            failed = False
            for turn in range(1, args.turns + 1):
                sides = [("old", old), ("new", REPO)]
                for side, checkout in sides if turn % 2 else sides[::-1]:
                    print(f"## {side} {turn} load {_load()}", flush=True)
                    code, out = _run_side(checkout, bench)
                    print(out.rstrip(), flush=True)
                    if code != 0:
                        print(f"## {side} {turn} exited {code}")
                        failed = True
            print(f"# load after {_load()}")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=REPO, capture_output=True)
    return 1 if failed else 0
