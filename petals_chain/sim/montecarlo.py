"""Monte Carlo replications in parallel processes, one independent seeded generator each, with 95 % CIs.

Replication r gets ``numpy.random.SeedSequence(seed).spawn(R)[r]``, so results
do not depend on the number of worker processes or on scheduling order.
Workers are started with the 'spawn' method (safe with numba and threads).
"""

from __future__ import annotations

import csv
import json
import math
import multiprocessing
import os
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats
from tqdm import tqdm

from petals_chain.sim.engine import simulate
from petals_chain.sim.workloads import poisson_workload

Task = Callable[[np.random.SeedSequence, int], dict[str, Any]]


@dataclass(frozen=True)
class Summary:
    """Sample mean of n replications with a Student-t confidence interval."""

    mean: float
    std: float
    n: int
    ci_low: float
    ci_high: float
    level: float = 0.95

    @property
    def half_width(self) -> float:
        return (self.ci_high - self.ci_low) / 2


def confidence_interval(values: Sequence[float] | np.ndarray, level: float = 0.95) -> Summary:
    """Mean, sample std and the two-sided Student-t CI at ``level`` (infinite width for one value)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("confidence_interval: no values")
    if not 0 < level < 1:
        raise ValueError(f"confidence_interval: level must be in (0, 1), got {level!r}")
    mean = float(x.mean())
    if x.size == 1:
        return Summary(mean, math.nan, 1, -math.inf, math.inf, level)
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1)) * std / math.sqrt(x.size)
    return Summary(mean, std, int(x.size), mean - half, mean + half, level)


def _load_checkpoint(path: Path, key: str, replications: int) -> dict[int, dict[str, Any]]:
    """Rows already computed for this (task, seed, R) in a JSONL checkpoint; other keys and torn lines ignored."""
    done: dict[int, dict[str, Any]] = {}
    if not path.is_file():
        return done
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill: recomputed
            continue
        if entry.get("key") == key and 0 <= entry.get("r", -1) < replications:
            done[int(entry["r"])] = entry["row"]
    return done


def run_replications(task: Task, replications: int, seed: int, *, workers: int | None = None,
                     progress: bool = True, desc: str = "replications",
                     checkpoint: str | Path | None = None,
                     only: Collection[int] | None = None) -> list[dict[str, Any]]:
    """Run ``task(seed_sequence, r)`` for r = 0..R-1 (or the r in ``only``); results in replication order.

    ``task`` must be picklable (a module-level function or a dataclass instance
    with ``__call__``). ``workers=1`` runs in this process; the default uses up
    to ``os.cpu_count()`` processes. With ``checkpoint`` (a JSONL file), every finished
    replication is appended as it completes and a rerun with the same task, seed and R
    computes only the missing ones (replication r always gets the same seed), so a
    long experiment survives being stopped and resumes where it was. ``only`` runs a subset
    with the seeds (and checkpoint rows) those replications have in the full set.
    """
    if replications < 1:
        raise ValueError(f"run_replications: replications must be >= 1, got {replications}")
    if only is not None and (not only or not all(isinstance(r, (int, np.integer)) and 0 <= r < replications
                                                 for r in only)):
        raise ValueError(f"run_replications: only must name replications in 0..{replications - 1}, got {only!r}")
    wanted = range(replications) if only is None else sorted({int(r) for r in only})
    children = np.random.SeedSequence(seed).spawn(replications)
    out: list[dict[str, Any] | None] = [None] * replications
    key = f"{task!r}|seed={seed}|R={replications}"
    sink = None
    if checkpoint is not None:
        checkpoint = Path(checkpoint)
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        for r, row in _load_checkpoint(checkpoint, key, replications).items():
            out[r] = row
        torn = checkpoint.is_file() and checkpoint.stat().st_size > 0 and not checkpoint.read_bytes().endswith(b"\n")
        sink = checkpoint.open("a")
        if torn:  # a line cut short by a kill: end it so the next row starts on a line of its own
            sink.write("\n")
    todo = [r for r in wanted if out[r] is None]
    workers = max(1, min(len(todo), workers or os.cpu_count() or 1))

    def done(r: int, row: dict[str, Any]) -> None:
        out[r] = row
        if sink is not None:
            sink.write(json.dumps({"key": key, "r": r, "row": row}, default=float) + "\n")
            sink.flush()
        bar.update()

    bar = tqdm(total=len(wanted), initial=len(wanted) - len(todo), desc=desc, disable=not progress, leave=False)
    try:
        if workers <= 1:
            for r in todo:
                done(r, task(children[r], r))
        else:
            ctx = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                futures = {pool.submit(task, children[r], r): r for r in todo}
                for fut in as_completed(futures):
                    done(futures[fut], fut.result())
    finally:
        bar.close()
        if sink is not None:
            sink.close()
    return [out[r] for r in wanted if out[r] is not None]


def summarize(rows: Sequence[dict[str, Any]], keys: Sequence[str] | None = None,
              level: float = 0.95) -> dict[str, Summary]:
    """Per-key Summary over replications (default: every numeric key except 'replication')."""
    if not rows:
        raise ValueError("summarize: no rows")
    if keys is None:
        keys = [k for k, v in rows[0].items()
                if k != "replication" and isinstance(v, (int, float, np.number)) and not isinstance(v, bool)]
    return {k: confidence_interval([row[k] for row in rows], level) for k in keys}


def write_csv(rows: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write one row per replication (columns from the first row)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def write_json(summary: dict[str, Summary], path: str | Path, **meta: Any) -> Path:
    """Write summaries (mean, std, n, CI) plus any metadata as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "summary": {k: asdict(v) for k, v in summary.items()}}
    path.write_text(json.dumps(doc, indent=2, default=float) + "\n")
    return path


@dataclass(frozen=True)
class PoissonPolicyRun:
    """A picklable task: one Poisson/exponential replication of ``policy`` on fixed chains.

    The replication's generator draws the workload first, then the policy's tie-breaks.
    """

    rates: tuple[float, ...]
    capacities: tuple[int, ...]
    policy: str
    arrival_rate_per_s: float
    n_jobs: int
    warmup_fraction: float = 0.1
    engine: str = "auto"

    def __call__(self, seed: np.random.SeedSequence, index: int) -> dict[str, Any]:
        rng = np.random.default_rng(seed)
        workload = poisson_workload(self.arrival_rate_per_s, self.n_jobs, rng)
        warmup = int(self.warmup_fraction * self.n_jobs)
        result = simulate(self.rates, self.capacities, workload, self.policy, rng=rng, warmup_jobs=warmup,
                          engine=self.engine)
        return {"replication": index, **result.summary()}
