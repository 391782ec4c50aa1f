"""What the TORTA figures share: run settings, the per-topology comparison (cached per seed) and the paper's numbers.

docs/torta.md, "Experiments". Every figure's evaluations of one (topology, seed) come from one training: the shared
evaluation (:func:`shared_evaluation`) trains that seed's policies once and runs on its arrivals every method of
the main comparison (Figs 8–11), TORTA at every forecast accuracy of Fig 12 and, on the trust topologies, TORTA at
every trust of the PPO ablation. Its checkpoint (``torta-eval-TOPOLOGY``) serves whichever of those figures runs
first and every one after it; Figs 8–11 also keep their rows in results/torta-runs[-quick].csv.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Collection
from typing import Any

import numpy as np

from petals_chain.experiments.common import checkpoint_path, code_digest, mean_ci, replotting, write_csv
from petals_chain.experiments.torta_train import plot_curve
from petals_chain.sim.montecarlo import ReplicationSet, run_replication_sets
from petals_chain.torta.compare import evaluate, prepare
from petals_chain.torta.params import DEFAULT, FULL_EPISODES, QUICK_EPISODES, QUICK_SCALE, TortaParams, scaled

TOPOLOGIES = ("abilene", "polska", "gabriel25", "cost266")
PAPER_NAME = {"abilene": "Abilene", "polska": "Polska", "gabriel25": "Gabriel", "cost266": "Cost2"}
ORDER = ("TORTA", "SkyLB", "SDIB", "RR", "OT-only", "OT-unbalanced", "RL-no-OT")
PAS = (0.1, 0.3, 0.5, 0.7, 0.9)  # Fig 12: the noisy oracle's prediction accuracies
TRUSTS = (0.15, 0.5, 1.0)  # the PPO ablation: policy_trust values (0.15 is DEFAULT's)
TRUST_TOPOLOGIES = ("abilene", "polska")
ANCHOR_TRUST = 1e-9  # the anchor alone: a trust region no policy can move in (policy_trust must be > 0)
# Figs 8, 9, 10 of the paper: (TORTA, SkyLB, SDIB, RR)
PAPER = {
    "mean_response_s": {"abilene": (16.39, 18.72, 19.66, 21.50), "cost266": (19.31, 21.58, 22.51, 24.39),
                        "gabriel25": (17.58, 20.07, 21.10, 22.92), "polska": (19.19, 20.53, 21.53, 23.18)},
    "load_balance": {"abilene": (.765, .733, .735, .716), "cost266": (.743, .714, .709, .688),
                     "gabriel25": (.755, .729, .726, .708), "polska": (.745, .715, .708, .686)},
    "power_cost": {"abilene": (12.5, 14.3, 14.3, 14.7), "cost266": (11.1, 13.2, 13.2, 13.3),
                   "gabriel25": (10.7, 12.8, 12.8, 12.9), "polska": (14.1, 15.2, 15.2, 15.3)},
    "switching": {"abilene": (0.8, 2.9, 2.8, 3.7), "cost266": (2.7, 4.4, 4.3, 5.1),
                  "gabriel25": (1.3, 3.3, 3.2, 4.0), "polska": (2.3, 3.4, 3.4, 4.0)},
}


@dataclass(frozen=True)
class RunSettings:
    """Horizon, seeds, training episodes and parameters of a run (``--quick`` shrinks all of them). How the run is
    executed (``workers``, ``ray``) is left out of its repr, which keys the checkpoints: a seed finished by one
    backend is reused by another."""

    slots: int
    seeds: int
    episodes: int
    params: TortaParams
    workers: int | None = field(default=None, repr=False, compare=False)
    ray: str | None = field(default=None, repr=False, compare=False)


def settings(args: Any) -> RunSettings:
    """The settings for ``args.quick``: the full day scaled to 32 slots (``scaled(DEFAULT, QUICK_SCALE)``), 5 seeds,
    15 PPO episodes with a small trunk; else the paper's (480 slots, 150 episodes). Two worker processes by default;
    with ``--ray`` the cluster decides, unless ``--workers`` caps the seeds in flight."""
    ray = getattr(args, "ray", None)
    workers = getattr(args, "workers", None) or (None if ray else 2)
    if args.quick:
        params = scaled(DEFAULT, QUICK_SCALE).with_(policy_hidden=(64, 128, 64), epochs=4)
        return RunSettings(params.slots, 5, QUICK_EPISODES, params, workers, ray)
    return RunSettings(DEFAULT.slots, 5, FULL_EPISODES, DEFAULT, workers, ray)


def integer_seed(seed: np.random.SeedSequence) -> int:
    """The integer seed an evaluation seed's replication hands to :func:`~petals_chain.torta.compare.prepare`: the
    same for :class:`EvalTask` and :class:`AnchorTask`, so the anchor arm plays the shared evaluation's system,
    predictor and arrivals."""
    return int(seed.generate_state(1)[0] % 2**31)


@dataclass(frozen=True)
class AnchorTask:
    """One evaluation seed of one topology with the macro layer's anchor alone: the exponentially smoothed OT plan
    TORTA's policy is held near, played by a policy held to it (trust :data:`ANCHOR_TRUST`), so no training
    matters; beside it OT-only, whose rows must equal the shared evaluation's. Same seed, arrivals and predictor as
    :class:`EvalTask`'s (the predictor is trained before and apart from PPO), without the PPO episodes: the arm that
    says what the learned layer adds to its own anchor (docs/torta.md, "PPO ablation")."""

    topology: str
    rs: RunSettings
    base_seed: int

    def __call__(self, seed: np.random.SeedSequence, index: int) -> dict[str, Any]:
        """The anchor's row (method "anchor") and OT-only's ("OT-only (anchor run)") under 'rows', without a trust
        (the ablation pairs them with TORTA's rows under each of its trusts)."""
        st = prepare(self.topology, self.rs.params.with_(policy_trust=ANCHOR_TRUST), self.rs.slots, 0,
                     integer_seed(seed), progress=False)
        names = {"TORTA": "anchor", "OT-only": "OT-only (anchor run)"}
        return {"rows": [{**r, "method": names[r["method"]], "accuracy": float("nan")}
                         for r in evaluate(st, ("TORTA", "OT-only"))]}


@dataclass(frozen=True)
class EvalTask:
    """One evaluation seed of one topology (picklable for the process pool): train for that seed's system, then
    run each (forecast accuracy, methods) pair of ``runs`` on its arrivals (accuracy None: the learned predictor)."""

    topology: str
    rs: RunSettings
    base_seed: int
    runs: tuple[tuple[float | None, tuple[str, ...]], ...] = ((None, ORDER),)
    # where the first seed's policy is saved; not part of the repr, which keys the checkpoint rows (an absolute path
    # there made a clone elsewhere recompute every seed)
    checkpoint_dir: Path | None = field(default=None, repr=False, compare=False)
    trusts: tuple[float, ...] = ()  # TORTA also at these policy_trust values (learned predictor), rows tagged 'trust'

    def __call__(self, seed: np.random.SeedSequence, index: int) -> dict[str, Any]:
        """Rows under 'rows' (with their 'accuracy' and 'trust'), the learning curve under 'curve'."""
        st = prepare(self.topology, self.rs.params, self.rs.slots, self.rs.episodes, integer_seed(seed), progress=False,
                     checkpoint_dir=self.checkpoint_dir if index == 0 else None)
        own = st.params.policy_trust
        rows = [{**r, "accuracy": float("nan") if acc is None else acc, "trust": own}
                for acc, methods in self.runs for r in evaluate(st, methods, acc)]
        for trust in self.trusts:
            if trust != own:  # the trust bounds decisions only: the same training serves it
                at = dataclasses.replace(st, params=st.params.with_(policy_trust=trust))
                rows += [{**r, "accuracy": float("nan"), "trust": trust} for r in evaluate(at, ("TORTA",))]
        return {"rows": rows, "curve": st.curve}


Runs = tuple[tuple[float | None, tuple[str, ...]], ...]  # (forecast accuracy or None, methods) pairs


SHARED_RUNS: Runs = ((None, ORDER),) + tuple((pa, ("TORTA",)) for pa in PAS)
_SHARED: dict[tuple[Any, ...], tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]] = {}  # in-process


def evaluate_topology(topology: str, args: Any, rs: RunSettings, seeds: int,
                      runs: Runs = ((None, ORDER),), stem: str = "torta-runs",
                      trusts: tuple[float, ...] = ()) -> list[dict[str, Any]]:
    """Every seed of ``topology`` (policies trained per seed's system); writes the first seed's learning curve.
    A full run keeps each finished seed in a checkpoint (``stem``-topology), so hours of training resume."""
    return _evaluate(topology, args, rs, seeds, runs, stem, trusts)[0]


def _evaluate(topology: str, args: Any, rs: RunSettings, seeds: int, runs: Runs, stem: str,
              trusts: tuple[float, ...]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(every seed's rows, the first seed's learning curve); the curve's CSV and PNG written."""
    out = run_replication_sets([_replication_set(topology, args, rs, seeds, runs, stem, trusts)],
                               workers=rs.workers, ray=rs.ray)[0]
    rows, curves = _finish(topology, args, rs, out)
    return rows, curves[0]


def _replication_set(topology: str, args: Any, rs: RunSettings, seeds: int, runs: Runs, stem: str,
                     trusts: tuple[float, ...]) -> ReplicationSet:
    """The seeds of one topology as the Monte-Carlo runner takes them, with their checkpoint (full runs)."""
    task = EvalTask(topology, rs, args.seed, runs, args.out / "checkpoints", trusts)
    return ReplicationSet(task, seeds, args.seed, checkpoint_path(f"{stem}-{topology}", args, __name__),
                          f"train + eval {topology}")


def _finish(topology: str, args: Any, rs: RunSettings,
            out: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """(every seed's rows, every seed's learning curve in seed order) of one topology's replications; the first
    seed's curve written as CSV and PNG."""
    curve = out[0]["curve"]
    name = f"torta-train-{topology}"
    write_csv(args.out / f"{name}.csv", curve)
    plot_curve(curve, args.out / f"{name}.png", f"PPO on {topology} (first seed of --seed {args.seed}, "
               f"{rs.episodes} episodes)")
    return [r for rep in out for r in rep["rows"]], [rep["curve"] for rep in out]


def _shared_key(topology: str, args: Any, rs: RunSettings) -> tuple[Any, ...]:
    return (topology, repr(rs), args.seed, bool(args.quick), str(args.out))


def shared_evaluations(topologies: tuple[str, ...], args: Any, rs: RunSettings) -> None:
    """Run the shared evaluation (:func:`shared_evaluation`) of every topology of ``topologies`` not yet done in
    this process, all their seeds together (one pool of ``--workers`` processes, or Ray with ``--ray``), so neither
    waits for one topology's last seed before starting the next's, and a cluster larger than one topology's seeds
    is used."""
    todo = [t for t in topologies if _shared_key(t, args, rs) not in _SHARED]
    sets = [_replication_set(t, args, rs, rs.seeds, SHARED_RUNS, "torta-eval", TRUSTS if t in TRUST_TOPOLOGIES else ())
            for t in todo]
    for topology, out in zip(todo, run_replication_sets(sets, workers=rs.workers, ray=rs.ray)):
        _SHARED[_shared_key(topology, args, rs)] = _finish(topology, args, rs, out)


def anchor_evaluation(topologies: tuple[str, ...], args: Any, rs: RunSettings) -> list[dict[str, Any]]:
    """:class:`AnchorTask`'s rows for every seed of ``topologies`` (a full run keeps them in the ``torta-anchor``
    checkpoints; every topology's seeds together)."""
    sets = [ReplicationSet(AnchorTask(t, rs, args.seed), rs.seeds, args.seed,
                           checkpoint_path(f"torta-anchor-{t}", args, __name__), f"anchor alone {t}")
            for t in topologies]
    return [r for out in run_replication_sets(sets, workers=rs.workers, ray=rs.ray) for rep in out
            for r in rep["rows"]]


def shared_evaluation(topology: str, args: Any,
                      rs: RunSettings) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """One training per seed of ``topology`` for every TORTA figure: the rows of the main comparison (accuracy NaN,
    the default trust), of Fig 12 (TORTA at each accuracy in :data:`PAS`) and, on :data:`TRUST_TOPOLOGIES`, of the
    PPO ablation (TORTA at each trust in :data:`TRUSTS`); and every seed's learning curve, in seed order. Kept per
    topology in the ``torta-eval`` checkpoint (full runs) and for the rest of the process (so one process that draws
    several figures trains once)."""
    shared_evaluations((topology,), args, rs)
    return _SHARED[_shared_key(topology, args, rs)]


def select_rows(rows: list[dict[str, Any]], methods: Collection[str] | None = None, *, oracle: bool = False,
                trust: float | None = None) -> list[dict[str, Any]]:
    """The rows of a shared evaluation of ``methods`` (None: all) with the learned predictor (``oracle`` False,
    accuracy NaN) or with Fig 12's noisy oracle at any accuracy (True), at policy trust ``trust`` (None: any)."""
    return [r for r in rows if (methods is None or r["method"] in methods)
            and math.isnan(float(r["accuracy"])) != oracle and (trust is None or float(r["trust"]) == trust)]


def main_rows(rows: list[dict[str, Any]], rs: RunSettings,
              methods: Collection[str] | None = None) -> list[dict[str, Any]]:
    """The main comparison's rows of a shared evaluation (of ``methods``; None: all): the learned predictor, the
    run's own trust."""
    return select_rows(rows, methods, trust=rs.params.policy_trust)


def comparison_rows(args: Any) -> list[dict[str, Any]]:
    """Every method × topology × seed (cached in results/torta-runs[-quick].csv for this --seed and this very code:
    each row carries the package's code digest, so changed code never reuses stale rows; ``--replot`` reads the
    saved rows whatever their digest, to redraw the figures only)."""
    path = args.out / f"torta-runs{'-quick' if args.quick else ''}.csv"
    if replotting(args):  # the saved rows as they are, whatever code made them: nothing is trained or run
        saved = read_rows(path)
        if not saved:
            raise FileNotFoundError(f"{path}: no saved comparison to redraw (run the figure without --replot first)")
        return saved
    digest = code_digest()
    cached = read_rows(path)
    if cached and all(int(r["base_seed"]) == args.seed and r.get("code_digest") == digest for r in cached):
        return cached
    rs = settings(args)
    rows: list[dict[str, Any]] = []
    shared_evaluations(TOPOLOGIES, args, rs)
    for topo in TOPOLOGIES:
        rows += [{**r, "base_seed": args.seed, "code_digest": digest}
                 for r in main_rows(shared_evaluation(topo, args, rs)[0], rs)]
    write_csv(path, rows)
    return read_rows(path)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a comparison CSV with numbers parsed ([] if missing)."""
    if not path.exists():
        return []
    with path.open() as fh:
        rows = list(csv.DictReader(fh))
    for r in rows:
        for k, v in r.items():
            if k not in ("topology", "method", "code_digest"):
                r[k] = float(v)
    return rows


def stat(rows: list[dict[str, Any]], topo: str, method: str, key: str) -> tuple[float, float]:
    """Mean and 95 % CI half-width of ``key`` over seeds."""
    return mean_ci([r[key] for r in rows if r["topology"] == topo and r["method"] == method])


def ratio_lines(rows: list[dict[str, Any]], key: str, label: str, fmt: str = ".2f") -> list[str]:
    """One line per topology: every method's mean ± CI, TORTA/SkyLB ratio, and the paper's ratio."""
    lines = []
    for topo in TOPOLOGIES:
        parts = []
        for m in ORDER:
            mu, hw = stat(rows, topo, m, key)
            parts.append(f"{m} {mu:{fmt}} ± {hw:{fmt}}")
        sky = stat(rows, topo, "SkyLB", key)[0]
        ours = stat(rows, topo, "TORTA", key)[0] / sky - 1 if sky else float("nan")
        pap = f" (paper {PAPER[key][topo][0] / PAPER[key][topo][1] - 1:+.1%})" if key in PAPER else ""
        lines.append(f"{PAPER_NAME[topo]} {label}: " + "; ".join(parts) + f". TORTA vs SkyLB {ours:+.1%}{pap}")
    return lines


ABLATIONS = ("OT-only", "OT-unbalanced", "RL-no-OT")  # our ablations of TORTA, hatched in the bar plots


def bar_figure(rows: list[dict[str, Any]], keys: list[tuple[str, str]], title: str):
    """Grouped bars (topology × method) with 95 % CI error bars, one panel per key; the ablations hatched; one
    legend for the figure, below the panels (inside, it covered bars)."""
    from matplotlib.patches import Patch

    from petals_chain.experiments.common import figure

    fig, axes = figure(1, len(keys), figsize=(6.5 * len(keys), 4.6))
    width = 0.8 / len(ORDER)
    styles = {m: {"facecolor": f"C{j}", "edgecolor": "black" if m in ABLATIONS else "white", "lw": 0.3,
                  "hatch": "//" if m in ABLATIONS else None} for j, m in enumerate(ORDER)}
    for ax, (key, label) in zip(axes[0], keys):
        stats_ = {m: [stat(rows, t, m, key) for t in TOPOLOGIES] for m in ORDER}
        top = axis_top([mu + (0 if np.isnan(hw) else hw) for st in stats_.values() for mu, hw in st])
        for j, m in enumerate(ORDER):
            st = stats_[m]
            x = np.arange(len(TOPOLOGIES)) + j * width
            ax.bar(x, [min(s[0], top) for s in st], width,
                   yerr=[0 if np.isnan(s[1]) or s[0] + s[1] > top else s[1] for s in st], capsize=2, **styles[m])
            for xi, (mu, hw) in zip(x, st):  # a bar cut at the axis' top says its value where it is cut
                if mu + (0 if np.isnan(hw) else hw) > top:
                    ax.annotate(f"{mu:.0f} ± {hw:.0f}", (xi, top), xytext=(-2, -4), textcoords="offset points",
                                rotation=90, ha="right", va="top", fontsize=8)
        if top < math.inf:
            ax.set_ylim(0, top)
        ax.set_xticks(np.arange(len(TOPOLOGIES)) + 0.4 - width / 2)
        ax.set_xticklabels([PAPER_NAME[t] for t in TOPOLOGIES])
        ax.grid(axis="x", visible=False)
        ax.set_ylabel(label)
    fig.legend(handles=[Patch(label=m + (" (ablation)" if m in ABLATIONS else ""), **styles[m]) for m in ORDER],
               loc="outside lower center", ncol=4 if len(keys) == 1 else len(ORDER), frameon=False, fontsize=9)
    fig.suptitle(title)
    return fig


def axis_top(tops: list[float], gap: float = 3.0) -> float:
    """Where a bar panel's axis ends: infinity (matplotlib decides) unless, above the median bar (mean + CI), the
    sorted bars jump by more than ``gap`` times from one to the next; then 1.25 times the bar below the jump, so that
    one method's collapse (RL-no-OT's hundreds of seconds on Gabriel and Cost266) does not flatten every other bar,
    while a quantity that merely differs by topology (switching) keeps its whole axis."""
    finite = sorted(t for t in tops if np.isfinite(t))
    upper = [t for t in finite if t >= float(np.median(finite))] if finite else []
    for low, high in zip(upper, upper[1:]):
        if low > 0 and high > gap * low:
            return 1.25 * low
    return math.inf


def bar_plot(rows: list[dict[str, Any]], keys: list[tuple[str, str]], path: Path, title: str) -> None:
    """Draw :func:`bar_figure` to ``path``."""
    from petals_chain.experiments.common import save_figure

    save_figure(bar_figure(rows, keys, title), path)
