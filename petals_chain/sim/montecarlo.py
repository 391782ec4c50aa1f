"""Monte Carlo replications in parallel processes or on a Ray cluster, one independent seeded generator each, with
95 % CIs.

Replication r gets ``numpy.random.SeedSequence(seed).spawn(R)[r]``, so results
do not depend on the number of worker processes, on scheduling order or on the backend.
Local workers are started with the 'spawn' method (safe with numba and threads). With ``ray=ADDRESS`` the
replications are Ray tasks instead (README, "Experiments on a cluster"); Ray is imported only then.
"""

from __future__ import annotations

import csv
import json
import math
import multiprocessing
import os
import re
import socket
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from scipy import stats
from tqdm import tqdm

from petals_chain.data import DATA_ENV
from petals_chain.sim.engine import simulate
from petals_chain.sim.workloads import poisson_workload

Task = Callable[[np.random.SeedSequence, int], dict[str, Any]]
FORWARDED_ENV = (DATA_ENV,)  # what the replications read from the environment: set on every Ray worker as here


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


class RayBackendError(ValueError):
    """The Ray backend cannot be used: a malformed address, no Ray head there, or Ray not installed (one line)."""


RAY_VERSION = "2.60.0"  # requirements/project.txt
_RAY_ADDRESS = re.compile(r"(?:ray://)?(?P<host>\[[0-9A-Fa-f:]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):(?P<port>[0-9]{1,5})")
PROBE_TIMEOUT_S = 5.0  # a head that does not accept a TCP connection within this long is reported as unreachable


def parse_ray_address(text: str) -> str:
    """``text`` if it is ``auto`` or a Ray head's ``HOST:PORT`` (optionally ``ray://HOST:PORT``, Ray Client), else
    RayBackendError naming what was given."""
    m = _RAY_ADDRESS.fullmatch(text.strip())
    if text.strip() == "auto" or (m and 0 < int(m["port"]) < 65536):
        return text.strip()
    raise RayBackendError(f"--ray: expected auto or a Ray head's HOST:PORT (e.g. 10.0.0.1:6379), got {text!r}")


def add_ray_option(parser: Any) -> None:
    """Add ``--ray ADDRESS`` (checked where parsed: a malformed address is argparse's one-line error)."""

    def address(text: str) -> str:
        """The address as given, or argparse's one-line error naming --ray."""
        try:
            return parse_ray_address(text)
        except RayBackendError as exc:
            import argparse

            raise argparse.ArgumentTypeError(str(exc).removeprefix("--ray: ")) from None

    address.__name__ = "Ray address"
    parser.add_argument("--ray", type=address, default=None, metavar="ADDRESS",
                        help="run the replications as Ray tasks on the cluster whose head is ADDRESS (HOST:PORT, "
                             "as `ray start --head` prints), or `auto`: a running local Ray, else a new one in this "
                             "process; the same seeds, checkpoints and results as local processes")


def _unreachable(address: str, host: str, port: int, why: object) -> NoReturn:
    """Raise the one-line RayBackendError for a head that refused or did not answer, saying how to start one."""
    raise RayBackendError(f"--ray {address}: no Ray head answers at {host}:{port} ({why}); start one there with "
                          f"`ray start --head --port {port}`")


def connect_ray(address: str) -> Any:
    """The ``ray`` module, connected to ``address`` (see :func:`parse_ray_address`) unless this process already is
    (then that session is used as it is). RayBackendError, one line, for a malformed or unreachable address or a
    missing ``ray`` package; a concrete address is probed over TCP first (always: a stale address is reported even
    in a connected process), as Ray itself would retry for a minute.

    The variables of :data:`FORWARDED_ENV` set here (the data folder, which ``--data-dir`` also sets) are given to
    every task of this job: a worker on a head started without them inherits the head's environment, not ours."""
    address = parse_ray_address(address)
    try:
        import ray
    except ImportError:
        raise RayBackendError(f"--ray: the ray package is not installed (pip install ray=={RAY_VERSION})") from None
    if address != "auto":
        m = _RAY_ADDRESS.fullmatch(address)
        host, port = m["host"].strip("[]"), int(m["port"])
        try:
            with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
                pass
        except OSError as exc:
            _unreachable(address, host, port, exc.strerror or type(exc).__name__)
    if ray.is_initialized():
        return ray
    env = {k: os.environ[k] for k in FORWARDED_ENV if os.environ.get(k)}
    try:
        ray.init(address=None if address == "auto" else address, logging_level="WARNING", log_to_driver=False,
                 runtime_env={"env_vars": env} if env else None)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = ""
        if address != "auto" and os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
            # Ray sends its token to a named head only when told to: a head with token authentication (on whenever
            # a token file exists where it started) refuses us without it
            hint = ("; if the head uses token authentication, set RAY_AUTH_MODE=token here, with the head's token "
                    "in ~/.ray/auth_token or RAY_AUTH_TOKEN")
        raise RayBackendError(f"--ray {address}: cannot join the Ray cluster: {first}{hint}") from None
    return ray


def _call(task: Task, seed: np.random.SeedSequence, index: int) -> dict[str, Any]:
    """One replication inside a Ray worker."""
    return task(seed, index)


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


@dataclass(frozen=True)
class ReplicationSet:
    """The arguments of one :func:`run_replications` call, for :func:`run_replication_sets`."""

    task: Task
    replications: int
    seed: int
    checkpoint: str | Path | None = None
    desc: str = "replications"


class _SetRun:
    """One set's replications while they run: its seeds, the rows found in its checkpoint or computed, the
    checkpoint appended as each finishes, its progress bar."""

    def __init__(self, s: ReplicationSet, only: Collection[int] | None, progress: bool) -> None:
        if s.replications < 1:
            raise ValueError(f"run_replications: replications must be >= 1, got {s.replications}")
        if only is not None and (not only or not all(isinstance(r, (int, np.integer)) and 0 <= r < s.replications
                                                     for r in only)):
            raise ValueError(f"run_replications: only must name replications in 0..{s.replications - 1}, "
                             f"got {only!r}")
        self.task = s.task
        self.wanted = range(s.replications) if only is None else sorted({int(r) for r in only})
        self.children = np.random.SeedSequence(s.seed).spawn(s.replications)
        self.out: list[dict[str, Any] | None] = [None] * s.replications
        self.key = f"{s.task!r}|seed={s.seed}|R={s.replications}"
        self.sink = None
        if s.checkpoint is not None:
            checkpoint = Path(s.checkpoint)
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            for r, row in _load_checkpoint(checkpoint, self.key, s.replications).items():
                self.out[r] = row
            torn = (checkpoint.is_file() and checkpoint.stat().st_size > 0
                    and not checkpoint.read_bytes().endswith(b"\n"))
            self.sink = checkpoint.open("a")
            if torn:  # a line cut short by a kill: end it so the next row starts on a line of its own
                self.sink.write("\n")
        self.todo = [r for r in self.wanted if self.out[r] is None]
        self.bar = tqdm(total=len(self.wanted), initial=len(self.wanted) - len(self.todo), desc=s.desc,
                        disable=not progress, leave=False)

    def done(self, r: int, row: dict[str, Any]) -> None:
        """Keep replication ``r``'s row, appending it to the checkpoint at once."""
        self.out[r] = row
        if self.sink is not None:
            self.sink.write(json.dumps({"key": self.key, "r": r, "row": row}, default=float) + "\n")
            self.sink.flush()
        self.bar.update()

    def close(self) -> None:
        self.bar.close()
        if self.sink is not None:
            self.sink.close()

    def rows(self) -> list[dict[str, Any]]:
        return [self.out[r] for r in self.wanted if self.out[r] is not None]


def _run_locally(runs: list[_SetRun], workers: int | None) -> None:
    """Every set's missing replications over one pool of up to ``workers`` processes (default: the CPU count), or
    in this process with one; sets share the pool, so none waits for another's last replication. If one fails,
    those not started are cancelled, those already running are waited for and their rows kept (in the checkpoint
    too: a replication may have run for hours), and the first error is raised."""
    jobs = [(run, r) for run in runs for r in run.todo]
    n = max(1, min(len(jobs), workers or os.cpu_count() or 1))
    if n <= 1:
        for run, r in jobs:
            run.done(r, run.task(run.children[r], r))
        return
    error: BaseException | None = None
    with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(run.task, run.children[r], r): (run, r) for run, r in jobs}
        try:
            for fut in as_completed(futures):
                if fut.cancelled():
                    continue
                run, r = futures[fut]
                if fut.exception() is None:
                    run.done(r, fut.result())
                elif error is None:  # the first failure: start nothing more, keep what is already running
                    error = fut.exception()
                    for other in futures:
                        other.cancel()
        except BaseException:  # an interrupt here: nothing more is started
            for fut in futures:
                fut.cancel()
            raise
    if error is not None:
        raise error


def _run_on_ray(ray: Any, runs: list[_SetRun], in_flight: int | None) -> None:
    """Every set's missing replications as tasks of the connected ``ray``, all sets' in flight together (at most
    ``in_flight`` at once; None: all submitted, the cluster schedules them by its CPUs); the rest are cancelled if
    one fails."""
    remote = ray.remote(num_cpus=1)(_call)
    refs = {id(run): ray.put(run.task) for run in runs}  # each task shipped once, not once per replication
    queue = [(run, r) for run in runs for r in run.todo]
    pending: dict[Any, tuple[_SetRun, int]] = {}
    limit = in_flight or len(queue)
    try:
        while queue or pending:
            while queue and len(pending) < limit:
                run, r = queue.pop(0)
                pending[remote.remote(refs[id(run)], run.children[r], r)] = (run, r)
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                run, r = pending.pop(ref)
                run.done(r, ray.get(ref))
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)


def run_replication_sets(sets: Sequence[ReplicationSet], *, workers: int | None = None, progress: bool = True,
                         ray: str | None = None, only: Collection[int] | None = None) -> list[list[dict[str, Any]]]:
    """Several :func:`run_replications` at once: each set's rows, set by set, each with its own seeds and
    checkpoint, the same as a call of its own would give. The sets share the backend: one pool of ``workers``
    processes, or Ray with every set's replications in flight together (``workers`` then caps them all), so
    neither a cluster nor a pool waits for one set's last replication before starting the next set's."""
    ray_session = None if ray is None else connect_ray(ray)  # a bad address fails before anything runs or is written
    runs: list[_SetRun] = []
    try:
        for s in sets:
            runs.append(_SetRun(s, only, progress))
        if ray_session is not None:
            _run_on_ray(ray_session, runs, workers)
        else:
            _run_locally(runs, workers)
    finally:
        for run in runs:
            run.close()
    return [run.rows() for run in runs]


def run_replications(task: Task, replications: int, seed: int, *, workers: int | None = None,
                     progress: bool = True, desc: str = "replications",
                     checkpoint: str | Path | None = None,
                     only: Collection[int] | None = None, ray: str | None = None) -> list[dict[str, Any]]:
    """Run ``task(seed_sequence, r)`` for r = 0..R-1 (or the r in ``only``); results in replication order.

    ``task`` must be picklable (a module-level function or a dataclass instance
    with ``__call__``). ``workers=1`` runs in this process; the default uses up
    to ``os.cpu_count()`` processes. ``ray`` (a Ray head's HOST:PORT, or ``auto``) runs
    the replications as Ray tasks instead, ``workers`` (if given) capping how many are in flight;
    every node must import the same code (README, "Experiments on a cluster"). The rows are the
    same whatever the backend, and so are the checkpoints. With ``checkpoint`` (a JSONL file), every finished
    replication is appended as it completes and a rerun with the same task, seed and R
    computes only the missing ones (replication r always gets the same seed), so a
    long experiment survives being stopped and resumes where it was. ``only`` runs a subset
    with the seeds (and checkpoint rows) those replications have in the full set.
    """
    return run_replication_sets([ReplicationSet(task, replications, seed, checkpoint, desc)], workers=workers,
                                progress=progress, ray=ray, only=only)[0]


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
