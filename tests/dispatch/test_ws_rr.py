"""WS-RR is one policy: the simulator's BPRR and the live WsRrLeaseManager make identical decisions.

The same arrivals with fixed job sizes are replayed (1) through :func:`simulate_bprr` (``estimate="mean"``)
and (2) through a live :class:`WsRrLeaseManager` on a fake clock, with in-process clients that acquire a lease
on arrival and release it size × T_route after it is granted, in the simulator's event order (a release at
the same instant as an arrival first, releases at one instant in grant order). Every job must get the same
route (servers and block counts), the same start time (bit for bit) and the same place in the start order.
"""

from __future__ import annotations

import ast
import asyncio
import heapq
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from petals_chain.compose.bprr import bprr_concurrency, cg_bp
from petals_chain.compose.routes import Route, RouteGraph
from petals_chain.dispatch.ws_rr import WsRr, best_fit_slots
from petals_chain.model import Composition, InfeasibleError, ModelSpec, Placement, ServerSpec
from petals_chain.orchestrator.leasing import ws_rr as ws_rr_leases
from petals_chain.orchestrator.leasing.leases import Lease
from petals_chain.orchestrator.leasing.ws_rr import WsRrLeaseManager
from petals_chain.sim.baselines import simulate_bprr
from petals_chain.sim.workloads import Workload

REPO = Path(__file__).resolve().parents[2]
BLOOM_LIKE = ModelSpec(70, 1.32, 0.11, name="bloom-like")  # GB per block, GB of cache per block per job


class FakeClock:
    """The orchestrator's clock, set by the test."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def random_cluster(num_servers: int, rate: float, seed: int) -> Composition:
    """Random servers, BPRR's CG-BP placement for ``rate`` (no chains: WS-RR routes per request)."""
    rng = np.random.default_rng(seed)
    servers = [ServerSpec(f"s{j}", float(rng.choice([24.0, 40.0, 48.0, 80.0])), float(rng.uniform(0.01, 0.3)),
                          float(rng.uniform(0.005, 0.05))) for j in range(num_servers)]
    placement = cg_bp(servers, BLOOM_LIKE, bprr_concurrency(servers, BLOOM_LIKE, rate))
    return Composition(tuple(servers), BLOOM_LIKE, placement, ())


def tie_instance() -> Composition:
    """L = 4 on four small servers, times in multiples of 1/4: many events fall on the same instant.

    A holds 1-2, B 3-4, C 2-4 and D 1-4 (slow); M̃ = 8, 6, 3, 4 slots."""
    servers = [ServerSpec("A", 6.0, 0.25, 0.25), ServerSpec("B", 5.0, 0.5, 0.25), ServerSpec("C", 4.5, 0.25, 0.5),
               ServerSpec("D", 6.0, 1.0, 0.5)]
    model = ModelSpec(4, 1.0, 0.5, name="tiny")
    return Composition(tuple(servers), model, Placement((1, 3, 2, 1), (2, 2, 3, 4)), ())


def tie_workload(seed: int, n: int = 150) -> Workload:
    """Arrivals on a 1/4 grid (a third of them together with another), sizes in {1/2, 1, 2}: a fifth of the
    releases fall on an arrival instant and a tenth on another release's."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.choice([0.0, 0.0, 0.25, 0.5, 1.0, 1.5], n))
    return Workload(arrival, rng.choice([0.5, 1.0, 2.0], n))


def exp_workload(rate: float, n: int, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload(np.cumsum(rng.exponential(1.0 / rate, n)), rng.exponential(1.0, n))


def replay_sim(comp: Composition, wl: Workload) -> tuple[list[Route], list[float], list[int]]:
    """Routes, start times and start order of every job in the simulator's BPRR (mean estimates)."""
    graph = RouteGraph.build(comp.servers, comp.model, comp.placement)
    res = simulate_bprr(graph, wl, estimate="mean")
    r = res.records
    assert r["job"].tolist() == list(range(wl.n_jobs))
    return [res.routes[k] for k in r["chain"]], r["start_s"].tolist(), res.start_order.tolist()


def replay_live(comp: Composition, wl: Workload) -> tuple[list[Route], list[float], list[int]]:
    """The same through a live WsRrLeaseManager on a fake clock; clients hold a lease size × T_route."""
    clock = FakeClock()
    mgr = WsRrLeaseManager(default_ttl_s=1e9, clock=clock)
    mgr.set_composition(comp, 1)
    index = {s.name: j for j, s in enumerate(comp.servers)}
    n = wl.n_jobs
    arrival, size = wl.arrival_s.tolist(), wl.size.tolist()
    routes: list[Route] = [()] * n
    start = [math.nan] * n
    order: list[int] = []
    granted: list[Lease] = []  # appended by the clients as they get their leases, in grant order

    async def client(i: int) -> None:
        lease = await mgr.acquire(timeout_s=1e9)
        assert lease.job == i
        granted.append(lease)

    async def drive() -> None:
        heap: list[tuple[float, int, str]] = []  # (release time, grant seq, lease id)
        tasks = []
        seq = i = 0
        while i < n or heap:
            if heap and (i >= n or heap[0][0] <= arrival[i]):
                clock.t, _, lease_id = heapq.heappop(heap)
                mgr.release(lease_id)
            else:
                clock.t = arrival[i]
                tasks.append(asyncio.create_task(client(i)))
                i += 1
            while mgr.counters.requested < i or len(order) + len(granted) < mgr.counters.granted:
                await asyncio.sleep(0)  # let a new arrival commit and the clients granted just now run
            for lease in granted:
                j = lease.job
                routes[j] = tuple((index[sp.server], sp.end - sp.start) for sp in lease.chain.spans)
                start[j] = lease.granted_s
                order.append(j)
                heapq.heappush(heap, (lease.granted_s + size[j] * lease.chain.service_time_s, seq, lease.lease_id))
                seq += 1
            granted.clear()
        await asyncio.gather(*tasks)
        assert mgr.queue_length() == 0 and mgr.free_capacity() == sum(mgr.snapshot().capacities)

    asyncio.run(drive())
    return routes, start, order


def mismatches(sim: tuple[list[Route], list[float], list[int]], live: tuple[list[Route], list[float], list[int]],
               limit: int = 5) -> list[str]:
    """What differs between the two replays (empty if they made identical decisions)."""
    out = []
    for j, (a, b) in enumerate(zip(sim[0], live[0])):
        if a != b:
            out.append(f"job {j}: route {a} in the simulator, {b} live")
    for j, (a, b) in enumerate(zip(sim[1], live[1])):
        if a != b:
            out.append(f"job {j}: starts at {a!r} in the simulator, {b!r} live")
    if sim[2] != live[2]:
        k = next((k for k, (a, b) in enumerate(zip(sim[2], live[2])) if a != b), min(len(sim[2]), len(live[2])))
        out.append(f"start order differs at position {k}: {sim[2][k:k + 3]} in the simulator, {live[2][k:k + 3]} live")
    return out[:limit]


CASES = {
    "ties-0": (tie_instance, lambda: tie_workload(0)),
    "ties-1": (tie_instance, lambda: tie_workload(1)),
    "cluster12-heavy": (lambda: random_cluster(12, 0.6, 3), lambda: exp_workload(0.6, 400, 4)),
    "cluster20-heavy": (lambda: random_cluster(20, 1.2, 5), lambda: exp_workload(1.2, 400, 6)),
    "cluster20-light": (lambda: random_cluster(20, 0.2, 7), lambda: exp_workload(0.2, 300, 8)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_simulator_and_live_lease_manager_make_identical_decisions(case: str) -> None:
    make_comp, make_wl = CASES[case]
    comp, wl = make_comp(), make_wl()
    sim = replay_sim(comp, wl)
    live = replay_live(comp, wl)
    problems = mismatches(sim, live)
    assert not problems, "\n".join(problems)
    waits = np.array(sim[1]) - wl.arrival_s
    assert (waits > 0).mean() > 0.1 or case == "cluster20-light"  # not vacuous: the FIFO and calendar matter
    assert max(len(r) for r in sim[0]) >= 2  # and routes have several hops


class _LateBelief(WsRr):
    """A different policy: it believes jobs take 1.5 × T_route (so it routes differently once jobs wait)."""

    def start_ready(self, now: float) -> list[int]:
        started = super().start_ready(now)
        for job in started:
            self._set_belief(job, now + 1.5 * self._route_s[job])
        return started


class _NoFifo(WsRr):
    """A different start rule: start whoever has free slots, ignoring the commit FIFO."""

    def start_ready(self, now: float) -> list[int]:
        started = []
        for job in list(self._fifo):
            if all(self.free[q] >= m for q, m in self._hops[job]):
                for q, m in self._hops[job]:
                    self.free[q] -= m
                self._set_belief(job, now + self._route_s[job])
                self._in_service.add(job)
                self._fifo.remove(job)
                started.append(job)
        return started


@pytest.mark.parametrize("variant", [_LateBelief, _NoFifo])
def test_the_comparison_catches_a_live_side_that_disagrees(variant: type, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sabotage the live side's policy: the replay comparison must report differences."""
    comp, wl = random_cluster(12, 0.6, 3), exp_workload(0.6, 400, 4)
    sim = replay_sim(comp, wl)
    monkeypatch.setattr(ws_rr_leases, "WsRr", variant)
    assert mismatches(sim, replay_live(comp, wl))


def test_lease_manager_reroutes_waiting_requests_on_a_new_placement() -> None:
    """A recomposition: leases granted on the old placement stay valid but free nothing on the new one (orphans);
    requests still waiting are routed again over the new placement, in order; with no placement they fail."""
    from petals_chain.orchestrator.leasing.leases import LeaseTimeoutError

    old = tie_instance()
    bigger = Composition(tuple(ServerSpec(s.name, 2 * s.memory_bytes, s.tau_c_s, s.tau_p_s) for s in old.servers),
                         old.model, old.placement, ())
    clock = FakeClock()

    async def scenario() -> int:
        mgr = WsRrLeaseManager(clock=clock)
        mgr.set_composition(old, 1)
        tasks = [asyncio.create_task(mgr.acquire(timeout_s=1e9)) for _ in range(12)]
        await asyncio.sleep(0)
        granted = [t.result() for t in tasks if t.done()]
        assert 0 < len(granted) < 12 and mgr.queue_length() == 12 - len(granted)
        clock.t = 1.0
        mgr.set_composition(bigger, 2)  # everything free on the new placement: every waiting request starts
        for _ in range(3):
            await asyncio.sleep(0)
        later = [t.result() for t in tasks[len(granted):]]
        assert all(x.version == 2 and x.granted_s == 1.0 for x in later) and mgr.queue_length() == 0
        assert [x.job for x in later] == list(range(len(granted), 12))
        assert mgr.snapshot().occupancy == [sum(sp.end - sp.start for x in later for sp in x.chain.spans
                                                if sp.server == n) for n in ("A", "B", "C", "D")]
        for x in granted:
            mgr.release(x.lease_id)
        assert mgr.counters.orphans_released == len(granted)
        while mgr.queue_length() == 0:  # fill the new placement until a request waits
            tasks.append(asyncio.create_task(mgr.acquire(timeout_s=1e9)))
            await asyncio.sleep(0)
        mgr.set_composition(None, 3)
        with pytest.raises(LeaseTimeoutError, match="no placement"):
            await tasks[-1]
        return mgr.queue_length()

    assert asyncio.run(scenario()) == 0


# ---- the policy on its own --------------------------------------------------------------------------------------


def two_servers() -> RouteGraph:
    """L = 2; A and B both hold blocks 1-2 with 2 cache slots (one job) each; T_A = 2 s, T_B = 3 s."""
    servers = [ServerSpec("A", 4.0, 1.0, 0.5), ServerSpec("B", 4.0, 1.0, 1.0)]
    return RouteGraph.build(servers, ModelSpec(2, 1.0, 1.0, name="tiny"), Placement((1, 1), (2, 2)))


def test_policy_routes_by_believed_wait_and_starts_in_fifo_order() -> None:
    p = WsRr(two_servers())
    assert p.on_arrival(0, 0.0) == [0] and p.route(0) == ((0, 2),) and p.route_time_s(0) == 2.0
    # at 0.5, A is believed free at 2.0: 1.5 s + 2 s > B's 3 s, so B
    assert p.on_arrival(1, 0.5) == [1] and p.route(1) == ((1, 2),)
    # at 0.9, A costs 1.1 + 2 < B's 2.6 + 3: A, waiting
    assert p.on_arrival(2, 0.9) == [] and p.route(2) == ((0, 2),) and p.queued_jobs() == [2]
    assert p.occupancy() == [2, 2] and p.is_waiting(2)
    assert p.on_departure(0, 2.0) == [2] and p.queue_length() == 0
    with pytest.raises(ValueError, match="not in service"):
        p.on_departure(0, 2.0)
    with pytest.raises(ValueError, match="already committed"):
        p.commit(2, 2.0)


def test_policy_cancel_frees_the_believed_slots() -> None:
    p = WsRr(two_servers())
    p.on_arrival(0, 0.0)
    p.on_arrival(1, 0.0)
    p.on_arrival(2, 0.0)  # waits for A (believed free at 2)
    assert p.route(2) == ((0, 2),) and p.belief[0].tolist() == [4.0, 4.0]
    assert p.cancel(2, 1.0) == [] and p.belief[0].tolist() == [1.0, 1.0]  # believed free from the cancel on
    with pytest.raises(ValueError, match="not waiting"):
        p.cancel(2, 1.0)
    p.on_arrival(3, 1.0)
    p.on_arrival(4, 1.0)
    assert p.withdraw_all(1.5) == [3, 4] and p.queue_length() == 0


def test_best_fit_takes_the_latest_slots_free_by_the_start() -> None:
    row = np.array([3.0, 1.0, 5.0, 1.0, 2.0, np.inf])
    out = np.empty(6, dtype=np.int64)
    best_fit_slots(row, 5, 3.0, 2, out)
    assert sorted(out[:2].tolist()) == [0, 4]  # 3.0 and 2.0, not 1.0, and never 5.0 (> start)
    best_fit_slots(row, 5, 3.0, 3, out)
    assert sorted(out[:3].tolist()) == [0, 3, 4]  # ties at 1.0: the higher index


def test_unroutable_placement_raises() -> None:
    servers = [ServerSpec("A", 2.0, 1.0, 0.5), ServerSpec("B", 4.0, 1.0, 0.5)]
    g = RouteGraph.build(servers, ModelSpec(2, 1.0, 1.0), Placement((1, 2), (2, 1)))  # A: 0 slots, B: block 2
    with pytest.raises(InfeasibleError, match="no route"):
        WsRr(g).on_arrival(0, 0.0)


# ---- who imports whom ---------------------------------------------------------------------------------------------


def _imports(package_dir: Path) -> set[str]:
    """Every module named in an import statement under ``package_dir``."""
    names: set[str] = set()
    for path in package_dir.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
    return names


def test_live_code_and_simulator_do_not_import_each_other() -> None:
    pkg = REPO / "petals_chain"
    for live in ("orchestrator", "server", "client", "dispatch", "compose"):
        bad = sorted(m for m in _imports(pkg / live) if m.startswith("petals_chain.sim"))
        assert not bad, f"petals_chain.{live} imports the simulator: {bad}"
    bad = sorted(m for m in _imports(pkg / "sim") if m.split(".")[:2] in (
        ["petals_chain", "orchestrator"], ["petals_chain", "server"], ["petals_chain", "client"]))
    assert not bad, f"the simulator imports live code: {bad}"
    code = ("import sys, asyncio; import petals_chain.orchestrator.leasing.ws_rr as w, "
            "petals_chain.orchestrator.engine.core, petals_chain.orchestrator.http.api; "
            "print(sorted(m for m in sys.modules if m.startswith('petals_chain.sim')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
