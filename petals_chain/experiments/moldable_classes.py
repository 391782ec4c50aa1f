"""Moldable jobs of several classes: blocking and execution time against n under the water-filling split.

Two classes (the paper's sub-linear speed-up and a shorter, flatter one with larger jobs) share n servers at a
total load of 0.8; schemes: greedy(p*_j) in hard reserves (partition), greedy(p*_j) over one shared pool, and
greedy. The paper states the multi-class result without an experiment; this shows it and what the hard
partition costs (docs/moldable.md, "Several classes")."""

from __future__ import annotations

from petals_chain.experiments.common import Summary, backend, checkpoint_path, plt, write_csv
from petals_chain.moldable.classes_sim import SCHEMES, ClassesRun
from petals_chain.moldable.sim import replicate_cells, summarise

NAME = "moldable_classes"
CLASSES = (((1.0, 1.8, 2.5, 3.0, 3.4), 0.5, 1.0), ((1.0, 1.9, 2.7), 0.2, 1.5))  # (speed-up, λ_j, E[S_j])
KEYS = ("blocking", "exec_time_all", "blocking_0", "blocking_1")


def run(args) -> Summary:
    """Sweep n for every scheme (quick: 3 sizes × 2 runs × 10⁶ arrivals; full: 5 sizes × 10 runs × 5·10⁶)."""
    if args.quick:
        sizes, runs, arrivals = (250, 1000, 4000), 2, 1_000_000
    else:
        sizes, runs, arrivals = (250, 500, 1000, 4000, 16000), 10, 5_000_000
    keys = [(n, scheme) for n in sizes for scheme in SCHEMES]
    cells = [ClassesRun(n, CLASSES, scheme, "exp", arrivals) for n, scheme in keys]
    grouped = replicate_cells(cells, runs, args.seed, **backend(args), desc="moldable classes runs",
                              checkpoint=checkpoint_path("moldable-classes", args, __name__))
    rows = []
    for (n, scheme), reps in zip(keys, grouped):
        s = summarise(reps, KEYS)
        rows.append({"n": n, "scheme": scheme, "runs": runs, "arrivals": arrivals, "d_star": reps[0]["d_star"],
                     "pools": reps[0]["pools"], **{k: s[k].mean for k in KEYS},
                     **{f"{k}_ci": s[k].half_width for k in KEYS},
                     "little_rel_err_max": max(max(r["little_rel_err_0"], r["little_rel_err_1"]) for r in reps)})
    write_csv(args.out / f"{NAME}.csv", rows)
    _plot(rows, sizes, args.out / f"{NAME}.png", runs, arrivals)
    d_star = rows[0]["d_star"]
    lines = [f"{runs} runs × {arrivals:.0e} arrivals per cell; classes (speed-up, λ_j, E[S_j]): {CLASSES}; "
             f"total load 0.8; D* of (Q) = {d_star:.4f}; ± = 95 % Student-t CI"]
    for scheme in SCHEMES:
        mine = [r for r in rows if r["scheme"] == scheme]
        lines.append(f"{scheme}: P_b " + ", ".join(f"n={r['n']}: {r['blocking']:.4f} ± {r['blocking_ci']:.4f}"
                                                   for r in mine)
                     + "; E[D] " + ", ".join(f"{r['exec_time_all']:.4f}" for r in mine))
    big = [r for r in rows if r["n"] == sizes[-1]]
    by = {r["scheme"]: r for r in big}
    lines.append(f"at n = {sizes[-1]}: shared pool blocks {by['shared']['blocking']:.4f} vs partition "
                 f"{by['partition']['blocking']:.4f} vs greedy {by['greedy']['blocking']:.4f}; largest Little's-law "
                 f"error {max(r['little_rel_err_max'] for r in rows):.1e}")
    return Summary(NAME, "moldable jobs, several classes: partition vs shared pool vs greedy",
                   f"python -m petals_chain.experiments moldable-classes{' --quick' if args.quick else ''} "
                   f"--seed {args.seed}", lines,
                   ["no experiment in the paper; its §6 claims greedy(p*_j) per class reaches D* of (Q) as n grows"],
                   {"rows": rows})


def _plot(rows: list[dict], sizes: tuple[int, ...], path, runs: int, arrivals: int) -> None:
    """(a) overall blocking and (b) mean execution time against n, one line per scheme; D* dashed."""
    pyplot = plt()
    fig, (a, b) = pyplot.subplots(1, 2, figsize=(11, 4))
    for scheme in SCHEMES:
        mine = [r for r in rows if r["scheme"] == scheme]
        a.errorbar([r["n"] for r in mine], [r["blocking"] for r in mine], yerr=[r["blocking_ci"] for r in mine],
                   marker="o", capsize=3, label=scheme)
        b.errorbar([r["n"] for r in mine], [r["exec_time_all"] for r in mine],
                   yerr=[r["exec_time_all_ci"] for r in mine], marker="o", capsize=3, label=scheme)
    b.axhline(rows[0]["d_star"], color="black", ls="--", label="D* of (Q)")
    for ax, label in ((a, "blocking probability"), (b, "mean execution time")):
        ax.set_xscale("log")
        ax.set_xlabel("servers n")
        ax.set_ylabel(label)
        ax.legend()
    fig.suptitle(f"two classes, total load 0.8 ({runs} runs × {arrivals:.0e} arrivals per point, 95 % CI)")
    fig.tight_layout()
    fig.savefig(path)
    pyplot.close(fig)
