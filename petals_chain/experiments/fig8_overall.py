"""Fig. 8: overall comparison — proposed vs PETALS vs BPRR (and JFFC only) over J × η, BLOOM-176B (§4.1.3).

Every Monte Carlo run draws a cluster (RIPE Atlas locations, which servers are
high-end) and one Poisson workload; all methods serve that same workload
(common random numbers). Output: fig8_runs.csv (one row per run), fig8.csv
(mean response per setting and method with 95 % Student-t CIs), fig8_reductions.csv
and fig8.png; the summary carries the table of % reductions next to the paper's 8–83 %.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from petals_chain.compose.method_table import METHODS
from petals_chain.experiments.common import (Summary, backend, checkpoint_path, read_csv, replotting, save_figure,
                                             write_csv)
from petals_chain.experiments.paper import DEFAULT, draw_cluster, model
from petals_chain.model import InfeasibleError, SpecError
from petals_chain.sim.montecarlo import confidence_interval, run_replications
from petals_chain.sim.systems import build_system, simulate_system
from petals_chain.sim.workloads import poisson_workload

FULL = {"Js": (10, 20, 30, 40), "etas": (0.1, 0.2, 0.3, 0.4), "runs": 20, "n_jobs": 5000}
QUICK = {"Js": (10, 20, 40), "etas": (0.1, 0.2, 0.4), "runs": 5, "n_jobs": 2000}
WARMUP_FRACTION = 0.1
OVERLOAD_RATIO = 0.9  # a run whose completions fall below 90 % of its arrival rate is flagged overloaded
PAPER_REDUCTION = (8.0, 83.0)
REPLOT = True  # `--replot` redraws fig8.png and the summary from results/fig8_runs.csv
BASELINES = ("petals", "petals_capped", "bprr", "bprr_oracle", "jffc_only", "paper", "max-chains")


@dataclass(frozen=True)
class Fig8Run:
    """One Monte Carlo run (picklable): replication ``index`` → setting index // runs, run index % runs."""

    settings: tuple[tuple[int, float], ...]
    runs: int
    n_jobs: int
    arrival_rate: float = DEFAULT.arrival_rate
    target_load: float = DEFAULT.target_load
    methods: tuple[str, ...] = tuple(METHODS)  # which methods' columns the row gets

    def __call__(self, seed: np.random.SeedSequence, index: int) -> dict[str, Any]:
        J, eta = self.settings[index // self.runs]
        rng = np.random.default_rng(seed)
        servers = draw_cluster(J, eta, rng)
        workload = poisson_workload(self.arrival_rate, self.n_jobs, rng)
        warmup = int(WARMUP_FRACTION * self.n_jobs)
        kept = workload.arrival_s[warmup:]
        offered = (kept.size - 1) / float(kept[-1] - kept[0])
        row: dict[str, Any] = {"J": J, "eta": eta, "run": index % self.runs}
        for method in self.methods:
            try:
                system = build_system(method, servers, model(), self.arrival_rate, self.target_load)
                res = simulate_system(system, workload, warmup)
            except InfeasibleError as exc:
                row |= {f"{method}_status": "infeasible", f"{method}_mean_response_s": math.nan,
                        f"{method}_mean_waiting_s": math.nan, f"{method}_mean_service_s": math.nan,
                        f"{method}_note": str(exc)[:120]}
                continue
            overloaded = res.throughput_per_s < OVERLOAD_RATIO * offered
            note = ", ".join(f"{k}={v}" for k, v in system.info.items())
            row |= {f"{method}_status": "overloaded" if overloaded else "ok",
                    f"{method}_mean_response_s": res.mean_response_s, f"{method}_mean_waiting_s": res.mean_waiting_s,
                    f"{method}_mean_service_s": res.mean_service_s, f"{method}_note": note}
        return row


def aggregate(rows: list[dict[str, Any]], settings: tuple[tuple[int, float], ...]) -> list[dict[str, Any]]:
    """Per setting and method: mean response/waiting/service over feasible runs, 95 % CI, status counts."""
    out = []
    for J, eta in settings:
        mine = [r for r in rows if r["J"] == J and r["eta"] == eta]
        for method in METHODS:
            vals = [r[f"{method}_mean_response_s"] for r in mine if r[f"{method}_status"] != "infeasible"]
            row: dict[str, Any] = {"J": J, "eta": eta, "method": method, "runs": len(mine), "feasible_runs": len(vals),
                                   "overloaded_runs": sum(r[f"{method}_status"] == "overloaded" for r in mine)}
            if vals:
                ci = confidence_interval(vals)
                row |= {"mean_response_s": ci.mean, "ci95_half_s": ci.half_width if len(vals) > 1 else math.nan}
                for part in ("waiting", "service"):
                    row[f"mean_{part}_s"] = float(np.mean([r[f"{method}_mean_{part}_s"] for r in mine
                                                           if r[f"{method}_status"] != "infeasible"]))
            else:
                row |= {"mean_response_s": math.nan, "ci95_half_s": math.nan, "mean_waiting_s": math.nan,
                        "mean_service_s": math.nan}
            out.append(row)
    return out


def reductions(rows: list[dict[str, Any]], settings: tuple[tuple[int, float], ...]) -> list[dict[str, Any]]:
    """% reduction of the proposed mean response vs each baseline, over runs where both are feasible (paired).

    A cell where either side was overloaded in some run has no steady-state mean to compare (its queue grows for
    the whole run): no percentage and no interval, ``vs_<base>_overloaded_runs`` says in how many runs."""
    out = []
    for J, eta in settings:
        mine = [r for r in rows if int(r["J"]) == J and float(r["eta"]) == eta]
        row: dict[str, Any] = {"J": J, "eta": eta}
        for base in BASELINES:
            pairs = [(float(r["proposed_mean_response_s"]), float(r[f"{base}_mean_response_s"])) for r in mine
                     if r["proposed_status"] != "infeasible" and r[f"{base}_status"] != "infeasible"]
            over = sum("overloaded" in (r["proposed_status"], r[f"{base}_status"]) for r in mine)
            row[f"vs_{base}_overloaded_runs"] = over
            if pairs and not over:
                p, b = np.array(pairs).T
                row[f"vs_{base}_pct"] = 100.0 * (1.0 - p.mean() / b.mean())
                row[f"vs_{base}_runs"] = len(pairs)
                ci = confidence_interval(b - p)  # paired: > 0 means proposed is faster
                row[f"vs_{base}_diff_lo_s"], row[f"vs_{base}_diff_hi_s"] = ci.ci_low, ci.ci_high
            else:
                row[f"vs_{base}_pct"] = math.nan
                row[f"vs_{base}_runs"] = 0
                row[f"vs_{base}_diff_lo_s"] = row[f"vs_{base}_diff_hi_s"] = math.nan
        out.append(row)
    return out


# The two rows of fig8.png: the paper's comparison (its baselines) and the proposed scheme's own variants; seven
# bars a group in one row could not be told apart.
ROWS = (("vs the baselines", ("proposed", "petals", "petals_capped", "bprr", "bprr_oracle", "jffc_only")),
        ("vs its own variants", ("proposed", "paper", "max-chains")))
COLORS = {"proposed": "tab:green", "jffc_only": "tab:purple", "petals": "tab:red", "petals_capped": "tab:pink",
          "bprr": "tab:blue", "bprr_oracle": "lightsteelblue", "paper": "tab:orange", "max-chains": "tab:brown"}


def figure(agg: list[dict[str, Any]], Js: tuple[int, ...], etas: tuple[float, ...], runs: int):
    """One column per J, one row per group of methods (ROWS): bars over η with 95 % CI whiskers.

    A cell where any run was overloaded (completions below OVERLOAD_RATIO of arrivals: the queue grows for the
    whole run, so its mean response has no steady-state value and grows with the run's length) gets no bar but
    the words "overloaded n/runs"; a cell with no feasible run says "infeasible"."""
    from matplotlib.patches import Patch

    from petals_chain.experiments.common import figure as new_figure

    by = {(r["J"], r["eta"], r["method"]): r for r in agg}
    feasible = {m for m in METHODS if any(r["method"] == m and r["feasible_runs"] for r in agg)}
    never = [m for m in METHODS if m not in feasible]
    rows = [(title, [m for m in ms if m in feasible]) for title, ms in ROWS]
    rows += [("other methods", [m for m in METHODS if m in feasible and all(m not in ms for _, ms in ROWS)])]
    rows = [(title, ms) for title, ms in rows if ms]
    colors = COLORS | {m: "tab:gray" for m in METHODS if m not in COLORS}
    fig, axes = new_figure(len(rows), len(Js), figsize=(3.3 * len(Js) + 1.2, 3.2 * len(rows) + 1.4),
                           sharey="row")
    prop = [r["mean_response_s"] for r in agg if r["method"] == "proposed" and r["feasible_runs"]
            and not r["overloaded_runs"]]
    cap = 3.0 * max(prop) if prop else None  # a finite mean far above the proposed scheme's is cut and written
    for row, (title, methods) in enumerate(rows):
        width = 0.8 / len(methods)
        for ax, J in zip(axes[row], Js):
            for k, method in enumerate(methods):
                for i, eta in enumerate(etas):
                    r = by[(J, eta, method)]
                    x = i + (k - (len(methods) - 1) / 2) * width
                    if r["feasible_runs"] == 0 or r["overloaded_runs"]:
                        word = "infeasible" if r["feasible_runs"] == 0 else \
                            f"overloaded {int(r['overloaded_runs'])}/{int(r['runs'])}"
                        ax.text(x, 0.02, word, transform=ax.get_xaxis_transform(), rotation=90, ha="center",
                                va="bottom", fontsize=7, color="black")
                        continue
                    y = r["mean_response_s"]
                    e = 0.0 if math.isnan(r["ci95_half_s"]) else r["ci95_half_s"]
                    if cap is not None and y + e > cap:
                        ax.bar(x, cap, width, color=colors[method], hatch="//", edgecolor="black")
                        ax.text(x, 0.5 * cap, f"{y:.0f} s (cut)", rotation=90, ha="center", va="center",
                                fontsize=7, color="black", bbox={"facecolor": "white", "lw": 0, "pad": 1})
                        continue
                    ax.bar(x, y, width, yerr=e, capsize=2, color=colors[method], edgecolor="white", lw=0.3)
            ax.set_xticks(range(len(etas)), [f"{e:g}" for e in etas])
            ax.grid(axis="x", visible=False)
            if row == 0:
                ax.set_title(f"J = {J} servers")
            if row == len(rows) - 1:
                ax.set_xlabel("η (fraction of high-end servers)")
        axes[row][0].set_ylabel(f"({'abc'[row]}) {title}\nmean response time (s)")
    shown = list(dict.fromkeys(m for _, ms in rows for m in ms))
    fig.legend(handles=[Patch(color=colors[m], label=METHODS[m].legend) for m in shown], loc="outside upper center",
               ncol=min(len(shown), 3), frameon=False, fontsize=9)
    note = (f"BLOOM-176B, λ={DEFAULT.arrival_rate}/s, {runs} runs per cell, whiskers 95 % CI. \"overloaded n/{runs}\": "
            f"in n runs fewer than {OVERLOAD_RATIO:.0%} of the arrivals completed, so the queue grows and the mean "
            "has no steady-state value: no bar")
    if never:
        note += "; infeasible everywhere: " + ", ".join(METHODS[m].legend for m in never)
    fig.supxlabel(note, fontsize=8, wrap=True)
    return fig


def plot(agg: list[dict[str, Any]], Js: tuple[int, ...], etas: tuple[float, ...], runs: int, path) -> None:
    """Draw :func:`figure` to ``path`` (fig8.png)."""
    save_figure(figure(agg, Js, etas, runs), path)


def _fmt(r: dict[str, Any], base: str) -> str:
    """The cell's % reduction against ``base``: 'unstable' where an overloaded run leaves no mean to compare."""
    if r.get(f"vs_{base}_overloaded_runs"):
        return "unstable"
    x = r[f"vs_{base}_pct"]
    return "n/a" if math.isnan(x) else f"{x:.0f}%"


def _verdicts(red: list[dict[str, Any]]) -> list[str]:
    """Per baseline: the range of % reductions over the stable cells, in how many the paired 95 % CI says faster /
    slower, and how many are unstable (overloaded: no steady-state mean)."""
    lines = []
    for base in BASELINES:
        stable = [r for r in red if not math.isnan(r[f"vs_{base}_pct"])]
        unstable = sum(bool(r.get(f"vs_{base}_overloaded_runs")) for r in red)
        tail = f"; unstable (overloaded) in {unstable} of {len(red)}" if unstable else ""
        if stable:
            vals = [r[f"vs_{base}_pct"] for r in stable]
            worse = sum(r[f"vs_{base}_diff_hi_s"] < 0 for r in stable)  # paired 95 % CI wholly below zero
            better = sum(r[f"vs_{base}_diff_lo_s"] > 0 for r in stable)
            lines.append(f"range vs {METHODS[base].legend}: {min(vals):.0f}% .. {max(vals):.0f}%; proposed "
                         f"significantly faster in {better}, slower in {worse} of {len(stable)} stable cells "
                         f"(paired 95 % CI){tail}")
        elif unstable:
            lines.append(f"vs {METHODS[base].legend}: unstable (overloaded) in {unstable} of {len(red)} cells")
    return lines


def run_cells(args, cfg: dict[str, Any], settings: tuple[tuple[int, float], ...], task: Fig8Run) -> Summary:
    """Only the cells in ``args.cells``, each run with the seed it has in the whole grid (and the same checkpoint):
    fig8_cell_check.csv (one row per cell) and a summary of its own, fig8's results left as they are."""
    picked = tuple(dict.fromkeys(args.cells))
    unknown = [c for c in picked if c not in settings]
    if unknown:
        raise SpecError(f"--cells: {', '.join(f'{J}:{e:g}' for J, e in unknown)} not in fig8's grid (J in "
                        f"{', '.join(map(str, cfg['Js']))}; η in {', '.join(f'{e:g}' for e in cfg['etas'])})")
    if replotting(args):  # the summary again from the grid's rows of these cells (no simulation)
        rows = [r for r in read_csv(args.out / "fig8_runs.csv") if (int(r["J"]), float(r["eta"])) in picked]
    else:
        only = [settings.index(cell) * cfg["runs"] + r for cell in picked for r in range(cfg["runs"])]
        rows = run_replications(task, len(settings) * cfg["runs"], args.seed, **backend(args),
                                desc="fig8 cells", checkpoint=checkpoint_path("fig8", args, __name__), only=only)
    red = reductions(rows, picked)
    agg = {(r["J"], r["eta"], r["method"]): r for r in aggregate(rows, picked)}
    table, lines = [], [f"{cfg['runs']} runs × {cfg['n_jobs']} jobs per cell, the runs these cells have in the whole "
                        "grid; paired difference baseline − proposed with its 95 % CI (> 0: proposed faster):"]
    for r in red:
        key = (r["J"], r["eta"])
        row: dict[str, Any] = {"J": r["J"], "eta": r["eta"], "runs": agg[key + ("proposed",)]["runs"],
                               "proposed_mean_response_s": agg[key + ("proposed",)]["mean_response_s"],
                               "proposed_ci95_half_s": agg[key + ("proposed",)]["ci95_half_s"]}
        for base in BASELINES:
            row[f"{base}_mean_response_s"] = agg[key + (base,)]["mean_response_s"]
            row |= {k: v for k, v in r.items() if k.startswith(f"vs_{base}_")}
        table.append(row)
        lines.append(f"J={r['J']} η={r['eta']:g}: proposed {row['proposed_mean_response_s']:.3f} s; " + "; ".join(
            (f"{base} unstable (overloaded in {r[f'vs_{base}_overloaded_runs']} of {row['runs']} runs)"
             if r[f"vs_{base}_overloaded_runs"] else
             f"{base} {_fmt(r, base)} ({r[f'vs_{base}_diff_lo_s']:+.3f} .. {r[f'vs_{base}_diff_hi_s']:+.3f} s)")
            for base in BASELINES if r[f"vs_{base}_runs"] or r[f"vs_{base}_overloaded_runs"]))
    lines += _verdicts(red)
    cells = " ".join(f"{J}:{e:g}" for J, e in picked)
    command = f"python -m petals_chain.experiments fig8{' --quick' if args.quick else ''} --seed {args.seed} " \
              f"--cells {cells}"
    if replotting(args):
        command += " --replot"
        lines.append("redrawn from fig8_runs.csv's rows of these cells (fig8_cell_check.csv is the check's own "
                     "rerun, which gave the same values bit for bit)")
    else:
        write_csv(args.out / "fig8_cell_check.csv", table)
    return Summary("fig8-cells", "overall comparison, selected cells (fig8_cell_check.csv)", command, lines, [],
                   {"reductions": red})


def rerun_methods(args, cfg: dict[str, Any], settings: tuple[tuple[int, float], ...],
                  methods: list[str]) -> list[dict[str, Any]]:
    """The saved fig8_runs.csv with only ``methods``' columns recomputed (same seeds): after a change to those
    methods alone, the whole grid again at a fraction of the cost."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise SpecError(f"--methods: unknown {', '.join(unknown)}; choose among {', '.join(METHODS)}")
    saved = read_csv(args.out / "fig8_runs.csv")
    expect = [(J, eta, r) for J, eta in settings for r in range(cfg["runs"])]
    if [(int(x["J"]), x["eta"], int(x["run"])) for x in saved] != expect:
        raise SpecError(f"--methods: {args.out / 'fig8_runs.csv'} is not a whole {len(expect)}-run grid of this "
                        "configuration (run fig8 in full first)")
    task = Fig8Run(settings, cfg["runs"], cfg["n_jobs"], methods=tuple(dict.fromkeys(methods)))
    fresh = run_replications(task, len(expect), args.seed, **backend(args),
                             desc=f"fig8 {' '.join(methods)}", checkpoint=checkpoint_path("fig8", args, __name__))
    out = []
    for old, new in zip(saved, fresh):
        row = old | new | {"J": int(old["J"]), "run": int(old["run"])}
        out.append({k: row[k] for k in [*old, *(k for k in new if k not in old)]})  # the saved column order first
    return out


def run(args) -> Summary:
    """Run the grid (in parallel processes), write CSVs and the PNG, summarise the % reductions."""
    cfg = QUICK if args.quick else FULL
    settings = tuple((J, eta) for J in cfg["Js"] for eta in cfg["etas"])
    task = Fig8Run(settings, cfg["runs"], cfg["n_jobs"])
    if getattr(args, "cells", None):
        return run_cells(args, cfg, settings, task)
    only_methods = getattr(args, "methods", None)
    # Resumable: every finished run is kept in results/resume/ and a rerun computes only the missing ones.
    if replotting(args):  # redraw from the saved runs (their statuses and means), no simulation
        rows = read_csv(args.out / "fig8_runs.csv")
    elif only_methods:
        rows = rerun_methods(args, cfg, settings, only_methods)
        write_csv(args.out / "fig8_runs.csv", rows)
    else:
        rows = run_replications(task, len(settings) * cfg["runs"], args.seed, **backend(args),
                                desc="fig8 runs", checkpoint=checkpoint_path("fig8", args, __name__))
        write_csv(args.out / "fig8_runs.csv", rows)
    agg = aggregate(rows, settings)
    write_csv(args.out / "fig8.csv", agg)
    red = reductions(rows, settings)
    write_csv(args.out / "fig8_reductions.csv", red)
    plot(agg, cfg["Js"], cfg["etas"], cfg["runs"], args.out / "fig8.png")
    lines = [f"{cfg['runs']} runs × {cfg['n_jobs']} jobs ({int(WARMUP_FRACTION * 100)} % warm-up) per setting; "
             "% reduction of the proposed mean response time vs PETALS / vs BPRR / vs BPRR told exact sizes "
             "(paired runs):"]
    for J in cfg["Js"]:
        cells = []
        for r in (r for r in red if r["J"] == J):
            cells.append(f"η={r['eta']:g}: {_fmt(r, 'petals')} / {_fmt(r, 'bprr')} / {_fmt(r, 'bprr_oracle')}")
        lines.append(f"J={J}: " + "; ".join(cells))
    lines += _verdicts(red)
    infeasible = sorted({(r["J"], r["eta"], r["method"]) for r in agg if r["feasible_runs"] < r["runs"]})
    if infeasible:
        lines.append("infeasible in some runs: " + ", ".join(f"{m} at J={J} η={e:g}" for J, e, m in infeasible))
    overloaded = [(r["J"], r["eta"], r["method"], r["overloaded_runs"]) for r in agg if r["overloaded_runs"]]
    if overloaded:
        lines.append("overloaded (completions < 90 % of arrivals; mean grows with run length): " + ", ".join(
            f"{m} at J={J} η={e:g} ({n} runs)" for J, e, m, n in overloaded))
    command = f"python -m petals_chain.experiments fig8{' --quick' if args.quick else ''} --seed {args.seed}"
    if only_methods:
        command += f" --methods {' '.join(only_methods)}"
        lines.append(f"the columns of {', '.join(only_methods)} were recomputed by this command; the other methods' "
                     "come from the previous full run of fig8_runs.csv (same seeds, their code unchanged)")
    paper = ["8–83 % lower mean response time than PETALS and BPRR, more with fewer servers or smaller η "
             "(J=10, η=0.1 cannot hold the model)"]
    return Summary("fig8", "overall comparison: proposed vs PETALS vs BPRR", command, lines, paper,
                   {"reductions": red, "paper_reduction_pct": PAPER_REDUCTION})
