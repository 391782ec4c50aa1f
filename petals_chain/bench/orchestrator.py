"""`python -m petals_chain.bench orchestrator`: lease+release over HTTP with 1000 chains, and JFFC decision time.

The orchestrator runs in a child process on a loopback port with a synthetic
composition of ``--chains`` one-server chains (seeded capacities 1-8 and service
times 5-20 s); this process drives ``--requests`` lease+release round trips at
each ``--concurrency`` level and prints round trips per second and p50/p99
latency, once per ``--persistence`` mode: off, and with ``--state-dir`` (SQLite in WAL mode,
synchronous NORMAL or FULL), each mode its own orchestrator, measured in turns at each level so that
the ratios against "off" come from the same run; then over HTTPS (a child with a self-signed
certificate made for the run, the client trusting it; ``--no-tls`` skips it), with the TLS/plain ratios
of the same run. Then the pure JFFC decision time (µs) with no HTTP at 10, 100, 1000 and ``--chains`` chains,
the live policy beside the same rules called through numba's dispatcher as before issue 26
(:class:`DispatcherJFFC`, kept here to time against), and the in-process LeaseManager round trip, show where the
time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.dispatch.base import Start, check_chains
from petals_chain.dispatch.jffc import JFFC
from petals_chain.kernels.dispatch_rules import jffc_arrival, jffc_release, speed_order
from petals_chain.model import Chain, Composition, ModelSpec, Placement, ServerSpec
from petals_chain.orchestrator import event_loop
from petals_chain.orchestrator.event_loop import DEFAULT_LOOP, LOOPS
from petals_chain.orchestrator.http.exposure import self_signed_pair

MODEL = ModelSpec(num_blocks=32, block_bytes=0.4e9, cache_bytes=0.05e9, name="bench-32")


def synthetic_composition(num_chains: int, rng: np.random.Generator) -> Composition:
    """num_chains one-server chains, each server holding the whole model; capacities 1-8, T_k in 5-20 s."""
    caps = rng.integers(1, 9, size=num_chains)
    times_s = rng.uniform(5.0, 20.0, size=num_chains)
    L = MODEL.num_blocks
    memory_bytes = L * MODEL.block_bytes + caps * L * MODEL.cache_bytes + 1.0
    servers = tuple(
        ServerSpec(f"s{k}", float(memory_bytes[k]), 0.02, float(times_s[k]) / L) for k in range(num_chains)
    )
    placement = Placement((1,) * num_chains, (L,) * num_chains)
    chains = tuple(Chain((k,), (L,), int(caps[k]), float(times_s[k])) for k in range(num_chains))
    return Composition(servers, MODEL, placement, chains, c=int(caps.max()))


# No store; --state-dir with SQLite synchronous=NORMAL / FULL (group commit, as shipped); the same committing each
# write on its own (what group commit saves).
PERSISTENCE_MODES = ("off", "normal", "full", "normal-unbatched", "full-unbatched")
DEFAULT_MODES = ("off", "normal", "full")


def _serve_child(num_chains: int, seed: int, conn: Any, state_db: str | None = None, mode: str = "normal",
                 tls: tuple[str, str] | None = None, loop: str = DEFAULT_LOOP) -> None:
    """Child process: an orchestrator with the synthetic composition on 127.0.0.1:<free port>, its state kept in
    ``state_db`` when given (as --state-dir does); HTTPS with ``tls`` = (cert, key); on event loop ``loop``."""
    from petals_chain.compose.method_table import paper_composition
    from petals_chain.orchestrator.http.api import build_app, serve
    from petals_chain.orchestrator.engine.composition import CompositionPolicy
    from petals_chain.orchestrator.engine.config import OrchestratorConfig
    from petals_chain.orchestrator.engine.core import Orchestrator
    from petals_chain.orchestrator.http.exposure import server_tls
    from petals_chain.orchestrator.state.registry import Registry

    comp = synthetic_composition(num_chains, np.random.default_rng(seed))
    registry = Registry(MODEL)
    # the composer its numbers were taken with (a restore recomposes the planned servers)
    composing = CompositionPolicy(paper_composition, arrival_rate=1.0)
    registry.add_planned(comp.servers)

    async def main() -> None:
        """Open the store and restore from it on the loop (restored waiters need it), then serve."""
        state = None
        if state_db is not None:
            from petals_chain.orchestrator.state.persist import Persistence
            from petals_chain.orchestrator.state.store import StateStore

            sync, _, unbatched = mode.partition("-")
            state = Persistence(StateStore(state_db, synchronous=sync), group_commit=not unbatched)
        orch = Orchestrator(registry, OrchestratorConfig(heartbeat_timeout_s=None), composition_policy=composing,
                            state=state)
        orch.install(comp)
        if state is not None:
            state.restore(attach_grace_s=60.0)
        await serve(build_app(orch), "127.0.0.1", 0, on_ready=lambda host, port: conn.send(port),
                    ssl_context=server_tls(*tls) if tls is not None else None)

    event_loop.run(main(), loop)


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) the process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _http_level(url: str, concurrency: int, requests: int, warmup: int,
                      ca_file: str | None = None, client: str = "protocol") -> dict[str, float]:
    """`requests` lease+release round trips from `concurrency` workers; rate and latency percentiles, and the CPU
    this driving process spent per round trip. ``client``: the protocol's own client (aiohttp), or the lean
    generator of bench/raw_http.py (plain HTTP only)."""
    import aiohttp
    from tqdm import tqdm

    from petals_chain.bench.raw_http import round_trips
    from petals_chain.protocol.http_client import OrchestratorClient

    latencies: list[float] = []
    connector = aiohttp.TCPConnector(limit=concurrency + 4)
    async with aiohttp.ClientSession(connector=connector) as session:
        oc = OrchestratorClient(url, session=session, ca_file=ca_file)
        bar = tqdm(total=requests, desc=f"concurrency {concurrency}", leave=False)
        cpu0 = time.process_time()
        if client == "raw":
            latencies, elapsed = await round_trips(url, concurrency, requests, warmup, lambda: bar.update(1))
        else:
            for _ in range(warmup):
                lease = await oc.lease(timeout_s=30)
                await oc.release(lease.lease_id)
            remaining = [requests]

            async def worker() -> None:
                while remaining[0] > 0:
                    remaining[0] -= 1
                    t0 = time.perf_counter()
                    lease = await oc.lease(timeout_s=30)
                    await oc.release(lease.lease_id)
                    latencies.append(time.perf_counter() - t0)
                    bar.update(1)

            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            elapsed = time.perf_counter() - t0
        driver_cpu_s = time.process_time() - cpu0
        bar.close()
        health = await oc.health()
    lat = np.array(latencies)
    if health["active_leases"] != 0 or health["free"] != health["capacity"]:
        raise RuntimeError(f"capacity not restored after the run: {health}")
    return {
        "concurrency": concurrency,
        "client": client,
        "round_trips": len(lat),
        "round_trips_per_s": len(lat) / elapsed,
        "p50_ms": float(np.percentile(lat, 50) * 1e3),
        "p99_ms": float(np.percentile(lat, 99) * 1e3),
        "mean_ms": float(lat.mean() * 1e3),
        "client_cpu_us_per_round_trip": driver_cpu_s / (requests + warmup) * 1e6,
    }


class DispatcherJFFC:
    """JFFC's arrivals and departures as the live policy made them before issue 26: the same two rules
    (:func:`~petals_chain.kernels.dispatch_rules.jffc_arrival`,
    :func:`~petals_chain.kernels.dispatch_rules.jffc_release`) on five separate arrays, called through numba's
    dispatcher. Kept only as the reference that :class:`~petals_chain.dispatch.jffc.JFFC` is timed against here
    and checked against in its tests."""

    def __init__(self, rates: Sequence[float], capacities: Sequence[int]) -> None:
        self.rates, self.capacities = check_chains(rates, capacities)
        self._by_rank, self._rank_of = speed_order(self.rates)
        self._caps = np.asarray(self.capacities, dtype=np.int64)
        self._busy = np.zeros(len(self.rates), dtype=np.int64)
        self._free = np.arange(len(self.rates), dtype=np.int64)
        self._nfree = len(self.rates)
        self._queue: deque[int] = deque()

    def on_arrival(self, job: int, now: float = 0.0) -> list[Start]:
        """The fastest free chain's slot, or a place at the end of the queue."""
        k, self._nfree = jffc_arrival(self._busy, self._caps, self._by_rank, self._free, self._nfree)
        if k < 0:
            self._queue.append(job)
            return []
        return [Start(job, k)]

    def on_departure(self, job: int, chain: int, now: float = 0.0) -> list[Start]:
        """The freed slot to the queue's head, or back to the free chains."""
        if self._busy[chain] <= 0:
            raise ValueError(f"JFFC: departure from chain {chain}, which has no job in service")
        if self._queue:
            return [Start(self._queue.popleft(), chain)]
        self._nfree = jffc_release(self._busy, self._caps, self._rank_of, self._free, self._nfree, chain)
        return []

    def occupancy(self) -> list[int]:
        """Jobs in service per chain."""
        return self._busy.tolist()

    def queue_length(self) -> int:
        """Jobs waiting."""
        return len(self._queue)


def jffc_decision_us(comp: Composition, pairs: int, repeat: int, rng: np.random.Generator,
                     policy: Any = JFFC) -> dict[str, float]:
    """µs per JFFC decision (arrival or departure) of ``policy`` (a class), best of `repeat`: with free chains, and
    saturated."""
    rates = [ch.rate_per_s for ch in comp.chains]
    caps = [ch.capacity for ch in comp.chains]
    total = sum(caps)
    out: dict[str, float] = {}
    best = float("inf")
    for _ in range(repeat):  # about half the capacity busy: arrivals find a free chain
        p = policy(rates, caps)
        for j in range(total // 2):
            p.on_arrival(-1 - j)
        t0 = time.perf_counter()
        for i in range(pairs):
            k = p.on_arrival(i)[0].chain
            p.on_departure(i, k)
        best = min(best, time.perf_counter() - t0)
    out["free_us"] = best / (2 * pairs) * 1e6
    best = float("inf")
    chains = rng.integers(0, len(caps), size=pairs).tolist()
    for _ in range(repeat):  # every slot busy: arrivals queue, departures hand the slot to the head
        p = policy(rates, caps)
        for j in range(total):
            p.on_arrival(-1 - j)
        t0 = time.perf_counter()
        for i in range(pairs):
            p.on_arrival(i)
            p.on_departure(i, chains[i])
        best = min(best, time.perf_counter() - t0)
    out["saturated_us"] = best / (2 * pairs) * 1e6
    return out


def jffc_old_vs_new(sizes: Sequence[int], pairs: int, seed: int) -> list[dict[str, float]]:
    """The live JFFC against :class:`DispatcherJFFC` (the dispatcher path it replaced), in turns at each size;
    printed, with the old/new ratios."""
    rows = []
    print(f"{'chains':>7} {'capacity':>8} {'old free µs':>12} {'new free µs':>12} {'ratio':>6} "
          f"{'old sat. µs':>12} {'new sat. µs':>12} {'ratio':>6}")
    for n in sizes:
        comp = synthetic_composition(n, np.random.default_rng(seed))
        old = jffc_decision_us(comp, pairs, 5, np.random.default_rng(seed), DispatcherJFFC)
        new = jffc_decision_us(comp, pairs, 5, np.random.default_rng(seed), JFFC)
        row = {"chains": n, "capacity": comp.total_capacity, "old_free_us": old["free_us"],
               "new_free_us": new["free_us"], "old_saturated_us": old["saturated_us"],
               "new_saturated_us": new["saturated_us"]}
        rows.append(row)
        print(f"{n:>7} {comp.total_capacity:>8} {old['free_us']:>12.3f} {new['free_us']:>12.3f} "
              f"{old['free_us'] / new['free_us']:>5.2f}x {old['saturated_us']:>12.3f} {new['saturated_us']:>12.3f} "
              f"{old['saturated_us'] / new['saturated_us']:>5.2f}x", flush=True)
    return rows


async def _lease_manager_us(comp: Composition, pairs: int) -> float:
    """µs per acquire+release round trip in the LeaseManager itself (no HTTP)."""
    from petals_chain.orchestrator.engine.chains import chain_infos
    from petals_chain.orchestrator.leasing.leases import LeaseManager

    lm = LeaseManager()
    lm.set_chains(chain_infos(comp, 1), 1)
    t0 = time.perf_counter()
    for _ in range(pairs):
        lease = await lm.acquire(timeout_s=1)
        lm.release(lease.lease_id)
    return (time.perf_counter() - t0) / pairs * 1e6


def _http_run(args: argparse.Namespace, tls: tuple[str, str] | None) -> list[dict[str, float]]:
    """Every concurrency level against a fresh orchestrator child (HTTPS with ``tls`` = (cert, key))."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_serve_child, args=(args.chains, args.seed, child, None, "off", tls, args.loop[-1]),
                       daemon=True)
    proc.start()
    out = []
    try:
        if not parent.poll(60):
            raise RuntimeError("the orchestrator child did not start within 60 s")
        url = f"{'https' if tls else 'http'}://127.0.0.1:{parent.recv()}"
        print(f"orchestrator at {url} with {args.chains} chains (child pid {proc.pid})")
        print(f"{'concurrency':>11} {'round trips/s':>14} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
        for c in args.concurrency:
            r = asyncio.run(_http_level(url, c, args.requests, warmup=min(50, args.requests),
                                        ca_file=tls[0] if tls else None))
            out.append(r)
            print(f"{c:>11} {r['round_trips_per_s']:>14.0f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
                  f"{r['mean_ms']:>8.2f}", flush=True)
    finally:
        proc.terminate()
        proc.join(10)
    return out


def _start_children(args: argparse.Namespace, runs: list[tuple[str, str]],
                    tmp: Path) -> tuple[dict[tuple[str, str], str], dict[tuple[str, str], Any]]:
    """One orchestrator child per (persistence mode, event loop); their URLs (once each listens) and processes."""
    ctx = mp.get_context("spawn")
    urls: dict[tuple[str, str], str] = {}
    procs: dict[tuple[str, str], Any] = {}
    for mode, loop in runs:
        parent, child = ctx.Pipe()
        state = None if mode == "off" else str(tmp / f"{mode}-{loop}.sqlite3")
        proc = ctx.Process(target=_serve_child, args=(args.chains, args.seed, child, state, mode, None, loop),
                           daemon=True)
        proc.start()
        procs[(mode, loop)] = proc
        if not parent.poll(120):
            raise RuntimeError(f"the orchestrator child ({mode}, {loop}) did not start within 120 s")
        urls[(mode, loop)] = f"http://127.0.0.1:{parent.recv()}"
        print(f"orchestrator (persistence {mode}, {loop}) at {urls[(mode, loop)]} with {args.chains} chains "
              f"(child pid {proc.pid})")
    return urls, procs


def run(argv: list[str] | None = None) -> int:
    """Print HTTP lease+release rates and latencies, then the JFFC and LeaseManager decision times."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.bench orchestrator", description=__doc__)
    p.add_argument("--chains", type=int, default=1000)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--requests", type=int, default=2000, help="round trips per concurrency level")
    p.add_argument("--pairs", type=int, default=200_000, help="arrival+departure pairs for the JFFC timing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="fewer requests and pairs (a smoke run)")
    p.add_argument("--persistence", nargs="+", choices=PERSISTENCE_MODES, default=list(DEFAULT_MODES),
                   help="orchestrators to compare: off, and --state-dir with SQLite synchronous NORMAL / FULL "
                        "(group commit; '-unbatched': a commit per write)")
    p.add_argument("--loop", nargs="+", choices=LOOPS, default=list(LOOPS),
                   help="the orchestrator's event loop: asyncio's, uvloop (the default since issue 26), or both "
                        "(old vs new, in turns)")
    p.add_argument("--client", nargs="+", choices=("protocol", "raw"), default=["protocol"],
                   help="the load generator: the protocol's own client (aiohttp, as clients use it), the lean one of "
                        "bench/raw_http.py (a fraction of its CPU: measures the orchestrator, not the generator), "
                        "or both in turns")
    p.add_argument("--json", type=Path, default=None, help="also write the figures to this JSON file")
    p.add_argument("--no-tls", action="store_true", help="skip the HTTPS run")
    p.add_argument("--jffc-only", action="store_true",
                   help="only the JFFC decision times, old vs new at 10, 100, 1000 and --chains chains (no HTTP)")
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.pairs = min(args.requests, 200), min(args.pairs, 20_000)
    if args.chains < 1 or args.requests < 1 or min(args.concurrency) < 1:
        print("error: --chains, --requests and --concurrency must be >= 1")
        return 2

    results: dict[str, Any] = {"chains": args.chains, "seed": args.seed, "http": [], "persistence": []}
    if not args.jffc_only:
        _http_runs(args, results)
    sizes = sorted({10, 100, 1000, args.chains})
    print("JFFC decision (µs per arrival or departure, no HTTP): old = the rules through numba's dispatcher "
          "(before issue 26), new = the live policy")
    results["jffc_old_vs_new"] = jffc_old_vs_new(sizes, args.pairs, args.seed)
    row = next(r for r in results["jffc_old_vs_new"] if r["chains"] == args.chains)
    results["jffc"] = {"free_us": row["new_free_us"], "saturated_us": row["new_saturated_us"]}
    comp = synthetic_composition(args.chains, np.random.default_rng(args.seed))
    results["lease_manager_round_trip_us"] = asyncio.run(_lease_manager_us(comp, min(args.pairs, 50_000)))
    print(f"JFFC decision, {args.chains} chains (capacity {comp.total_capacity}): "
          f"{results['jffc']['free_us']:.2f} µs with free chains, "
          f"{results['jffc']['saturated_us']:.2f} µs saturated (queue hand-off)")
    print(f"LeaseManager acquire+release in-process: {results['lease_manager_round_trip_us']:.1f} µs")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
    return 0


def _http_runs(args: argparse.Namespace, results: dict[str, Any]) -> None:
    """The HTTP lease+release levels per persistence mode, then over HTTPS unless --no-tls; into ``results``."""
    modes = list(dict.fromkeys(args.persistence))
    loops = list(dict.fromkeys(args.loop))
    runs = [(mode, loop) for mode in modes for loop in loops]
    clients = list(dict.fromkeys(args.client))
    with tempfile.TemporaryDirectory(prefix="bench-orchestrator-") as tmp:
        urls, procs = _start_children(args, runs, Path(tmp))
        try:
            print("orch µs/rt: the orchestrator process's CPU (every thread) per lease + release; its rate on a core "
                  "of its own would be about 1e6 / that. client µs/rt: the same for the driving process (the "
                  "load generator, on the same cores)")
            print(f"{'persistence':>16} {'loop':>8} {'client':>8} {'concurrency':>11} {'round trips/s':>14} "
                  f"{'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'vs off':>7} {'orch µs/rt':>11} {'client µs/rt':>13}")
            warmup = min(50, args.requests)
            for c in args.concurrency:
                off: dict[tuple[str, str], dict[str, float]] = {}
                for client in clients:
                    for mode, loop in runs:
                        cpu0 = _cpu_s(procs[(mode, loop)].pid)
                        level = _http_level(urls[(mode, loop)], c, args.requests, warmup=warmup, client=client)
                        # the lean generator runs on uvloop, as a lean generator would; the protocol client on
                        # asyncio's loop, as clients do (and as every earlier figure was measured)
                        r = event_loop.run(level, "uvloop") if client == "raw" else asyncio.run(level)
                        r["orchestrator_cpu_us_per_round_trip"] = (
                            (_cpu_s(procs[(mode, loop)].pid) - cpu0) / (args.requests + warmup) * 1e6)
                        r["persistence"], r["loop"] = mode, loop
                        if mode == "off":
                            off[(loop, client)] = r
                            if loop == loops[-1] and client == clients[0]:  # the loop the HTTPS run uses
                                results["http"].append(r)
                        base = off.get((loop, client))
                        ratio = base["round_trips_per_s"] / r["round_trips_per_s"] if base else None
                        r["cost_vs_off"] = ratio
                        results["persistence"].append(r)
                        print(f"{mode:>16} {loop:>8} {client:>8} {c:>11} {r['round_trips_per_s']:>14.0f} "
                              f"{r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} {r['mean_ms']:>8.2f} "
                              f"{'' if ratio is None else f'{ratio:.2f}x':>7} "
                              f"{r['orchestrator_cpu_us_per_round_trip']:>11.0f} "
                              f"{r['client_cpu_us_per_round_trip']:>13.0f}", flush=True)
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.join(10)
    if len(loops) == 2:
        for c in args.concurrency:
            for mode in modes:
                a, b = (next(r for r in results["persistence"] if (r["persistence"], r["loop"], r["concurrency"],
                                                                   r["client"]) == (mode, loop, c, clients[0]))
                        for loop in loops)
                print(f"{mode} at concurrency {c}: {loops[1]}/{loops[0]} round trips/s "
                      f"{b['round_trips_per_s'] / a['round_trips_per_s']:.2f}x, p99 "
                      f"{b['p99_ms'] / a['p99_ms']:.2f}x, orchestrator CPU per round trip "
                      f"{b['orchestrator_cpu_us_per_round_trip'] / a['orchestrator_cpu_us_per_round_trip']:.2f}x")
    for r in results["persistence"]:
        if r["persistence"] != "off" and r["cost_vs_off"] is not None and r["concurrency"] == max(args.concurrency):
            verdict = "within" if r["cost_vs_off"] <= 2.0 else "OVER"
            print(f"persistence {r['persistence']} ({r['loop']}, {r['client']} client) at concurrency "
                  f"{r['concurrency']}: "
                  f"{r['cost_vs_off']:.2f}x the time per round trip without it ({verdict} the 2x budget)")
    if not args.no_tls:
        with tempfile.TemporaryDirectory() as folder:
            results["https"] = _http_run(args, self_signed_pair(Path(folder)))  # made for this run
        print(f"{'concurrency':>11} {'TLS/plain round trips/s':>24} {'TLS/plain p99':>14}")
        for plain, tls in zip(results["http"], results["https"]):
            rate = tls["round_trips_per_s"] / plain["round_trips_per_s"]
            p99 = tls["p99_ms"] / plain["p99_ms"]
            tls["rate_vs_plain"], tls["p99_vs_plain"] = rate, p99
            print(f"{plain['concurrency']:>11} {rate:>24.2f} {p99:>14.2f}")
