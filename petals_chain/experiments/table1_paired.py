"""Paired comparison of a Table 1 replay: every method replays the same arrivals, so request i of one method and
request i of another form a pair; the mean difference of their response times gets a Student-t 95 % interval.

``python -m petals_chain.experiments.table1_paired results/table1-x9/table1_requests.csv [--against proposed]``.
The pairs share a run's machine state, so the interval speaks of these replays, not of run-to-run variation.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from petals_chain.model import SpecError
from petals_chain.sim.montecarlo import confidence_interval


@dataclass(frozen=True)
class Paired:
    """Mean of (other − against) response over the shared requests, its 95 % CI and how often ``against`` won."""

    method: str
    against: str
    pairs: int
    mean_s: float
    low_s: float
    high_s: float
    faster_share: float  # share of requests on which ``against`` answered sooner

    def line(self) -> str:
        """One line for a report."""
        return (f"{self.method} − {self.against}: {self.mean_s:+.2f} s "
                f"(95 % CI [{self.low_s:+.2f}, {self.high_s:+.2f}], {self.pairs} pairs); "
                f"{self.against} faster on {100 * self.faster_share:.0f} % of requests")


def read_responses(path: Path) -> dict[str, dict[int, float]]:
    """Response seconds by method and request index from a ``table1_requests.csv``; SpecError if it is not one."""
    if not path.is_file():
        raise SpecError(f"{path}: no such file (written by experiments/table1.sh as STEM_requests.csv)")
    out: dict[str, dict[int, float]] = {}
    with path.open() as fh:
        for k, row in enumerate(csv.DictReader(fh)):
            try:
                if row.get("error") or row.get("censored") == "True":
                    continue  # an unanswered request has no response time to pair
                out.setdefault(row["method"], {})[int(row["request"])] = float(row["response_s"])
            except (KeyError, TypeError, ValueError) as exc:
                raise SpecError(f"{path}: row {k + 1} is not a Table 1 request record ({exc})") from None
    return out


def paired(responses: dict[str, dict[int, float]], against: str) -> list[Paired]:
    """Every other method against ``against`` over the requests both answered."""
    if against not in responses:
        raise SpecError(f"no requests of method {against!r}; methods: {', '.join(sorted(responses))}")
    base = responses[against]
    out = []
    for m, resp in responses.items():
        keys = sorted(set(resp) & set(base))
        if m == against or len(keys) < 2:
            continue
        d = np.array([resp[i] - base[i] for i in keys])
        ci = confidence_interval(d)
        out.append(Paired(m, against, ci.n, ci.mean, ci.ci_low, ci.ci_high, float(np.mean(d > 0))))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Print the paired differences of one replay's requests."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.experiments.table1_paired",
                                description=__doc__.splitlines()[0])
    p.add_argument("requests_csv", type=Path)
    p.add_argument("--against", default="proposed")
    args = p.parse_args(argv)
    try:
        rows = paired(read_responses(args.requests_csv), args.against)
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for r in rows:
        print(r.line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
