"""Moldable Fig. 2: blocking (a) and mean execution time (b) against n for greedy(p*) and greedy, linear and
sub-linear speed-ups, in the mean-field, Halfin-Whitt and super-HW regimes (Exp sizes)."""

from __future__ import annotations

from pathlib import Path

from petals_chain.experiments.common import (Summary, backend, checkpoint_path, figure, read_csv, replotting,
                                             save_figure, write_csv)
from petals_chain.moldable import paper as P
from petals_chain.moldable.bounds import stein_bounds
from petals_chain.moldable.optimal import optimal_allocation
from petals_chain.moldable.sim import MoldableRun, regime_load, replicate_cells, summarise
from petals_chain.moldable.speedup import SpeedUp

NAME = "moldable_fig2"  # file and section name (the results README keys sections by \w+)
SCHEMES = ("greedy-p", "greedy")
REPLOT = True  # `--replot` redraws moldable_fig2.png and its summary from results/moldable_fig2.csv


def run(args) -> Summary:
    """Sweep n (quick: 4 sizes, 2 runs of 10⁶ arrivals; full: 7 sizes, 10 runs of 5·10⁶)."""
    if replotting(args):
        rows = saved_rows(args.out)
        sizes, runs, arrivals = tuple(sorted({r["n"] for r in rows})), rows[0]["runs"], rows[0]["arrivals"]
        return _summary(args, rows, sizes, runs, arrivals)
    if args.quick:
        sizes, runs, arrivals = (250, 1000, 4000, 16000), 2, 1_000_000
    else:
        sizes, runs, arrivals = (250, 500, 1000, 2000, 4000, 8000, 16000), 10, P.TABLE1_ARRIVALS
    keys, cells = [], []
    for speed_name, speed in P.SPEEDUPS.items():
        for regime, (alpha, beta) in P.REGIMES.items():
            for n in sizes:
                lam = regime_load(n, alpha, beta)
                for scheme in SCHEMES:
                    keys.append((speed_name, regime, n, scheme, lam, SpeedUp(speed)))
                    cells.append(MoldableRun(n, lam, speed, scheme, "exp", arrivals))
    grouped = replicate_cells(cells, runs, args.seed, **backend(args), desc="moldable Fig. 2 runs",
                              checkpoint=checkpoint_path("moldable-fig2", args, __name__))
    rows = []
    for (speed_name, regime, n, scheme, lam, sp), reps in zip(keys, grouped):
        s = summarise(reps)
        rows.append({"speedup": speed_name, "regime": regime, "n": n, "scheme": scheme, "load": lam,
                     "optimal_exec_time": optimal_allocation(sp, lam).execution_time, "runs": runs,
                     "arrivals": arrivals,
                     "blocking": s["blocking"].mean, "blocking_ci": s["blocking"].half_width,
                     "exec_all": s["exec_time_all"].mean, "exec_all_ci": s["exec_time_all"].half_width,
                     "exec_done": s["exec_time_done"].mean,
                     "little_rel_err_max": max(r["little_rel_err"] for r in reps),
                     "max_jobs_below_i1": max(r["max_jobs_below_i1"] for r in reps)})
    write_csv(args.out / f"{NAME}.csv", rows)
    return _summary(args, rows, sizes, runs, arrivals)


def saved_rows(out: Path) -> list[dict]:
    """moldable_fig2.csv read back with its integer columns as such."""
    rows = read_csv(out / f"{NAME}.csv")
    for r in rows:
        r.update({k: int(r[k]) for k in ("n", "runs", "arrivals", "max_jobs_below_i1")})
    return rows


def _summary(args, rows: list[dict], sizes: tuple[int, ...], runs: int, arrivals: int) -> Summary:
    """The PNG and the summary from the rows (simulated or read back)."""
    _plot(rows, args.out / f"{NAME}.png", runs, arrivals)
    return Summary(NAME, "moldable jobs, Fig. 2: blocking and execution time against n",
                   f"python -m petals_chain.experiments moldable-fig2{' --quick' if args.quick else ''} "
                   f"--seed {args.seed}", _lines(rows, sizes, runs, arrivals),
                   ["greedy(p*): P_b → 0 and E[D] → D* as n grows, in every regime",
                    "greedy with the sub-linear speed-up keeps P_b > 0 (but a lower E[D]); with the linear one the "
                    "two schemes coincide"], {"rows": rows})


def _series(rows: list[dict], speed: str, regime: str, scheme: str, key: str) -> list[float]:
    """Column ``key`` of one curve (speed-up, regime, scheme), in order of n."""
    return [r[key] for r in rows if r["speedup"] == speed and r["regime"] == regime and r["scheme"] == scheme]


def _lines(rows: list[dict], sizes: tuple[int, ...], runs: int, arrivals: int) -> list[str]:
    """Headline checks: monotone blocking of greedy(p*), greedy's floor, E[D] - D* shrinking."""
    out = [f"n ∈ {list(sizes)}, {runs} runs × {arrivals:.0e} arrivals per point, Exp sizes, start empty"]
    falls = 0
    for speed in P.SPEEDUPS:
        for regime in P.REGIMES:
            pb = _series(rows, speed, regime, "greedy-p", "blocking")
            ok = all(b < a for a, b in zip(pb, pb[1:]) if a > 0)
            falls += ok
            gr = _series(rows, speed, regime, "greedy", "blocking")
            out.append(f"{speed} {regime}: greedy(p*) P_b " + " / ".join(f"{v:.4f}" for v in pb)
                       + f" ({'falls' if ok else 'does NOT fall'} strictly); greedy P_b "
                       + " / ".join(f"{v:.4f}" for v in gr))
    out.insert(1, f"greedy(p*) blocking falls strictly with n (where > 0) in {falls}/6 cells")
    gap = [e - d for e, d in zip(_series(rows, "sub-linear", "MF", "greedy-p", "exec_all"),
                                 _series(rows, "sub-linear", "MF", "greedy-p", "optimal_exec_time"))]
    out.append("sub-linear MF, greedy(p*) E[D] − D* (all admitted jobs): " + " / ".join(f"{g:.4f}" for g in gap))
    ge = _series(rows, "sub-linear", "MF", "greedy", "exec_all")
    out.append("sub-linear MF, greedy E[D]: " + " / ".join(f"{g:.4f}" for g in ge) + " (1/s_5 = 0.2941)")
    for regime in ("HW", "super-HW"):  # |I*| = 1 for the linear speed-up: the Stein bound on P_b is not vacuous
        sim = _series(rows, "linear", regime, "greedy-p", "blocking")
        ns = _series(rows, "linear", regime, "greedy-p", "n")
        bound = [stein_bounds(SpeedUp(P.SPEEDUPS["linear"]), n, regime_load(n, *P.REGIMES[regime])).blocking
                 for n in ns]
        out.append(f"linear {regime}: Stein bound on P_b " + " / ".join(f"{b:.3f}" for b in bound)
                   + " vs simulated " + " / ".join(f"{s:.4f}" for s in sim)
                   + f" ({'all inside' if all(s <= b for s, b in zip(sim, bound)) else 'VIOLATED'})")
    worst = max(r["little_rel_err_max"] for r in rows)
    out.append(f"largest relative error of Little's law over every run: {worst:.1e} "
               "(time average vs per-job mean; the gap is the jobs in service at the end, ≈ E[D] / horizon)")
    return out


def fig2_figure(rows: list[dict], runs: int, arrivals: int):
    """2 × 3 panels: P_b (top) and E[D] (bottom) against n, one column per regime, D* dotted; one legend for the
    figure, below the panels (inside the first column it covered the sub-linear greedy curve)."""
    fig, axes = figure(2, 3, figsize=(15, 8.6), sharex=True)
    for col, regime in enumerate(P.REGIMES):
        for speed, color in zip(P.SPEEDUPS, ("C0", "C1")):
            for scheme, style in zip(SCHEMES, ("-o", "--s")):
                ns = _series(rows, speed, regime, scheme, "n")
                label = f"{speed}, {'greedy(p*)' if scheme == 'greedy-p' else 'greedy'}"
                axes[0, col].errorbar(ns, _series(rows, speed, regime, scheme, "blocking"),
                                      yerr=_series(rows, speed, regime, scheme, "blocking_ci"), fmt=style,
                                      color=color, capsize=3, label=label if col == 0 else None)
                axes[1, col].errorbar(ns, _series(rows, speed, regime, scheme, "exec_all"),
                                      yerr=_series(rows, speed, regime, scheme, "exec_all_ci"), fmt=style,
                                      color=color, capsize=3)
            ns = _series(rows, speed, regime, "greedy-p", "n")
            axes[1, col].plot(ns, _series(rows, speed, regime, "greedy-p", "optimal_exec_time"), ":", color=color,
                              label=f"{speed}, D*" if col == 0 else None)
        alpha, beta = P.REGIMES[regime]
        axes[0, col].set_title(f"(a) blocking, {regime} (α = {alpha:.3g}, β = {beta})")
        axes[1, col].set_title(f"(b) E[D], all admitted jobs, {regime}")
        axes[0, col].set_ylabel("P_b")
        axes[1, col].set_ylabel("E[D]")
        axes[1, col].set_xlabel("servers n")
        ns = sorted({r["n"] for r in rows})
        for ax in axes[:, col]:
            ax.set_xscale("log")
            ax.set_xlim(ns[0] / 1.4, ns[-1] * 1.4)
    fig.legend(loc="outside lower center", ncol=6, frameon=False)
    fig.suptitle(f"Fig. 2: greedy(p*) vs greedy, Exp sizes ({runs} runs × {arrivals:.0e} arrivals per point)")
    return fig


def _plot(rows: list[dict], path, runs: int, arrivals: int) -> None:
    """Draw :func:`fig2_figure` to ``path``."""
    save_figure(fig2_figure(rows, runs, arrivals), path)
