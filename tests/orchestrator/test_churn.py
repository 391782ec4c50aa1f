"""Churn at the orchestrator: a leave or join repaired into the installed composition at once (leases on untouched
chains kept), the full recomposition after it, and that recomposition in a worker process."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from petals_chain.bench.cluster import BLOOM, bench_registry, bench_servers
from petals_chain.compose.method_table import proposed_composition
from petals_chain.compose.repair import worth_replacing
from petals_chain.model import SpecError
from petals_chain.orchestrator.engine.compose_runner import ComposeRunner
from petals_chain.orchestrator.engine.composition import CompositionPolicy
from petals_chain.orchestrator.engine.config import OrchestratorConfig
from petals_chain.orchestrator.engine.core import Orchestrator

J = 60
POLICY = CompositionPolicy(proposed_composition, arrival_rate=0.01 * J)


def _orchestrator(**config: object) -> tuple[Orchestrator, list]:
    servers = bench_servers(J, 0.2, np.random.default_rng(7))
    registry = bench_registry(servers, time.monotonic())
    orch = Orchestrator(registry, OrchestratorConfig(heartbeat_timeout_s=None, **config), composition_policy=POLICY)
    orch.recompose_now()
    return orch, servers


def _servers_offered(orch: Orchestrator) -> set[str]:
    return {span.server for c in orch.leases.chains for span in c.spans}


def test_a_dead_server_is_repaired_out_at_once_and_the_other_leases_keep_their_chains() -> None:
    async def run() -> None:
        orch, _ = _orchestrator()
        leases = [await orch.leases.acquire(timeout_s=1.0) for _ in range(6)]
        victim = leases[0].chain.spans[0].server
        kept = [lease for lease in leases if victim not in {s.server for s in lease.chain.spans}]
        assert kept and victim in _servers_offered(orch)
        before = orch.registry.version
        orch.registry.mark_dead(victim, "test")
        assert orch.repair() and orch.repairs == 1 and orch.registry.version == before + 1
        assert victim not in _servers_offered(orch)
        assert victim not in {s.name for s in orch.registry.composition.servers}
        assert all(lease.chain_index is not None for lease in kept)  # untouched chains carried their leases
        assert orch.last_repair_s < 1.0
        assert not orch.repair()  # nothing left to repair
        repaired = orch.registry.composition
        _, specs = orch.registry.snapshot()
        full, _ = POLICY.try_compose(specs, BLOOM)
        await orch.recompose()  # the full recomposition follows; it replaces the repair only if it gains enough
        replaced = worth_replacing(repaired, full, POLICY.arrival_rate)
        assert (orch.registry.composition is not repaired) == replaced and orch.repairs_kept == (not replaced)
        assert victim not in {s.name for s in orch.registry.composition.servers}

    asyncio.run(run())


def test_a_newcomer_is_repaired_in_and_repair_can_be_switched_off() -> None:
    async def run() -> None:
        orch, servers = _orchestrator()
        proto = servers[0]
        orch.registry.register("newcomer", proto.memory_bytes, proto.tau_p_s, proto.tau_c_s,
                               now_s=time.monotonic(), peer_id="peer-new", address="10.0.0.2")
        assert orch.repair()
        comp = orch.registry.composition
        assert comp.meta["repair"] == "join" and comp.servers[-1].name == "newcomer"
        assert orch.registry.servers["newcomer"].assignment.end > orch.registry.servers["newcomer"].assignment.start

        off, _ = _orchestrator(repair=False)
        comp = off.registry.composition
        off.registry.mark_dead(comp.servers[comp.chains[0].servers[0]].name, "test")
        assert not off.repair() and off.repairs == 0

    asyncio.run(run())


def test_the_full_recomposition_in_a_worker_process_equals_the_thread_s() -> None:
    async def run() -> None:
        orch, _ = _orchestrator()
        _, specs = orch.registry.snapshot()
        runner = ComposeRunner("process")
        try:
            far, err = await runner.compose(POLICY, specs, BLOOM)
        finally:
            runner.close()
        near, err2 = await ComposeRunner("thread").compose(POLICY, specs, BLOOM)
        assert err is None and err2 is None and runner.runs == {"thread": 0, "process": 1}
        assert far.chains == near.chains and far.placement == near.placement and far.c == near.c

    asyncio.run(run())


def test_auto_picks_a_process_for_large_swarms_and_a_thread_for_a_lambda() -> None:
    runner = ComposeRunner("auto", min_servers=100)
    assert runner.where(99) == "thread" and runner.where(100) == "process"

    async def run() -> None:
        policy = CompositionPolicy(lambda *a, **k: proposed_composition(*a, **k), arrival_rate=0.01 * J)
        _, specs = _orchestrator()[0].registry.snapshot()
        runner = ComposeRunner("process")
        comp, err = await runner.compose(policy, specs, BLOOM)
        assert err is None and comp is not None
        assert runner.runs == {"thread": 1, "process": 0} and runner.where(J) == "thread"

    asyncio.run(run())


def test_bad_settings_are_refused_by_name() -> None:
    with pytest.raises(SpecError, match="'compose_in'"):
        OrchestratorConfig(compose_in="gpu")
    with pytest.raises(SpecError, match="'repair'"):
        OrchestratorConfig(repair="yes")
    with pytest.raises(ValueError, match="compose_in"):
        ComposeRunner("gpu")


def _slow_proposed(*args, **kwargs):
    """The default composer, one second slower: a full recomposition a test can overtake."""
    time.sleep(1.0)
    return proposed_composition(*args, **kwargs)


def test_a_failure_report_is_answered_on_the_repair_without_waiting_for_the_full_recomposition() -> None:
    async def run() -> None:
        orch, _ = _orchestrator(compose_in="thread")
        orch.composition_policy = CompositionPolicy(_slow_proposed, arrival_rate=0.01 * J)
        lease = await orch.leases.acquire(timeout_s=1.0)
        server = lease.chain.spans[0].server
        t0 = time.perf_counter()
        new = await orch.report_failure(lease.lease_id, server, timeout_s=5.0)
        took = time.perf_counter() - t0
        assert server not in {s.server for s in new.chain.spans} and orch.repairs == 1
        assert took < 0.5 and orch._background  # the full recomposition (1 s at least) still runs
        while orch._background:
            await asyncio.sleep(0.05)
        assert server not in {s.name for s in orch.registry.composition.servers}

    asyncio.run(run())


def test_bench_swarm_small_runs_through_churn_and_a_burst_without_double_booking(capsys) -> None:
    from petals_chain.bench.swarm import run

    code = run(["--servers", "80", "--clients", "500", "--horizon-s", "90", "--burst", "6", "--burst-at-s", "30",
                "--load-s", "20", "--mean-uptime-s", "300"])
    out = capsys.readouterr().out
    assert code == 0 and "double-booked: 0 " in out
    assert "failures reported" in out and "capacity nu on live servers" in out
    assert run(["--burst-at-s", "700"]) == 2 and "out of range" in capsys.readouterr().out
