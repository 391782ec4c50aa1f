"""``python -m petals_chain.bench mell``: Mell's scheduler decisions per second at 10³ and 10⁵ live requests.

Builds a live cluster of N requests (ShareGPT ×10 sizes, LLaMA-2-7B on an RTX 4090), then times single
operations, each its own slot (so every decision is a whole Allocate, Depart or Update with its moves):
arrivals, completions, and growths that cross a class boundary. Also times one full slot in which every
live request grows by one token, and, for comparison in the same run, best fit's decisions per second.

``--live`` adds the live part (experiments/mell_live.py, the measurement the mell-downtime experiment records):
the downtime of moving a SmolLM2 session between two chains of a loopback swarm by KV transfer and by token
replay, at 128-2048 tokens, on plain loopback and under a ``tc tbf`` cap (``--cap-mbit``, needs root), and which
mode Mell's adaptive division would pick for each.

``--division-only N``: the simulator (Mell and load balancing, both settings, the four workloads, N requests, the
same arrivals per cell) with its moves divided by first fit and by the fastest rule: seconds of stall the moves
cost, moves per mode, peak GPUs.

``--batching-sweep N``: Mell with and without operation batching on N Poisson requests, for slots of 1, 10, 50
and 200 decode steps and the paper's frequent and infrequent rates: requests moved and scheduler moves each way
and the saving (experiments/mell_fig13.py, ``batching_sweep``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from petals_chain.mell.baselines import FitScheduler
from petals_chain.mell.classes import SETTINGS, kv_capacity_tokens
from petals_chain.mell.scheduler import MellScheduler
from petals_chain.mell.workloads import sharegpt_lengths


def _populate(sched, n: int, capacity: int, rng: np.random.Generator) -> dict[int, int]:
    """N live requests at a uniform point of their lives (prompt + part of the output), in batches of 1000."""
    lengths = sharegpt_lengths()
    idx = rng.integers(0, lengths.prompt_tokens.size, n)
    p = np.minimum(lengths.prompt_tokens[idx] * 10, capacity - 1)
    o = np.minimum(lengths.output_tokens[idx] * 10, capacity - p)
    sizes = (p + rng.random(n) * o).astype(np.int64)
    sizes = np.clip(sizes, 1, capacity)
    for k in range(0, n, 1000):
        batch = {r: int(sizes[r]) for r in range(k, min(n, k + 1000))}
        sched.step(batch, [], None, {r: capacity for r in batch})
    return {r: int(s) for r, s in enumerate(sizes)}


def _time_ops(sched, live: dict[int, int], capacity: int, ops: int, rng: np.random.Generator) -> float:
    """Decisions per second over ``ops`` single-operation slots (a third each: arrive, depart, cross a class)."""
    nxt = max(live) + 1
    bounds = np.array([capacity // 8, capacity // 4, capacity // 3, capacity // 2])
    t0 = time.perf_counter()
    for k in range(ops):
        kind = k % 3
        if kind == 0:
            s = int(rng.integers(1, capacity // 2))
            sched.step({nxt: s}, [], None, {nxt: capacity})
            live[nxt] = s
            nxt += 1
        elif kind == 1:
            r = next(iter(live))
            sched.step({}, [r])
            del live[r]
        else:
            r = next(reversed(live))
            above = bounds[bounds >= live[r]]
            new = min(capacity, int(above[0]) + 1) if above.size else live[r]
            sched.step({}, [], {r: new})
            live[r] = new
    return ops / (time.perf_counter() - t0)


def run(argv: list[str] | None = None) -> int:
    """Print decisions per second of Mell (and best fit) at each population size."""
    ap = argparse.ArgumentParser(prog="python -m petals_chain.bench mell", description=__doc__)
    ap.add_argument("--sizes", default="1000,100000", help="live requests, comma-separated (default 1000,100000)")
    ap.add_argument("--ops", type=int, default=3000, help="timed single-operation slots per size")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--live", action="store_true", help="also measure live migration downtimes (SmolLM2 swarm)")
    ap.add_argument("--live-only", action="store_true", help="only the live part")
    ap.add_argument("--lengths", default="128,512,1024,2048", help="session lengths for --live (tokens)")
    ap.add_argument("--cap-mbit", type=float, default=10.0, help="bandwidth cap of the capped --live run, Mbit/s "
                    "(0: no capped run)")
    ap.add_argument("--division-only", type=int, default=0, metavar="N",
                    help="only compare the simulator's division rules 'first' and 'fastest' on N requests per cell")
    ap.add_argument("--batching-sweep", type=int, default=0, metavar="N",
                    help="only sweep operation batching's saving over slot length and arrival rate on N requests")
    args = ap.parse_args(argv)
    if args.batching_sweep:
        if args.batching_sweep < 1:
            print(f"error: --batching-sweep must be >= 1 requests, got {args.batching_sweep}")
            return 2
        return _batching_sweep(args.batching_sweep, args.seed)
    if args.division_only:
        if args.division_only < 1:
            print(f"error: --division-only must be >= 1 requests, got {args.division_only}")
            return 2
        return _division(args.division_only, args.seed)
    if args.live or args.live_only:
        try:
            lengths = tuple(int(x) for x in args.lengths.split(","))
            if not lengths or any(not 1 <= n <= 2048 for n in lengths) or args.cap_mbit < 0:
                raise ValueError
        except ValueError:
            print(f"error: --lengths must be integers in 1..2048 and --cap-mbit >= 0 (got {args.lengths!r}, "
                  f"{args.cap_mbit})")
            return 2
    if not args.live_only:
        code = _scheduler(args)
        if code:
            return code
    if args.live or args.live_only:
        return _live(lengths, args.cap_mbit, args.seed)
    return 0


def _division(requests: int, seed: int) -> int:
    """Print stall seconds, modes and peak GPUs of the simulator under division rules 'first' and 'fastest'."""
    import dataclasses

    from petals_chain.experiments.mell_common import WORKLOADS, config, make_policy, workload
    from petals_chain.mell.sim import simulate

    print(f"{'setting':>9} {'workload':>13} {'policy':>6} {'stall s first':>13} {'fastest':>9} "
          f"{'kv/token/defer first':>21} {'fastest':>17} {'peak GPUs':>10}")
    for setting in SETTINGS:
        for wl in WORKLOADS:
            for policy in ("Mell", "LB"):
                res = {}
                for rule in ("first", "fastest"):
                    cfg = dataclasses.replace(config(setting), division_rule=rule)
                    arrivals = workload(wl, setting, requests, np.random.default_rng(seed))
                    res[rule] = simulate(make_policy(policy, cfg.capacity_tokens), arrivals, cfg)
                a, b = res["first"], res["fastest"]
                modes = ["/".join(str(r.modes[m]) for m in ("kv", "token", "defer")) for r in (a, b)]
                print(f"{setting:>9} {wl:>13} {policy:>6} {a.stall_s:13.1f} {b.stall_s:9.1f} {modes[0]:>21} "
                      f"{modes[1]:>17} {a.peak_gpus:>4} / {b.peak_gpus:<4}", flush=True)
    return 0


def _batching_sweep(requests: int, seed: int) -> int:
    """Print batching's saving per slot length and arrival rate (requests moved and scheduler moves)."""
    from petals_chain.experiments.mell_fig13 import batching_sweep

    print(f"{'gap s':>6} {'slot':>5} {'arr/slot':>8} {'requests moved':>21} {'saving':>7} "
          f"{'scheduler moves':>19} {'saving':>7} {'peak GPUs':>10}")
    for r in batching_sweep(requests, seed):
        print(f"{r['gap_s']:6.2f} {r['slot_tokens']:5d} {r['arrivals_per_slot']:8.2f} "
              f"{r['moves_nobatch']:>10} -> {r['moves_batch']:<7} {r['saving_pct']:6.1f}% "
              f"{r['item_moves_nobatch']:>8} -> {r['item_moves_batch']:<7} {r['item_saving_pct']:6.1f}% "
              f"{r['peak_gpus_nobatch']:>4} / {r['peak_gpus_batch']:<4}", flush=True)
    return 0


def _live(lengths: tuple[int, ...], cap_mbit: float, seed: int) -> int:
    """Measure and print the live downtimes (loopback, then capped) and the division check."""
    import tempfile
    from pathlib import Path

    from petals_chain.experiments import mell_live

    with tempfile.TemporaryDirectory(prefix="mell-live-") as tmp:
        try:
            rows = mell_live.measure(lengths, "loopback", Path(tmp) / "loopback", seed)
            if cap_mbit > 0:
                rows += mell_live.measure_capped(lengths, cap_mbit, Path(tmp) / "capped", seed)
        except mell_live.LiveBenchError as exc:
            print(f"error: {exc}")
            return 1
    print("\nLive migration downtime (SmolLM2-135M, float32, CPU servers)")
    print(mell_live.table(rows))
    print("\nAdaptive division (hybrid_divide, one move) against the faster measured mode")
    for c in mell_live.division_check(rows):
        print(f"  {c['link']:>16} {c['tokens']:>5} tokens: faster {c['faster']:>5}; first/best fit "
              f"{c['first_fit']}/{c['best_fit']} (simulator's epoch), {c['first_fit_both']}/{c['best_fit_both']} "
              f"(both fit)  ({c['bandwidth_MBps']:.1f} MB/s, {c['prefill_tok_s']:.0f} tok/s)")
    return 0


def _scheduler(args) -> int:
    """The scheduler part: decisions per second at each population size."""
    try:
        sizes = [int(x) for x in args.sizes.split(",")]
        if any(n < 10 for n in sizes) or args.ops < 3:
            raise ValueError
    except ValueError:
        print(f"error: --sizes must be integers >= 10 and --ops >= 3 (got {args.sizes!r}, {args.ops})")
        return 2
    model, gpu = SETTINGS["7b-4090"]
    C = kv_capacity_tokens(model, gpu)
    print(f"Mell scheduler, LLaMA-2-7B on an RTX 4090 (C = {C} tokens), ShareGPT x10 sizes")
    print(f"{'live requests':>14} {'GPUs':>7} {'build s':>8} {'Mell dec/s':>11} {'slot s':>8} {'BF dec/s':>9} "
          f"{'Mell/BF':>8}")
    for n in sizes:
        rng = np.random.default_rng(args.seed)
        mell = MellScheduler(C)
        t0 = time.perf_counter()
        live = _populate(mell, n, C, rng)
        build = time.perf_counter() - t0
        gpus = mell.num_gpus()
        t0 = time.perf_counter()  # one slot in which every live request decodes one token
        mell.step({}, [], {r: min(C, s + 1) for r, s in live.items()})
        slot = time.perf_counter() - t0
        live = {r: min(C, s + 1) for r, s in live.items()}
        rate = _time_ops(mell, live, C, args.ops, rng)
        bf = FitScheduler(C, "best", reserve=False)
        rng = np.random.default_rng(args.seed)
        bf_live = _populate(bf, n, C, rng)
        bf_rate = _time_ops(bf, bf_live, C, args.ops, rng)
        print(f"{n:>14} {gpus:>7} {build:>8.1f} {rate:>11.0f} {slot:>8.3f} {bf_rate:>9.0f} {rate / bf_rate:>8.2f}")
    return 0
