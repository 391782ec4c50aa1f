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

from petals_chain.experiments.common import Summary, plt, write_csv

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


def run(args) -> Summary:
    """Time the MILP for growing N (seeded instances); compare with the paper's i5-13490F times."""
    ns = [200, 500, 1000] if args.quick else [200, 500, 1000, 2000, 5000]
    rng = np.random.default_rng(args.seed)
    rows = []
    for n in tqdm(ns, desc="MILP sizes"):
        cost, cons = milp_instance(n, rng)
        t0 = time.perf_counter()
        res = milp(cost, constraints=cons, integrality=np.ones(cost.size), bounds=Bounds(0, 1),
                   options={"time_limit": 60 if args.quick else 600, "mip_rel_gap": MIP_GAP})
        el = time.perf_counter() - t0
        rows.append({"tasks": n, "binaries": cost.size, "constraints": n + REGIONS * PER_REGION + REGIONS,
                     "solve_s": el, "status": int(res.status), "paper_s": PAPER_S[n]})
    write_csv(args.out / "torta-fig5a.csv", rows)
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6, 4))
    ax.plot(ns, [r["solve_s"] for r in rows], marker="o", label="HiGHS (scipy.optimize.milp), here")
    ax.plot(ns, [PAPER_S[n] for n in ns], marker="x", ls="--", label="paper (i5-13490F)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tasks per slot N")
    ax.set_ylabel("solve time (s)")
    ax.set_title("TORTA Fig 5a: exact MILP solve time")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "torta-fig5a.png")
    pyplot.close(fig)
    growth = np.polyfit(np.log(ns), np.log([max(r["solve_s"], 1e-6) for r in rows]), 1)[0]
    lines = ["; ".join(f"N={r['tasks']}: {r['solve_s']:.2f} s (status {r['status']})" for r in rows),
             f"log-log slope {growth:.2f} (super-linear if > 1); TORTA's macro decision is R×R, independent of N "
             "(see `python -m petals_chain.bench torta`)"]
    paper = ["N = 200/500/1K/2K/5K → 0.5/1.8/6.0/22.0/130.2 s (slope ≈ 1.5)"]
    cmd = f"python -m petals_chain.experiments torta-fig5a{' --quick' if args.quick else ''} --seed {args.seed}"
    return Summary("torta-fig5a", "TORTA exact MILP solve time", cmd, lines, paper)
