"""`python -m petals_chain.bench swarm`: the orchestrator's own code (registry, repair, recomposition, lease manager,
sweeper, failure reports) driven by a simulated swarm on a virtual clock.

J in-process fake servers (default 1000, the benchmark's cluster) register, heartbeat every
``defaults.HEARTBEAT_PERIOD_S`` with the span they serve, load the blocks they are assigned (``--load-s`` of virtual
time, serving nothing meanwhile) and leave by falling silent; fresh servers join. Requests from ``--clients``
clients arrive as a Poisson stream at the rate the composition is sized for, lease a chain, hold it for an
exponential time of the chain's mean T_k and release it; a client whose chain lost a server reports the failure
``--detect-s`` later and is leased a replacement, keeping its place in line. At ``--burst-at`` a burst of
``--burst`` servers falls silent at once.

Virtual time jumps from event to event, except while a recomposition runs (in the orchestrator's worker process or
thread): then it follows the wall clock, so the orchestrator keeps answering for exactly as long as its
recomposition really takes. The chains are offered only once every server on them serves its span
(``offer_when_serving``), so the capacity offered is the capacity ready.

It prints the lease latency (the orchestrator's wall time per immediate grant, the virtual wait in line), the
capacity ν = Σ c_k μ_k offered before and after the burst and the virtual time until it is back to 95 % of what it
was, and every slot it found double-booked: a chain holding more leases than its capacity, or a server asked for
more cache slots than its blocks leave it, checked every virtual second.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from petals_chain import defaults
from petals_chain.bench.cluster import BLOOM, bench_registry, bench_servers
from petals_chain.compose.method_table import proposed_composition
from petals_chain.model import ServerSpec
from petals_chain.orchestrator.engine.chains import total_rate_per_s
from petals_chain.orchestrator.engine.composition import CompositionPolicy
from petals_chain.orchestrator.engine.config import OrchestratorConfig
from petals_chain.orchestrator.engine.core import Orchestrator
from petals_chain.orchestrator.leasing.leases import Lease
from petals_chain.orchestrator.engine.metrics import cache_slots_by_server
from petals_chain.protocol.requests import HeartbeatBody, RegisterBody, SpanBody


class VirtualClock:
    """The orchestrator's clock: the simulation sets ``now``."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeServer:
    """A server as the orchestrator sees it: its figures, the span it serves (None while loading), alive or not."""

    spec: ServerSpec
    serving: tuple[int, int] | None = None
    loading: tuple[int, int] | None = None
    alive: bool = True


@dataclass
class Stats:
    """What the run measured."""

    grant_wall_s: list[float]
    waits_s: list[float]
    samples: list[tuple[float, float, float, int, int]]  # (virtual s, ν offered, ν on live servers, held, waiting)
    double_booked: int
    checks: int
    completed: int
    failures_reported: int
    loads: int
    repairs: int
    recompositions: int
    slowest: dict[str, float]  # kind of event -> the longest wall time one took on the event loop


class SwarmSim:
    """One run; :meth:`run` returns its :class:`Stats`."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = np.random.default_rng(args.seed)
        self.clock = VirtualClock()
        self.events: list[tuple[float, int, str, object]] = []
        self.seq = itertools.count()
        self.servers: dict[str, FakeServer] = {}
        self.pending: set[asyncio.Task] = set()
        self.pace: tuple[float, float] | None = None  # (wall, virtual) when a recomposition started
        self.holding: dict[str, tuple[int, float]] = {}  # lease id -> (request, virtual end of its service)
        self.grant_wall: list[float] = []
        self.waits: list[float] = []
        self.samples: list[tuple[float, float, float, int, int]] = []
        self.double_booked = self.checks = self.completed = self.reported = self.loads = 0
        self.joined = 0
        self.slowest: dict[str, float] = defaultdict(float)

    # ---- events -----------------------------------------------------------------------------------

    def at(self, t: float, kind: str, payload: object = None) -> None:
        heapq.heappush(self.events, (t, next(self.seq), kind, payload))

    def background(self, coro) -> None:
        """Run an orchestrator call that may recompose as a task; virtual time follows the wall clock meanwhile."""
        task = asyncio.create_task(coro)
        if not self.pending:
            self.pace = (time.perf_counter(), self.clock.now)
        self.pending.add(task)

    async def _advance_to(self, t: float) -> None:
        """Wait, while a recomposition runs, until virtual time ``t`` is no later than the wall clock allows."""
        while self.pending:
            self.pending = {x for x in self.pending if not x.done()}
            if not self.pending:
                break
            wall0, virt0 = self.pace
            now = virt0 + time.perf_counter() - wall0
            self.clock.now = max(self.clock.now, min(t, now))  # the orchestrator's time flows while it composes
            if t <= now:
                break
            await asyncio.sleep(0.001)
        for task in list(self.pending):
            if task.done() and task.exception() is not None:
                raise task.exception()

    # ---- the swarm ----------------------------------------------------------------------------------

    def _assigned(self, name: str) -> tuple[int, int] | None:
        a = self.orch.registry.servers[name].assignment
        return None if a is None or a.end <= a.start else (a.start, a.end)

    async def _heartbeat(self, name: str) -> None:
        srv = self.servers[name]
        if not srv.alive:
            return
        want = self._assigned(name)
        if want is not None and want != srv.serving and want != srv.loading:
            srv.serving, srv.loading = None, want  # drops its old blocks, loads the new ones
            self.loads += 1
            self.at(self.clock.now + self.args.load_s, "loaded", (name, want))
        elif want is None:
            srv.serving = srv.loading = None
        span = None if srv.serving is None else SpanBody(start=srv.serving[0], end=srv.serving[1])
        await self.orch.heartbeat(HeartbeatBody(name=name, serving=span))
        self.at(self.clock.now + defaults.HEARTBEAT_PERIOD_S, "heartbeat", name)

    def _leave(self, name: str) -> None:
        """The server falls silent; clients on its chains report it ``--detect-s`` later."""
        srv = self.servers[name]
        srv.alive, srv.serving, srv.loading = False, None, None
        for lease in self.orch.leases.leases():
            if lease.lease_id in self.holding and name in {s.server for s in lease.chain.spans}:
                self.at(self.clock.now + self.args.detect_s, "report", (lease.lease_id, name))

    def _join(self) -> None:
        protos = [s.spec for s in self.servers.values()]
        proto = protos[int(self.rng.integers(len(protos)))]
        spec = ServerSpec(f"joined{self.joined}", proto.memory_bytes, proto.tau_c_s, proto.tau_p_s)
        self.joined += 1
        self.servers[spec.name] = FakeServer(spec)
        self.background(self.orch.register(RegisterBody(name=spec.name, memory_bytes=spec.memory_bytes,
                                                        tau_p_s=spec.tau_p_s, tau_c_s=spec.tau_c_s,
                                                        max_batch_sessions=defaults.MAX_BATCH_SESSIONS)))
        self.at(self.clock.now + 0.01, "heartbeat", spec.name)

    # ---- clients ------------------------------------------------------------------------------------

    def _request(self, req: int) -> None:
        client = f"client{int(self.rng.integers(self.args.clients))}"
        asyncio.create_task(self._lease(req, client))

    async def _lease(self, req: int, client: str) -> None:
        """Lease for request ``req``; the wall time of the call is the orchestrator's work when it grants at once
        (it then never suspends)."""
        t0 = time.perf_counter()
        lease = await self.orch.leases.acquire(timeout_s=1e9, client=client)
        self._granted(req, lease, time.perf_counter() - t0)

    def _granted(self, req: int, lease: Lease, wall_s: float) -> None:
        if lease.waited_s == 0:
            self.grant_wall.append(wall_s)
        self.waits.append(lease.waited_s)
        end = self.clock.now + float(self.rng.exponential(lease.chain.service_time_s))
        self.holding[lease.lease_id] = (req, end)
        self.at(end, "done", lease.lease_id)

    async def _report(self, lease_id: str, server: str) -> None:
        if lease_id not in self.holding:
            return
        req, _ = self.holding.pop(lease_id)
        self.reported += 1
        t0 = time.perf_counter()
        lease = await self.orch.report_failure(lease_id, server, timeout_s=1e9)
        self._granted(req, lease, time.perf_counter() - t0)

    # ---- checks -------------------------------------------------------------------------------------

    def _check(self) -> None:
        """Every virtual second: ν offered (and of it, on servers still alive: the orchestrator learns of a silent
        server only from its heartbeat timeout or a client's report), and whether any chain or server is booked
        past its capacity."""
        leases = [x for x in self.orch.leases.leases() if x.chain_index is not None]
        slots = cache_slots_by_server(self.orch.registry.composition)
        per_chain, per_server = Counter(), defaultdict(int)
        cap = {c.key: c.capacity for c in self.orch.leases.chains}
        for x in leases:
            per_chain[x.chain.key] += 1
            for s in x.chain.spans:
                per_server[s.server] += s.end - s.start
        self.checks += 1
        self.double_booked += sum(1 for k, n in per_chain.items() if n > cap.get(k, 0))
        self.double_booked += sum(1 for s, n in per_server.items() if n > slots.get(s, 0))
        chains = self.orch.leases.chains
        nu = total_rate_per_s(chains)
        live = total_rate_per_s(c for c in chains if all(self.servers[s.server].alive for s in c.spans))
        self.samples.append((self.clock.now, nu, live, len(leases), len(self.orch.leases.queued())))

    # ---- the run ------------------------------------------------------------------------------------

    async def run(self) -> Stats:
        a = self.args
        specs = bench_servers(a.servers, a.eta, self.rng)
        lam = a.rate_per_server * a.servers
        registry = bench_registry(specs, 0.0)
        self.servers = {s.name: FakeServer(s) for s in specs}
        config = OrchestratorConfig(lease_ttl_s=1e9, heartbeat_timeout_s=defaults.HEARTBEAT_TIMEOUT_S,
                                    offer_when_serving=True, compose_in=a.compose_in)
        self.orch = orch = Orchestrator(registry, config, clock=self.clock,
                                        composition_policy=CompositionPolicy(proposed_composition, arrival_rate=lam))
        orch.recompose_now()
        for name, srv in self.servers.items():  # a warm swarm: everyone serves what it was assigned
            srv.serving = self._assigned(name)
            span = None if srv.serving is None else {"start": srv.serving[0], "end": srv.serving[1]}
            registry.heartbeat(name, now_s=0.0, serving=span)
            self.at(float(self.rng.uniform(0, defaults.HEARTBEAT_PERIOD_S)), "heartbeat", name)
        orch.refresh_offer()
        await orch.composer.compose(orch.composition_policy, registry.snapshot()[1][:20], BLOOM)  # start its worker
        t, req = 0.0, 0
        while True:
            t += float(self.rng.exponential(1 / lam))
            if t >= a.horizon_s:
                break
            self.at(t, "arrival", req)
            req += 1
        churn = 2 * a.servers / a.mean_uptime_s
        t = 0.0
        while True:
            t += float(self.rng.exponential(1 / churn))
            if t >= a.horizon_s:
                break
            self.at(t, "leave" if self.rng.random() < 0.5 else "join")
        self.at(a.burst_at_s, "burst")
        for k in range(int(a.horizon_s) + 1):
            self.at(float(k), "check")
            self.at(k + 0.5, "sweep")
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            if t > a.horizon_s:
                break
            await self._advance_to(t)
            self.clock.now = max(self.clock.now, t)
            w0 = time.perf_counter()
            if kind == "arrival":
                self._request(payload)
            elif kind == "done":
                if payload in self.holding:
                    del self.holding[payload]
                    if orch.leases.has(payload):
                        orch.leases.release(payload)
                    self.completed += 1
            elif kind == "heartbeat":
                await self._heartbeat(payload)
            elif kind == "loaded":
                name, span = payload
                srv = self.servers[name]
                if srv.alive and srv.loading == span:
                    srv.serving, srv.loading = span, None
            elif kind == "leave":
                live = [n for n, s in self.servers.items() if s.alive]
                self._leave(live[int(self.rng.integers(len(live)))])
            elif kind == "join":
                self._join()
            elif kind == "burst":
                live = [n for n, s in self.servers.items() if s.alive]
                for i in self.rng.choice(len(live), size=min(a.burst, len(live) - 1), replace=False):
                    self._leave(live[int(i)])
            elif kind == "report":
                self.background(self._report(*payload))
            elif kind == "sweep":
                self.background(orch.sweep())
            elif kind == "check":
                self._check()
            for _ in range(3):  # let grants and callbacks run at this virtual time
                await asyncio.sleep(0)
            self.slowest[kind] = max(self.slowest[kind], time.perf_counter() - w0)
        for task in self.pending:
            task.cancel()
        orch.close()
        return Stats(self.grant_wall, self.waits, self.samples, self.double_booked, self.checks, self.completed,
                     self.reported, self.loads, orch.repairs, orch.recompositions, dict(self.slowest))


def recovery_s(samples: list[tuple[float, float, float, int, int]], at_s: float,
               share: float = 0.95) -> tuple[float, float, float]:
    """On ν of the chains offered on live servers: (ν before ``at_s`` (mean of the 30 s before), lowest after it,
    virtual seconds until it is back to ``share`` of it and stays there; NaN if it never is)."""
    before = [nu for t, _, nu, _, _ in samples if at_s - 30 <= t < at_s]
    after = [(t, nu) for t, _, nu, _, _ in samples if t >= at_s]
    ref = float(np.mean(before)) if before else math.nan
    low = min((nu for _, nu in after), default=math.nan)
    back = math.nan
    for i, (t, nu) in enumerate(after):
        if all(x >= share * ref for _, x in after[i:]):
            back = t - at_s
            break
    return ref, low, back


def run(argv: list[str] | None = None) -> int:
    """Parse the options, run the simulation, print the figures."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.bench swarm", description=__doc__.split("\n\n")[0])
    p.add_argument("--servers", type=int, default=1000)
    p.add_argument("--clients", type=int, default=10_000)
    p.add_argument("--eta", type=float, default=0.2, help="share of high-end servers")
    p.add_argument("--rate-per-server", type=float, default=0.01, help="λ = this × servers")
    p.add_argument("--horizon-s", type=float, default=600.0, help="virtual seconds simulated")
    p.add_argument("--burst", type=int, default=50, help="servers that fall silent at once")
    p.add_argument("--burst-at-s", type=float, default=240.0)
    p.add_argument("--mean-uptime-s", type=float, default=3600.0, help="a volunteer server's mean time in the swarm")
    p.add_argument("--load-s", type=float, default=60.0, help="virtual seconds a server takes to load new blocks")
    p.add_argument("--detect-s", type=float, default=2.0, help="a client reports a dead server this much later")
    p.add_argument("--compose-in", choices=("thread", "process", "auto"), default="auto")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    bad = [n for n in ("servers", "clients", "horizon_s", "mean_uptime_s", "load_s") if not getattr(args, n) > 0]
    if bad or args.burst < 0 or args.detect_s < 0 or not 0 <= args.burst_at_s < args.horizon_s:
        print(f"error: --{(bad or ['burst / --detect-s / --burst-at-s'])[0].replace('_', '-')} is out of range "
              "(sizes and times > 0, the burst inside the horizon)")
        return 2
    t0 = time.perf_counter()
    st = asyncio.run(SwarmSim(args).run())
    wall = time.perf_counter() - t0
    ref, low, back = recovery_s(st.samples, args.burst_at_s)
    g, w = np.asarray(st.grant_wall_s) * 1e6, np.asarray(st.waits_s)
    print(f"swarm: {args.servers} servers, {args.clients} clients, lambda={args.rate_per_server * args.servers:g}/s, "
          f"{args.horizon_s:g} virtual s in {wall:.1f} wall s; churn: servers up {args.mean_uptime_s:g} s on average, "
          f"burst of {args.burst} at {args.burst_at_s:g} s; loading {args.load_s:g} s; compose_in={args.compose_in}")
    print(f"requests completed {st.completed}; failures reported {st.failures_reported}; servers sent loading "
          f"{st.loads}; compositions installed {st.recompositions} ({st.repairs} repairs)")
    print(f"lease, immediate grants ({g.size}): orchestrator wall time p50 {np.percentile(g, 50):.0f} us, p99 "
          f"{np.percentile(g, 99):.0f} us, max {g.max():.0f} us")
    print(f"wait in line (virtual, {w.size} leases): p50 {np.percentile(w, 50):.2f} s, "
          f"p99 {np.percentile(w, 99):.2f} s, max {w.max():.2f} s")
    head = f"capacity nu on live servers: {ref:.2f} jobs/s before the burst, lowest {low:.2f} after; "
    print(head + (f"back to 95 % and staying there {back:.0f} s after it" if not math.isnan(back) else
                  "not back to 95 % within the horizon"))
    print(f"double-booked: {st.double_booked} (chain or server over its capacity) in {st.checks} checks")
    print("every 20 virtual s: t, nu offered, nu on live servers, leases held, requests waiting")
    for k in range(0, len(st.samples), 100):
        print("  " + "; ".join(f"{t:.0f} {nu:.2f} {live:.2f} {n} {q}"
                               for t, nu, live, n, q in st.samples[k:k + 100:20]))
    print("longest wall time the event loop spent on one event, by kind: " + ", ".join(
        f"{k} {1e3 * v:.1f} ms" for k, v in sorted(st.slowest.items(), key=lambda kv: -kv[1])))
    return 0 if st.double_booked == 0 else 1
