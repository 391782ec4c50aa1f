"""`python -m petals_chain moldable optimal|simulate`: Theorem 1's allocation, and simulated blocking and
execution time of greedy(p*) or greedy with 95 % confidence intervals."""

from __future__ import annotations

import argparse
import json
import math
import sys

import numpy as np

from petals_chain.model import SpecError
from petals_chain.moldable.kernel import DISTS
from petals_chain.moldable.optimal import optimal_allocation
from petals_chain.moldable.policies import SCHEMES
from petals_chain.moldable.sim import MoldableRun, regime_load, replicate, summarise
from petals_chain.moldable.speedup import SpeedUp, linear, parse
from petals_chain.sim.montecarlo import RayBackendError, add_ray_option


def _speedup(text: str) -> SpeedUp:
    """'linear:5' or a comma-separated table."""
    if text.startswith("linear:"):
        try:
            return linear(int(text.split(":", 1)[1]))
        except ValueError:
            raise SpecError(f"speedup: {text!r}: give linear:D with an integer D") from None
    return parse(text)


def _fmt(v: np.ndarray) -> str:
    """A vector as (a, b, ...) with 6 significant digits."""
    return "(" + ", ".join(f"{x:.6g}" for x in v) + ")"


def _optimal(args: argparse.Namespace) -> int:
    """`moldable optimal`: print y*, p*, D* (or one JSON object)."""
    sp = _speedup(args.speedup)
    alloc = optimal_allocation(sp, args.load)
    if args.json:
        print(json.dumps({"speedup": list(sp.s), "load": alloc.load, "y": alloc.y.tolist(), "p": alloc.p.tolist(),
                          "execution_time": alloc.execution_time, "support": list(alloc.support),
                          "case": alloc.case}))
    else:
        print(f"s  = {_fmt(sp.array())}, λ = {alloc.load:.6g} (Theorem 1 case {alloc.case})")
        print(f"y* = {_fmt(alloc.y)}")
        print(f"p* = {_fmt(alloc.p)}")
        print(f"D* = {alloc.execution_time:.6g}  (servers used Σ i y_i = "
              f"{float(np.arange(1, sp.d + 1) @ alloc.y):.6g})")
    return 0


def _float(name: str, value: float) -> float:
    """``value`` if finite, else a SpecError naming ``name``."""
    if not math.isfinite(value):
        raise SpecError(f"{name}: must be finite, got {value!r}")
    return value


def _simulate(args: argparse.Namespace) -> int:
    """`moldable simulate`: replications on all cores, then P_b and both E[D] estimators with 95 % CIs."""
    sp = _speedup(args.speedup)
    if args.runs < 1:
        raise SpecError(f"runs: must be >= 1, got {args.runs}")
    if args.arrivals < 1 or args.arrivals != int(args.arrivals):
        raise SpecError(f"arrivals: must be a positive integer, got {args.arrivals!r}")
    lam = regime_load(args.n, _float("alpha", args.alpha), _float("beta", args.beta))
    run = MoldableRun(args.n, lam, sp.s, args.scheme, args.dist, int(args.arrivals))
    try:
        rows = replicate(run, args.runs, args.seed, workers=args.workers, progress=not args.json, ray=args.ray)
    except RayBackendError as exc:  # no Ray head at --ray: one line, nothing run
        print(f"error: {exc}", file=sys.stderr)
        return 2
    summ = summarise(rows)
    d_star = optimal_allocation(sp, lam).execution_time
    checks = {"little_rel_err_max": max(r["little_rel_err"] for r in rows),
              "work_rel_err_max": max(r["work_rel_err"] for r in rows)}
    if args.json:
        print(json.dumps({"n": args.n, "load": lam, "scheme": args.scheme, "dist": args.dist, "runs": args.runs,
                          "arrivals": int(args.arrivals), "optimal_execution_time": d_star,
                          **{k: {"mean": v.mean, "ci_low": v.ci_low, "ci_high": v.ci_high} for k, v in summ.items()},
                          **checks}))
        return 0
    print(f"n = {args.n}, λ = {lam:.6g}, scheme {args.scheme}, sizes {args.dist}, {args.runs} runs × "
          f"{int(args.arrivals)} arrivals; D* = {d_star:.6g}")
    labels = {"blocking": "blocking P_b", "exec_time_done": "E[D], jobs done before the last arrival",
              "exec_time_all": "E[D], all admitted jobs"}
    for k, v in summ.items():
        ci = f"± {v.half_width:.6f} (95 % CI)" if v.n > 1 else "(one run: no CI)"
        print(f"{labels[k]:42s} {v.mean:.6f} {ci}")
    print(f"Little's law and λ(1-P_b) = E[r]: largest relative errors {checks['little_rel_err_max']:.2e}, "
          f"{checks['work_rel_err_max']:.2e}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `moldable optimal` and `moldable simulate` under the main parser's subcommands."""
    m = sub.add_parser("moldable", help="moldable jobs: Theorem 1's optimal allocation and the loss-system simulator")
    msub = m.add_subparsers(dest="moldable_command", required=True)
    o = msub.add_parser("optimal", help="print y*, p* and D* of Theorem 1")
    o.add_argument("--speedup", required=True, help="s_1..s_d, e.g. 1,1.8,2.5,3,3.4, or linear:D")
    o.add_argument("--load", type=float, required=True, help="per-server load λ in (0, 1]")
    o.add_argument("--json", action="store_true", help="print one JSON object")
    o.set_defaults(func=_optimal)
    s = msub.add_parser("simulate", help="simulate the loss system; blocking and execution time with 95 %% CIs")
    s.add_argument("--n", type=int, default=4000, help="servers (default 4000)")
    s.add_argument("--alpha", type=float, default=0.5, help="λ = 1 - β n^-α (default α = 0.5)")
    s.add_argument("--beta", type=float, default=0.1, help="(default β = 0.1)")
    s.add_argument("--speedup", default="1,1.8,2.5,3,3.4", help="s_1..s_d or linear:D (default sub-linear)")
    s.add_argument("--dist", choices=tuple(DISTS), default="exp", help="job-size law, unit mean")
    s.add_argument("--scheme", choices=SCHEMES, default="greedy-p")
    s.add_argument("--arrivals", type=float, default=5e6, help="arrivals per run (default 5e6)")
    s.add_argument("--runs", type=int, default=10, help="independent runs (default 10)")
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--workers", type=int, default=None, help="processes (default: all cores)")
    add_ray_option(s)
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(func=_simulate)
