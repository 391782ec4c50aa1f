"""Simulation of the moldable loss system (docs/moldable.md, "Simulator"): one run's measures and checks,
picklable replications for :func:`petals_chain.sim.montecarlo.run_replications`, and their CIs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.model import SpecError
from petals_chain.moldable import kernel as K
from petals_chain.moldable.optimal import check_load, optimal_allocation
from petals_chain.moldable.policies import scheme_probabilities
from petals_chain.moldable.speedup import SpeedUp
from petals_chain.sim.montecarlo import Summary, confidence_interval, run_replications

SAMPLE_PATH_TOL = 1e-9  # relative error allowed in the exact sample-path identities
LITTLE_TOL = 0.01  # relative error allowed in the time-averaged laws (3) and (4)


class InvariantError(RuntimeError):
    """A run broke an exact invariant of the loss system (a bug, never a statistical fluctuation)."""


def regime_load(n: int, alpha: float, beta: float) -> float:
    """λ⁽ⁿ⁾ = 1 - β n^(-α): per-server load of the scaling regime (α = 0 mean field, ½ Halfin-Whitt)."""
    if int(n) != n or n < 1:
        raise SpecError(f"n: must be an integer >= 1, got {n!r}")
    if not (np.isfinite(alpha) and alpha >= 0):
        raise SpecError(f"alpha: must be finite and >= 0, got {alpha!r}")
    if not (np.isfinite(beta) and 0 < beta < n ** alpha):
        raise SpecError(f"beta: must be in (0, n^alpha) so that 0 < λ < 1, got {beta!r}")
    return 1.0 - beta * n ** (-alpha)


@dataclass(frozen=True)
class MoldableRun:
    """One replication: n servers, per-server load λ, a speed-up, a scheme ('greedy-p' or 'greedy'), a size law."""

    n: int
    load: float
    speedup: tuple[float, ...]
    scheme: str = "greedy-p"
    dist: str = "exp"
    arrivals: int = 5_000_000

    def __post_init__(self) -> None:
        """Refuse a bad n, size law, arrival count, load or scheme before any run starts."""
        if int(self.n) != self.n or self.n < 1:
            raise SpecError(f"n: must be an integer >= 1, got {self.n!r}")
        if self.dist not in K.DISTS:
            raise SpecError(f"dist: unknown size law {self.dist!r}; choose one of {', '.join(K.DISTS)}")
        if int(self.arrivals) != self.arrivals or self.arrivals < 1:
            raise SpecError(f"arrivals: must be an integer >= 1, got {self.arrivals!r}")
        check_load(self.load)
        scheme_probabilities(SpeedUp(self.speedup), self.load, self.scheme)

    def __call__(self, seed: np.random.SeedSequence | int, index: int = 0) -> dict[str, Any]:
        """Run the kernel with a generator seeded by ``seed``; return the run's measures and checks."""
        sp = SpeedUp(self.speedup)
        p = scheme_probabilities(sp, self.load, self.scheme)
        cum = np.cumsum(p)
        cum[-1] = 1.0
        support = optimal_allocation(sp, self.load).support
        area, out = K.new_outputs(sp.d)
        K.moldable_kernel(int(self.n), sp.array(), cum, self.n * self.load, int(self.arrivals), K.DISTS[self.dist],
                          np.random.default_rng(seed), support[0], area, out)
        return {"replication": index, **measures(sp, self.n, self.load, area, out)}


def measures(sp: SpeedUp, n: int, load: float, area: np.ndarray, out: np.ndarray) -> dict[str, Any]:
    """Turn the kernel's sums into P_b, both E[D] estimators, x̄_i, E[r]; raise InvariantError on a broken identity."""
    horizon = out[K.HORIZON]
    area_jobs = float(area.sum())
    area_r = float((area * sp.array()).sum())
    jobs_path = out[K.DONE_D] + out[K.REMAIN_D]
    work_path = out[K.DONE_S] + out[K.REMAIN_R]
    if out[K.OVERFLOW] > 0:
        raise InvariantError(f"more than n = {n} servers busy at {int(out[K.OVERFLOW])} admissions")
    if abs(area_jobs - jobs_path) > SAMPLE_PATH_TOL * max(1.0, area_jobs):
        raise InvariantError(f"Little's law on the sample path: ∫N dt = {area_jobs!r} but Σ time in system = "
                             f"{jobs_path!r}")
    if abs(area_r - work_path) > SAMPLE_PATH_TOL * max(1.0, area_r):
        raise InvariantError(f"work on the sample path: ∫r dt = {area_r!r} but work done = {work_path!r}")
    if out[K.BLOCKED] + out[K.ADMITTED] != out[K.ARRIVALS]:
        raise InvariantError("blocked + admitted != arrivals")
    x = area / (n * horizon)
    throughput = out[K.ADMITTED] / (n * horizon)  # λ(1 - P_b) measured
    exec_all = out[K.SUM_D] / max(out[K.ADMITTED], 1)
    row: dict[str, Any] = {
        "blocking": out[K.BLOCKED] / out[K.ARRIVALS],
        "exec_time_all": exec_all,
        "exec_time_done": out[K.DONE_D] / max(out[K.DONE], 1),
        "occupancy_jobs": float(x.sum()),
        "busy_fraction": float((x * np.arange(1, sp.d + 1)).sum()),
        "rate_r": float((x * sp.array()).sum()),
        "throughput": throughput,
        "little_rel_err": abs(throughput * exec_all - x.sum()) / x.sum(),
        "work_rel_err": abs(throughput * out[K.SUM_S] / max(out[K.ADMITTED], 1) - (x * sp.array()).sum())
        / (x * sp.array()).sum(),
        "max_jobs_below_i1": int(out[K.MAX_BELOW]),
        "max_servers_per_job": int(out[K.MAX_K]),
        "horizon": horizon,
    }
    for i in range(sp.d):
        row[f"x{i + 1}"] = float(x[i])
    return row


def replicate(run: MoldableRun, runs: int, seed: int, *, workers: int | None = None, progress: bool = True,
              desc: str = "moldable runs", ray: str | None = None) -> list[dict[str, Any]]:
    """``runs`` independent replications (SeedSequence.spawn) on all cores, or on the Ray cluster ``ray``."""
    return run_replications(run, runs, seed, workers=workers, progress=progress, desc=desc, ray=ray)


@dataclass(frozen=True)
class CellBatch:
    """Several configurations × ``runs`` replications as one picklable task, so one process pool serves them all:
    replication index r runs cell r // runs (each replication still gets its own spawned seed)."""

    cells: tuple[MoldableRun, ...]
    runs: int

    def __call__(self, seed: np.random.SeedSequence, index: int) -> dict[str, Any]:
        """Run replication ``index`` of cell ``index // runs``; the row says which cell."""
        cell, rep = divmod(index, self.runs)
        return {"cell": cell, **self.cells[cell](seed, rep)}


def replicate_cells(cells: list[MoldableRun], runs: int, seed: int, *, workers: int | None = None,
                    progress: bool = True, desc: str = "moldable runs",
                    checkpoint: str | Path | None = None, ray: str | None = None) -> list[list[dict[str, Any]]]:
    """``runs`` replications of every cell in one pool (or on the Ray cluster ``ray``); returns the rows grouped by
    cell, in order.

    ``checkpoint``: a JSONL file that makes the run resumable (see ``run_replications``)."""
    rows = run_replications(CellBatch(tuple(cells), runs), len(cells) * runs, seed, workers=workers,
                            progress=progress, desc=desc, checkpoint=checkpoint, ray=ray)
    return [rows[c * runs:(c + 1) * runs] for c in range(len(cells))]


def summarise(rows: list[dict[str, Any]], keys: tuple[str, ...] = ("blocking", "exec_time_done", "exec_time_all"),
              ) -> dict[str, Summary]:
    """Student-t 95 % CIs of the main measures over replications."""
    return {k: confidence_interval([r[k] for r in rows]) for k in keys}
