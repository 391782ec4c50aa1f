"""TORTA Fig 5a: solve time of the exact per-slot MILP as tasks grow, against TORTA's macro decision time.

The MILP (5 regions × 10 servers, 2 task types, N × 50 binaries, N + 55 constraints) is solved by HiGHS through
``scipy.optimize.milp``; docs/torta.md, "Experiments".
"""

from __future__ import annotations

import time

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import csr_matrix, identity, kron
from tqdm import tqdm

from petals_chain.experiments.common import Summary, write_csv

REGIONS, PER_REGION = 5, 10
MIP_GAP = 0.01  # HiGHS' default 1e-4 gap does not close within minutes even at N = 200 (⚑)
PAPER_S = {200: 0.5, 500: 1.8, 1000: 6.0, 2000: 22.0, 5000: 130.2}


def milp_instance(n: int, rng: np.random.Generator):
    """Cost vector, constraints and integrality of one instance with ``n`` tasks."""
    s = REGIONS * PER_REGION
    kind = rng.integers(0, 2, size=n)
    need = np.where(kind == 0, 1.0, 0.6)
    speed = rng.choice([1.6, 1.0, 0.8, 0.6], size=s)
    lat = rng.uniform(0.005, 0.08, size=(n, REGIONS))
    work = rng.uniform(10, 25, size=n)
    cost = (work[:, None] / speed[None, :] + np.repeat(lat, PER_REGION, axis=1)).ravel()
    cap = np.ceil(need.sum() / s * rng.uniform(1.2, 2.0, size=s))
    assign = kron(identity(n), np.ones((1, s)))  # each task once
    server = kron(csr_matrix(need[None, :]), identity(s)).tocsr()  # Σ_i need_i·x_is ≤ cap_s
    region = csr_matrix(np.kron(np.eye(REGIONS), np.ones(PER_REGION)))
    reg = region @ server  # region load ≤ 80 % of its servers' capacity
    cons = [LinearConstraint(assign, 1, 1), LinearConstraint(server, 0, cap),
            LinearConstraint(reg, 0, 0.8 * (region @ cap))]
    return cost, cons


QUICK = {"ns": (200, 500, 1000), "repeats": 2, "limit_s": 60.0}
FULL = {"ns": (200, 500, 1000, 2000, 5000), "repeats": 3, "limit_s": 300.0}


def run(args) -> Summary:
    """Time the MILP for growing N on ``repeats`` seeded instances per N, each within a time limit; compare with the
    paper's i5-13490F times on a log-log axis with the fitted slope. A solve stopped by the limit (HiGHS status 1) is
    a lower bound on its time and kept out of the fit."""
    cfg = QUICK if args.quick else FULL
    rng = np.random.default_rng(args.seed)
    rows = []
    for n in tqdm(cfg["ns"], desc="MILP sizes"):
        for k in range(cfg["repeats"]):
            cost, cons = milp_instance(n, rng)
            t0 = time.perf_counter()
            res = milp(cost, constraints=cons, integrality=np.ones(cost.size), bounds=Bounds(0, 1),
                       options={"time_limit": cfg["limit_s"], "mip_rel_gap": MIP_GAP})
            el = time.perf_counter() - t0
            rows.append({"tasks": n, "instance": k, "binaries": cost.size,
                         "constraints": n + REGIONS * PER_REGION + REGIONS, "solve_s": el, "status": int(res.status),
                         "time_limited": int(res.status) == 1, "paper_s": PAPER_S[n]})
    write_csv(args.out / "torta-fig5a.csv", rows)
    ns = list(cfg["ns"])
    med = {n: float(np.median([r["solve_s"] for r in rows if r["tasks"] == n])) for n in ns}
    solved = [(r["tasks"], r["solve_s"]) for r in rows if not r["time_limited"]]
    fit = np.polyfit(np.log([n for n, _ in solved]), np.log([t for _, t in solved]), 1) if len(
        {n for n, _ in solved}) >= 2 else None
    _plot(rows, ns, med, fit, cfg, args.out / "torta-fig5a.png")
    per_n = []
    for n in ns:
        mine = [r for r in rows if r["tasks"] == n]
        limited = sum(r["time_limited"] for r in mine)
        per_n.append(f"N={n}: median {med[n]:.2f} s, range {min(r['solve_s'] for r in mine):.2f}–"
                     f"{max(r['solve_s'] for r in mine):.2f} s over {len(mine)} instances"
                     + (f", {limited} stopped at the {cfg['limit_s']:g} s limit" if limited else ""))
    lines = ["; ".join(per_n),
             (f"log-log slope {fit[0]:.2f} over the {len(solved)} solves within the limit (super-linear if > 1); "
              if fit is not None else "too few solves within the limit for a slope; ")
             + "TORTA's macro decision is R×R, independent of N (see `python -m petals_chain.bench torta`)",
             f"HiGHS with a {MIP_GAP:.0%} optimality gap, {cfg['limit_s']:g} s per solve, one core of the shared "
             "2-core machine"]
    paper = ["N = 200/500/1K/2K/5K → 0.5/1.8/6.0/22.0/130.2 s (slope ≈ 1.5)"]
    cmd = f"python -m petals_chain.experiments torta-fig5a{' --quick' if args.quick else ''} --seed {args.seed}"
    return Summary("torta-fig5a", "TORTA exact MILP solve time", cmd, lines, paper)


def _plot(rows: list[dict], ns: list[int], med: dict[int, float], fit, cfg: dict, path) -> None:
    """Every solve (hollow: stopped by the limit), the median per N, the paper's times and the fitted line, log-log."""
    from petals_chain.experiments.common import figure, save_figure

    fig, axes = figure(figsize=(6.5, 4.4))
    ax = axes[0][0]
    for limited, marker, label in ((False, "o", "HiGHS here, each instance"),
                                   (True, "o", f"stopped at the {cfg['limit_s']:g} s limit (lower bound)")):
        pts = [(r["tasks"], r["solve_s"]) for r in rows if r["time_limited"] == limited]
        if pts:
            ax.scatter(*zip(*pts), marker=marker, s=22, label=label, color="tab:blue", alpha=0.6,
                       facecolors="none" if limited else "tab:blue")
    ax.plot(ns, [med[n] for n in ns], color="tab:blue", label="median here")
    ax.plot(ns, [PAPER_S[n] for n in ns], marker="x", ls="--", color="tab:red", label="paper (i5-13490F)")
    if fit is not None:
        xs = np.array([min(ns), max(ns)], dtype=float)
        ax.plot(xs, np.exp(fit[1]) * xs ** fit[0], ls=":", color="black", label=f"fit: slope {fit[0]:.2f}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xticks(ns, [f"{n:,}" for n in ns])
    ax.minorticks_off()
    ax.set_xlabel("tasks per slot N")
    ax.set_ylabel("solve time (s)")
    ax.set_title("TORTA Fig 5a: exact MILP solve time")
    fig.legend(loc="outside lower center", ncol=2, frameon=False, fontsize=8)
    save_figure(fig, path)
