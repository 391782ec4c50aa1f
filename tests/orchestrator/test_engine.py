"""The orchestrator as one engine: every step of a lease through ``Orchestrator``, one registry of live policies from
which every list of names is read, and the facts a server states on registration (its batching limit, its g(b), the
device it emulates) reaching the composition and the state store."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest

from petals_chain.compose.method_table import Routing
from petals_chain.model import ServerSpec, SpecError
from petals_chain.orchestrator.cli import parse_args as orchestrator_args
from petals_chain.orchestrator.engine.config import OrchestratorConfig
from petals_chain.orchestrator.engine.core import Orchestrator
from petals_chain.orchestrator.leasing.managers import dispatch_manager, lease_manager
from petals_chain.orchestrator.leasing.migration import MigratingLeaseManager
from petals_chain.orchestrator.leasing.policies import LEASE_POLICIES, ROLES
from petals_chain.orchestrator.leasing.ws_rr import WsRrLeaseManager
from petals_chain.orchestrator.regions.cli import parse_args as regions_args
from petals_chain.orchestrator.state.registry import Registry
from petals_chain.orchestrator.state.store import StateStore
from petals_chain.protocol.http_client import OrchestratorClient, OrchestratorError
from petals_chain.protocol.parsing import BadRequestError
from petals_chain.protocol.requests import RegisterBody
from tests.orchestrator.test_orchestrator import GB, MODEL, PAPER, make_orchestrator, run, serving

TINY = ["--model-blocks", "4", "--block-bytes", "1GB", "--cache-bytes", "0.1GB"]


# ---- every step of a lease through the engine ------------------------------------------------------------------


def test_the_engine_runs_a_lease_end_to_end_without_http() -> None:
    async def body() -> None:
        orch = make_orchestrator()
        lease = await orch.lease(timeout_s=1.0, client="direct")
        assert orch.leases.has(lease.lease_id) and lease.client == "direct"
        renewed, target = orch.renew(lease.lease_id, 20.0)
        assert renewed is lease and renewed.ttl_s == 20.0 and target is None  # migration none: no move offered
        ended, held = orch.release(lease.lease_id)
        assert ended is lease and held >= 0 and not orch.leases.has(lease.lease_id)
        with pytest.raises(BadRequestError, match="k_max"):  # no width rule: refused before anything is queued
            await orch.lease(timeout_s=1.0, k_max=4)
        assert orch.leases.queue_length() == 0 and not orch.leases.leases()
        with pytest.raises(BadRequestError, match="cannot move sessions"):
            Orchestrator(Registry(MODEL), lease_manager=WsRrLeaseManager).migrated("L1", None, None)

    run(body())


def test_http_handlers_answer_what_the_engine_returns() -> None:
    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            info = await oc.lease(timeout_s=1.0)
            rendered = orch.lease_json(orch.leases.get(info.lease_id))
            assert (rendered["lease_id"], rendered["chain_id"]) == (info.lease_id, info.chain_id)
            assert (await oc.release(info.lease_id))["released"] is True
            assert not orch.leases.has(info.lease_id)

    run(body())


# ---- one registry of live policies -----------------------------------------------------------------------------


def test_every_list_of_policy_names_is_the_registrys() -> None:
    assert set(ROLES) == {"routing", "dispatch", "migration"}
    orchestrated = [r.value for r in Routing if r is not Routing.PETALS]
    assert LEASE_POLICIES.names("routing") == tuple(orchestrated)
    assert OrchestratorConfig(migration="worst-fit").migration == "worst-fit"
    for name in LEASE_POLICIES.names("migration"):
        assert orchestrator_args([*TINY, "--migration", name]).migration == name
    for name in LEASE_POLICIES.names("dispatch"):
        assert regions_args(["--regions", "a,b", "--latency-ms", "1,2;2,1", "--micro", name, *TINY]).micro == name
    with pytest.raises(SystemExit):
        orchestrator_args([*TINY, "--migration", "sideways"])
    with pytest.raises(SpecError, match=r"field 'migration' must be one of none, jffc, mell, worst-fit, got 'x'"):
        LEASE_POLICIES.get("migration", "x")


def test_managers_follow_the_declared_capabilities() -> None:
    assert lease_manager("ws_rr") is WsRrLeaseManager
    jffc = lease_manager("jffc", "mell")()
    assert isinstance(jffc, MigratingLeaseManager) and jffc.packing and jffc.migration == "mell"
    assert LEASE_POLICIES.get("migration", "mell").capabilities.packs
    assert not LEASE_POLICIES.get("migration", "worst-fit").capabilities.moves_sessions
    with pytest.raises(SpecError, match="needs leases on fixed chains"):
        lease_manager("ws_rr", "jffc")
    greedy = dispatch_manager("greedy")()
    assert greedy.policy is LEASE_POLICIES.get("dispatch", "greedy").chains
    with pytest.raises(SpecError, match="field 'micro'"):
        dispatch_manager("nosuch")


def test_get_policies_lists_the_registry_and_what_runs() -> None:
    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            got = await oc._call("GET", "/policies")
            assert got["policies"] == LEASE_POLICIES.to_json()
            assert got["in_use"] == {"manager": "MigratingLeaseManager", "routes_over_placement": False,
                                     "moves_sessions": True, "migration": "none"}
            with pytest.raises(OrchestratorError) as err:
                await oc._call("POST", "/migrations", {"policy": "sideways"})
            assert err.value.status == 400 and "one of none, jffc, mell, worst-fit" in err.value.message

    run(body())


# ---- what a server states ---------------------------------------------------------------------------------------


def _fresh() -> Orchestrator:
    """An orchestrator with no server yet."""
    return Orchestrator(Registry(MODEL), OrchestratorConfig(heartbeat_timeout_s=None), composition_policy=PAPER)


def test_a_servers_batching_limit_and_table_reach_the_composition() -> None:
    async def body() -> None:
        orch = _fresh()
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            await oc.register("pool", memory_bytes=8 * GB, tau_p_s=0.1, tau_c_s=0.01, max_batch_sessions=1)
            await oc.register("gpu", memory_bytes=8 * GB, tau_p_s=0.1, tau_c_s=0.01, max_batch_sessions=4,
                              batch_slowdown=[1.0, 1.1, 1.2, 1.3], device="a100-2g.20gb")
            await oc.register("plain", memory_bytes=8 * GB, tau_p_s=0.1, tau_c_s=0.01, max_batch_sessions=2)
            servers = {s["name"]: s for s in (await oc._call("GET", "/servers"))["servers"]}
        specs = {s.name: s for s in orch.registry.snapshot()[1]}
        assert specs["pool"].step_factor(3) == 3.0  # PETALS' pool: one session at a time
        assert specs["gpu"].step_factor(2) == pytest.approx(1.1) and specs["gpu"].step_factor(8) == pytest.approx(2.6)
        assert specs["plain"].step_factor(2) == 1.0 and specs["plain"].step_factor(4) == 2.0  # waits beyond its 2
        assert servers["gpu"]["max_batch_sessions"] == 4 and servers["gpu"]["device"] == "a100-2g.20gb"
        assert servers["gpu"]["batch_slowdown"] == [1.0, 1.1, 1.2, 1.3] and servers["pool"]["device"] is None

    run(body())


@pytest.mark.parametrize("extra, words", [
    ({}, "missing field 'max_batch_sessions': the server runs an older petals_chain"),
    ({"max_batch_sessions": 2, "batch_slowdown": [1.0, 1.5, 1.7]}, "(2 numbers), got 3"),
    ({"max_batch_sessions": 3, "batch_slowdown": [1.0, 1.5, 1.2]}, "must lie in"),
    ({"max_batch_sessions": 2, "batch_slowdown": [1.0, 0.9]}, "greater than or equal to 1"),
    ({"max_batch_sessions": 0}, "max_batch_sessions"),
    ({"max_batch_sessions": 1, "device": "tpu-v9"}, "device"),
])
def test_a_registration_without_current_facts_is_a_clear_400(extra: dict, words: str) -> None:
    async def body() -> None:
        orch = _fresh()
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            with pytest.raises(OrchestratorError) as err:
                await oc._call("POST", "/servers/register", {"name": "old", "memory_bytes": 8 * GB, "tau_p_s": 0.1,
                                                              "tau_c_s": 0.01, **extra})
            assert err.value.status == 400 and words in err.value.message, err.value.message
            assert "\n" not in err.value.message and not orch.registry.servers  # nothing accepted

    run(body())


def test_a_pinned_server_keeps_the_cluster_files_table() -> None:
    async def body() -> None:
        pinned = ServerSpec("p", 8 * GB, 0.01, 0.1, batch_slowdown=(1.0, 1.4))
        orch = Orchestrator(Registry(MODEL), OrchestratorConfig(heartbeat_timeout_s=None, pinned={"p": pinned}),
                            composition_policy=PAPER)
        await orch.register(RegisterBody(name="p", memory_bytes=8 * GB, tau_p_s=0.5, tau_c_s=0.01,
                                         max_batch_sessions=1))
        rec = orch.registry.servers["p"]
        assert rec.batch_slowdown == (1.0, 1.4) and rec.tau_p_s == 0.1 and rec.max_batch_sessions == 1

    run(body())


def test_the_store_keeps_what_servers_stated_and_upgrades_an_old_file(tmp_path: Path) -> None:
    from petals_chain.orchestrator.state.persist import Persistence

    async def body() -> None:
        store = StateStore(tmp_path / "state.sqlite3")
        first = Orchestrator(Registry(MODEL), OrchestratorConfig(heartbeat_timeout_s=None), composition_policy=PAPER,
                             state=Persistence(store))
        first.state.restore(attach_grace_s=1.0)
        await first.register(RegisterBody(name="g", memory_bytes=8 * GB, tau_p_s=0.1, tau_c_s=0.01,
                                          max_batch_sessions=2, batch_slowdown=(1.0, 1.2), device="h100"))
        await first.state.durable()
        first.state.detach()
        store.close()
        again = StateStore(tmp_path / "state.sqlite3")
        second = Orchestrator(Registry(MODEL), OrchestratorConfig(heartbeat_timeout_s=None), composition_policy=PAPER,
                              state=Persistence(again))
        second.state.restore(attach_grace_s=1.0)
        rec = second.registry.servers["g"]
        assert (rec.batch_slowdown, rec.max_batch_sessions, rec.device) == ((1.0, 1.2), 2, "h100")
        second.state.detach()
        again.close()

    run(body())
    old = tmp_path / "old.sqlite3"
    StateStore(old).close()
    db = sqlite3.connect(old)  # a version-1 file: no facts column
    db.execute("ALTER TABLE servers DROP COLUMN facts")
    db.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    db.commit()
    db.close()
    upgraded = StateStore(old)
    assert upgraded.load().meta["schema"] == "2"
    upgraded.close()


def test_a_release_through_the_engine_grants_the_next_waiter_at_once() -> None:
    """A lease that waits is granted by the release that frees its slot, not by a later poll."""
    async def body() -> None:
        orch = make_orchestrator()
        held = [await orch.lease(timeout_s=1.0) for _ in range(4)]  # every slot of the hand composition
        waiter = asyncio.create_task(orch.lease(timeout_s=5.0))
        await asyncio.sleep(0)
        assert orch.leases.queue_length() == 1
        t0 = time.monotonic()
        orch.release(held[0].lease_id)
        got = await waiter
        assert got.lease_id not in {h.lease_id for h in held} and time.monotonic() - t0 < 1.0

    run(body())
