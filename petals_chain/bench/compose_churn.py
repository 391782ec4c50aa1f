"""`python -m petals_chain.bench compose --churn N`: N joins and leaves at a volunteer swarm's rates, through the
orchestrator's own code (registry, repair, full recomposition, lease manager), on the benchmark's cluster of J
servers (default 1000).

For each event it prints how long the orchestrator took to change the offered chains (the repair: compose/
repair.py, installed), how long the full recomposition that follows took, and the capacity ν = Σ c_k μ_k offered
before the event, right after it (a dead server's chains withdrawn), after the repair and after the full
recomposition. A chain counts as *ready* only where every server on it already holds the blocks it serves there:
servers given new blocks must load them first (minutes in a real swarm), so the bench also counts the servers each
step sends loading. Loading is taken to finish before the next event. Meanwhile a client loop takes and returns
leases on the event loop, and its round-trip times during the full recompositions show whether they stall the API:
the run is made with the recomposition in a thread and again in a worker process, on the same events.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import dataclass

import numpy as np

from petals_chain.bench.cluster import BLOOM, bench_registry, bench_servers
from petals_chain.compose.method_table import proposed_composition
from petals_chain.model import ServerSpec
from petals_chain.orchestrator.engine.chains import total_rate_per_s
from petals_chain.orchestrator.engine.composition import CompositionPolicy
from petals_chain.orchestrator.engine.config import OrchestratorConfig
from petals_chain.orchestrator.engine.core import Orchestrator


@dataclass(frozen=True)
class Event:
    """A server leaves (picked when it happens) or joins (``spec``)."""

    kind: str
    name: str
    spec: ServerSpec | None = None


def volunteer_trace(servers: list[ServerSpec], events: int, rng: np.random.Generator) -> list[Event]:
    """Joins and leaves in equal numbers on average (a swarm of steady size): a join brings a fresh server of one
    of the cluster's kinds; a leave is drawn when the event happens (:func:`_pick_leaver`)."""
    out = []
    for i in range(events):
        if rng.random() < 0.5:
            out.append(Event("leave", ""))
        else:
            proto = servers[int(rng.integers(len(servers)))]
            spec = ServerSpec(f"joined{i}", proto.memory_bytes, proto.tau_c_s, proto.tau_p_s)
            out.append(Event("join", spec.name, spec))
    return out


def _pick_leaver(orch: Orchestrator, rng: np.random.Generator) -> str:
    """A server on an offered chain, at random: the leaves that cost capacity (most of a large swarm's servers hold
    no blocks, and their leaving changes nothing)."""
    on_chains = sorted({s.server for c in orch.leases.chains for s in c.spans})
    return on_chains[int(rng.integers(len(on_chains)))]


def _rate(orch: Orchestrator, loaded: dict[str, tuple[int, int]] | None = None) -> float:
    """ν of the offered chains; with ``loaded``, of those whose every span lies in what its server has loaded."""
    return total_rate_per_s(c for c in orch.leases.chains if loaded is None or all(
        s.server in loaded and loaded[s.server][0] <= s.start and s.end <= loaded[s.server][1] for s in c.spans))


def _assigned(orch: Orchestrator) -> dict[str, tuple[int, int]]:
    """Each live server's assigned span (start, end)."""
    return {r.name: (r.assignment.start, r.assignment.end) for r in orch.registry.alive()
            if r.assignment is not None and r.assignment.end > r.assignment.start}


def _to_load(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> int:
    """Servers whose assigned span is new (they must load blocks)."""
    return sum(1 for name, span in after.items() if before.get(name) != span)


async def _lease_loop(orch: Orchestrator, samples: list[float], stop: asyncio.Event) -> None:
    """Take and return one lease after another, recording each round trip, until ``stop``."""
    while not stop.is_set():
        t0 = time.perf_counter()
        lease = await orch.leases.acquire(timeout_s=30.0)
        orch.leases.release(lease.lease_id)
        samples.append(time.perf_counter() - t0)
        await asyncio.sleep(0)


async def _run_mode(servers: list[ServerSpec], trace: list[Event], lam: float, mode: str, seed: int) -> list[dict]:
    """The trace through a fresh orchestrator whose full recompositions run in ``mode``; one row per event (the
    same leavers for the same seed as long as both modes compose alike)."""
    rng = np.random.default_rng(seed)
    registry = bench_registry(servers, time.monotonic())
    policy = CompositionPolicy(proposed_composition, arrival_rate=lam)
    orch = Orchestrator(registry, OrchestratorConfig(heartbeat_timeout_s=None, compose_in=mode),
                        composition_policy=policy)
    orch.recompose_now()
    await orch.composer.compose(policy, registry.snapshot()[1][:20], BLOOM)  # start the worker outside the timings
    rows = []
    try:
        for ev in trace:
            loaded = _assigned(orch)
            nu_before = _rate(orch)
            if ev.kind == "leave":
                registry.mark_dead(_pick_leaver(orch, rng), "churn")
                orch.refresh_offer()  # what server_failed does first: its chains withdrawn
            else:
                registry.register(ev.name, ev.spec.memory_bytes, ev.spec.tau_p_s, ev.spec.tau_c_s,
                                  now_s=time.monotonic())
            nu_event = _rate(orch)
            t0 = time.perf_counter()
            repaired = orch.repair()
            t_repair = time.perf_counter() - t0
            nu_repair, load_repair = _rate(orch, loaded), _to_load(loaded, _assigned(orch))
            samples: list[float] = []
            stop = asyncio.Event()
            client = asyncio.create_task(_lease_loop(orch, samples, stop))
            t0 = time.perf_counter()
            await orch.recompose()
            t_full = time.perf_counter() - t0
            stop.set()
            await client
            rows.append({"kind": ev.kind, "repaired": repaired, "repair_ms": 1e3 * t_repair, "full_s": t_full,
                         "nu_before": nu_before, "nu_event": nu_event, "nu_repair": nu_repair,
                         "nu_full": _rate(orch, loaded), "load_repair": load_repair,
                         "load_full": _to_load(loaded, _assigned(orch)), "lease_rt": samples})
    finally:
        orch.close()
    return rows


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def churn(args: argparse.Namespace) -> int:
    """Run the trace with the full recomposition in a thread, then in a process; print per-event rows and totals."""
    rng = np.random.default_rng(args.seed)
    servers = bench_servers(args.churn_j, args.eta, rng)
    lam = args.rate_per_server * args.churn_j
    trace = volunteer_trace(servers, args.churn, rng)
    rate = 2 * args.churn_j / args.mean_uptime_s
    print(f"churn: J={args.churn_j}, lambda={lam:g}/s, {args.churn} events (joins and leaves alike); a volunteer "
          f"swarm with servers up {args.mean_uptime_s:g} s on average sees one every {1 / rate:.1f} s")
    print("a leave takes a server on an offered chain; nu = sum c_k mu_k of the chains offered (jobs/s); ready = "
          "every server on the chain already holds its blocks; load = servers sent loading new blocks")
    for mode in ("thread", "process"):
        rows = asyncio.run(_run_mode(servers, trace, lam, mode, args.seed))
        print(f"\n# full recomposition in a {mode}")
        print(f"{'#':>3} {'event':>6} {'repair ms':>10} {'full s':>7} {'nu before':>10} {'at event':>9} "
              f"{'repaired':>9} {'full':>7} {'load rep':>9} {'load full':>10} {'lease p99 ms':>13} {'max ms':>7}")
        for i, r in enumerate(rows):
            print(f"{i:>3} {r['kind']:>6} {r['repair_ms']:>10.2f} {r['full_s']:>7.2f} {r['nu_before']:>10.2f} "
                  f"{r['nu_event']:>9.2f} {r['nu_repair']:>9.2f} {r['nu_full']:>7.2f} {r['load_repair']:>9} "
                  f"{r['load_full']:>10} {1e3 * _pct(r['lease_rt'], 99):>13.2f} "
                  f"{1e3 * max(r['lease_rt'], default=0):>7.2f}")
        rt = [x for r in rows for x in r["lease_rt"]]
        rep = [r["repair_ms"] for r in rows]
        full = [r["full_s"] for r in rows]
        leaves = [r for r in rows if r["kind"] == "leave"]
        lost_event = [1 - r["nu_event"] / r["nu_before"] for r in leaves if r["nu_before"]]
        lost_repair = [1 - r["nu_repair"] / r["nu_before"] for r in leaves if r["nu_before"]]
        print(f"summary ({mode}): repair median {statistics.median(rep):.2f} ms, max {max(rep):.2f} ms; full "
              f"recomposition median {statistics.median(full):.2f} s, max {max(full):.2f} s; leaves withdraw "
              f"{100 * np.mean(lost_event):.1f} % of nu (mean), {100 * np.mean(lost_repair):.1f} % still not ready "
              f"after the repair; servers sent loading: repair {np.mean([r['load_repair'] for r in rows]):.1f}, "
              f"full {np.mean([r['load_full'] for r in rows]):.1f} per event; lease round trip during full "
              f"recompositions: p50 {1e3 * _pct(rt, 50):.3f} ms, p99 {1e3 * _pct(rt, 99):.2f} ms, max "
              f"{1e3 * max(rt, default=0):.1f} ms over {len(rt)} leases", flush=True)
    return 0
