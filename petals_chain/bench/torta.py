"""``python -m petals_chain.bench torta``: TORTA's macro decision time per slot and the simulator's speed.

Prints, for 12, 25 and 37 regions (Abilene, Gabriel-25, Cost266), the time of one macro decision (the OT plan
with ``ot.emd`` + one policy inference with the paper's 256-512-256 trunk) and its ratio to a 45 s slot, then the
simulator's slots and tasks per second for two methods. Figures, not a timed test.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from petals_chain.torta.episode import macro_plan, make_scenario, observation, oracle_forecast, run_episode
from petals_chain.torta.params import DEFAULT
from petals_chain.torta.ppo import BetaPolicy, anchor_of
from petals_chain.torta.transport import cost_matrix

CASES = (("abilene", 12), ("gabriel25", 25), ("cost266", 37))


def decision_times_ms(topology: str, slots: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-slot times (ms) of the OT plan alone and of OT + policy inference, on the scenario's forecasts."""
    p = DEFAULT
    sc = make_scenario(topology, p, seed, slots)
    n_r = sc.regions.n_regions
    counts = sc.tasks.counts(slots, n_r)
    cost = cost_matrix(sc.regions.latency_s, sc.regions.price_per_kwh, p)
    cap = np.bincount(sc.regions.server_region, minlength=n_r).astype(float)
    policy = BetaPolicy(3 * n_r + 3 + 2 * n_r * n_r, n_r, hidden=p.policy_hidden)
    a_prev = np.full((n_r, n_r), 1.0 / n_r)
    ot_ms, all_ms = [], []
    for t in range(slots):
        t0 = time.perf_counter()
        f = oracle_forecast(counts, t)
        prob = macro_plan(f, cap, np.zeros(n_r), cost, p)
        t1 = time.perf_counter()
        obs = observation(np.zeros(n_r), np.zeros(n_r), f, 0.5, t, 1920.0, prob, a_prev)
        a_prev = policy.act(obs, anchor_of(a_prev, prob, p))
        t2 = time.perf_counter()
        ot_ms.append((t1 - t0) * 1e3)
        all_ms.append((t2 - t0) * 1e3)
    return np.array(ot_ms), np.array(all_ms)


def run(argv: list[str] | None = None) -> int:
    """Print the decision-time table and the simulator's throughput."""
    ap = argparse.ArgumentParser(prog="python -m petals_chain.bench torta", description=__doc__)
    ap.add_argument("--slots", type=int, default=60, help="slots timed per topology")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    if args.slots < 2:
        print("error: --slots must be >= 2")
        return 2
    torch.set_num_threads(1)
    print(f"macro decision per slot (median / p95 over {args.slots} slots; slot = {DEFAULT.slot_s:.0f} s)")
    print(f"{'topology':<10} {'R':>3} {'OT ms':>14} {'OT+policy ms':>16} {'of a slot':>10}")
    for topo, r in CASES:
        ot_ms, all_ms = decision_times_ms(topo, args.slots, args.seed)
        med = float(np.median(all_ms))
        print(f"{topo:<10} {r:>3} {np.median(ot_ms):>6.2f} / {np.percentile(ot_ms, 95):>5.2f} "
              f"{med:>7.2f} / {np.percentile(all_ms, 95):>6.2f} {med / 1e3 / DEFAULT.slot_s:>10.1e}")
    sc = make_scenario("abilene", DEFAULT, args.seed, 24)
    print("simulator (Abilene, 24 slots):")
    for m in ("OT-only", "SkyLB"):
        t0 = time.perf_counter()
        run_episode(sc, m, oracle_forecast)
        el = time.perf_counter() - t0
        print(f"  {m:<8} {24 / el:6.1f} slots/s, {sc.tasks.n / el:8.0f} tasks/s, "
              f"{24 * DEFAULT.slot_s / el:6.0f}× real time")
    return 0
