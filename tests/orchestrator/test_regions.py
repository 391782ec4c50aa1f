"""The region-aware orchestrator in process and over real HTTP: regions compose their own servers, requests are
routed to regions by the plan (TORTA), SkyLB-style or round robin, and bad origins/policies are refused."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer as LoopbackServer

from petals_chain.model import ModelSpec
from petals_chain.orchestrator.engine.config import OrchestratorConfig
from petals_chain.orchestrator.engine.core import Orchestrator
from petals_chain.orchestrator.regions.front import RegionalOrchestrator
from petals_chain.orchestrator.regions.api import build_regional_app
from petals_chain.orchestrator.state.registry import Registry
from tests.orchestrator.test_orchestrator import PAPER
from petals_chain.torta.regional import RegionalMacro, RegionError

GB = 1e9
MODEL = ModelSpec(num_blocks=4, block_bytes=1 * GB, cache_bytes=0.1 * GB, name="tiny")
NAMES = ["r0", "r1", "r2"]
LAT_S = np.array([[0.005, 0.060, 0.030], [0.060, 0.005, 0.040], [0.030, 0.040, 0.005]])


def region_orchestrator(servers: dict[str, float]) -> Orchestrator:
    """One region: its servers registered, composed by GBP-CR + GCA (the paper's Algorithm 1)."""
    registry = Registry(MODEL)
    for name, mem in servers.items():
        registry.register(name, mem, 0.1, 0.01, now_s=time.monotonic(), peer_id=f"peer-{name}")
    orch = Orchestrator(registry, OrchestratorConfig(heartbeat_timeout_s=None), composition_policy=PAPER)
    orch.recompose_now()
    return orch


def make_regional(policy: str = "torta") -> RegionalOrchestrator:
    """Three regions of one whole-model server each (r1's twice as large), 1 s slots."""
    regions = {"r0": region_orchestrator({"a0": 4.9 * GB}), "r1": region_orchestrator({"a1": 5.3 * GB}),
               "r2": region_orchestrator({"a2": 4.9 * GB})}
    return RegionalOrchestrator(regions, RegionalMacro(NAMES, LAT_S, slot_s=1.0), policy=policy)


def test_each_region_composes_only_its_own_servers() -> None:
    """Every region's chains run on its own servers alone."""
    reg = make_regional()
    for name, orch in reg.regions.items():
        servers = {s.server for c in orch.composed for s in c.spans}
        assert servers == {"a" + name[1]}, (name, servers)
    load = reg.load()
    assert (load.capacity_per_slot > 0).all() and (load.queue == 0).all()
    assert load.free[1] > load.free[0]  # the larger server holds more cache slots


async def _grab(reg: RegionalOrchestrator, origin: str, n: int) -> list[str]:
    """Route n requests of ``origin`` (each holds its lease) and return the regions they went to."""
    out = []
    for _ in range(n):
        region, _ = await reg.acquire(origin, timeout_s=0.01)
        out.append(region)
    return out


def test_torta_routes_each_origin_by_the_slot_plan() -> None:
    """A burst from r0 and a trickle from r1 in one slot: the next plan keeps r1 at home and spreads r0's burst
    so that every region gets its capacity share (rows sum to 1, columns meet ν); the requests of the next slot
    follow r0's row within one request per region."""
    async def run() -> None:
        reg = make_regional("torta")
        cap = reg.load().capacity_per_slot
        reg.macro.counts[:] = [3 * cap.sum(), 0.2 * cap.sum(), 0.0]
        plan = reg.new_slot()
        assert np.allclose(plan.sum(1), 1.0)
        assert plan[1, 1] > 0.99
        mu = np.array([3.0, 0.2, 0.0]) / 3.2
        assert np.allclose(mu @ plan, cap / cap.sum(), atol=1e-5)
        free = int(reg.load().free.sum())
        got = await _grab(reg, "r0", free)
        shares = np.array([got.count(n) for n in NAMES], float)
        assert np.abs(shares - plan[0] * free).max() <= 1.0 + 1e-9, (shares, plan[0] * free)
        routed = np.array(reg.macro_json()["routed"])
        assert routed[0].sum() == free and routed[1:].sum() == 0
    asyncio.run(run())


def test_queue_moves_a_regions_share_away() -> None:
    """ν = capacity minus queue: with equal demand, a region whose queue is long gets a smaller column."""
    macro = RegionalMacro(NAMES, LAT_S, slot_s=1.0)
    from petals_chain.torta.regional import RegionLoad

    cap = np.array([10.0, 10.0, 10.0])
    macro.counts[:] = [10.0, 10.0, 10.0]
    calm = macro.new_slot(RegionLoad(cap, np.zeros(3), np.full(3, 2.0), np.zeros(3))).copy()
    macro.counts[:] = [10.0, 10.0, 10.0]
    busy = macro.new_slot(RegionLoad(cap, np.array([8.0, 0.0, 0.0]), np.zeros(3), np.full(3, 2.0)))
    assert busy[:, 0].sum() < calm[:, 0].sum() - 0.3


def test_skylb_local_first_then_nearest_free_then_origin_queue() -> None:
    """SkyLB-style: a free local slot, else the nearest region with one, else the origin's own queue."""
    async def run() -> None:
        reg = make_regional("skylb")
        free = reg.load().free.astype(int)
        got = await _grab(reg, "r0", int(free[0]))
        assert set(got) == {"r0"}
        got = await _grab(reg, "r0", int(free[2]))
        assert set(got) == {"r2"}  # r2 (30 ms) before r1 (60 ms)
        got = await _grab(reg, "r0", int(free[1]))
        assert set(got) == {"r1"}
        with pytest.raises(TimeoutError):
            await reg.acquire("r0", timeout_s=0.01)
        assert reg.decisions[-1].region == "r0"  # nothing free anywhere: it waited in its origin's queue
    asyncio.run(run())


def test_round_robin_cycles_over_regions() -> None:
    """Round robin: r0, r1, r2, r0, ... whatever the origin."""
    async def run() -> None:
        reg = make_regional("rr")
        assert await _grab(reg, "r1", 4) == ["r0", "r1", "r2", "r0"]
    asyncio.run(run())


def test_bad_origin_policy_and_rtts_are_refused() -> None:
    """Unknown origins, policies and RTT maps raise RegionError naming the field."""
    reg = make_regional()
    with pytest.raises(RegionError, match="origin"):
        reg.origin_of("mars", None)
    with pytest.raises(RegionError, match="origin"):
        reg.origin_of(None, None)
    with pytest.raises(RegionError, match="rtt_s"):
        reg.origin_of(None, {"mars": 0.01})
    assert reg.origin_of(None, {"r0": 0.08, "r1": 0.02, "r2": 0.05}) == "r1"
    with pytest.raises(RegionError, match="policy"):
        reg.check_policy("random")


@contextlib.asynccontextmanager
async def serving(reg: RegionalOrchestrator) -> AsyncIterator[str]:
    """The real front app on a loopback port (no slot ticker: tests close slots themselves)."""
    server = LoopbackServer(build_regional_app(reg, run_slots=False, sweep_interval_s=0.05), host="127.0.0.1",
                            port=0)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def test_http_origin_in_path_or_body_rtt_inference_and_errors() -> None:
    """Over HTTP: /origins/O/lease and POST /lease {rtt_s} route and answer the region; release goes to the
    region; a server registering under /regions/r2 joins r2; bad origin, body and policy are 400s naming the field."""
    async def run() -> None:
        reg = make_regional("skylb")
        async with serving(reg) as url, aiohttp.ClientSession() as http:
            async with http.post(url + "/origins/r1/lease", json={"timeout_s": 1.0}) as r:
                lease = await r.json()
                assert r.status == 200 and lease["origin"] == "r1" and lease["region"] == "r1"
                assert lease["spans"][0]["server"] == "a1"
            async with http.get(url + "/origins/r1/swarm") as r:  # a client of any origin needs only the URL
                joined = await r.json()
                assert r.status == 200 and joined["model"]["num_blocks"] == reg.regions["r1"].registry.model.num_blocks
            async with http.post(url + "/lease", json={"rtt_s": {"r0": 0.05, "r2": 0.01}}) as r:
                other = await r.json()
                assert r.status == 200 and other["origin"] == "r2" == other["region"]
            async with http.post(url + f"/origins/r1/lease/{lease['lease_id']}/release") as r:
                assert r.status == 200 and (await r.json())["region"] == "r1"
            async with http.post(url + f"/lease/{lease['lease_id']}/release") as r:
                assert r.status == 404
            async with http.post(url + "/origins/mars/lease", json={}) as r:
                err = await r.json()
                assert r.status == 400 and err["fields"] == ["origin"]
            async with http.post(url + "/lease", json={"origin": "r0", "rtt": {}}) as r:
                assert r.status == 400 and "rtt" in (await r.json())["fields"]
            async with http.post(url + "/macro/policy", json={"policy": "random"}) as r:
                assert r.status == 400 and (await r.json())["fields"] == ["policy"]
            async with http.post(url + "/macro/policy", json={"policy": "rr"}) as r:
                assert r.status == 200 and reg.policy == "rr"
            body = {"name": "b2", "memory_bytes": 4.9 * GB, "tau_p_s": 0.1, "tau_c_s": 0.01, "max_batch_sessions": 16}
            async with http.post(url + "/regions/r2/servers/register", json=body) as r:
                assert r.status == 200
            async with http.get(url + "/servers") as r:
                where = {s["name"]: s["region"] for s in (await r.json())["servers"]}
                assert where == {"a0": "r0", "a1": "r1", "a2": "r2", "b2": "r2"}
            async with http.get(url + "/origins/r0/health") as r:
                h = await r.json()
                assert h["servers_registered"] == 4 and set(h["regions"]) == set(NAMES)
    asyncio.run(run())


def test_servers_are_placed_by_name_or_by_rtt_and_bad_placements_lose_nothing() -> None:
    """POST /servers/place: a named region answers its URL prefix, where the server then registers; RTTs to the
    anchors place a server in the nearest region (anchors from --anchors, shown by GET /regions); an unknown region,
    a malformed report, neither or both, and a server alive in another region are 400s naming the field, and
    neither the placements nor any registry change."""
    async def run() -> None:
        reg = make_regional()
        reg.anchors = {"r1": "http://10.9.9.9:1/health"}
        async with serving(reg) as url, aiohttp.ClientSession() as http:
            async with http.post(url + "/servers/place", json={"name": "n1", "region": "r1"}) as r:
                placed = await r.json()
                assert r.status == 200 and placed["region"] == "r1" and placed["path"] == "/regions/r1"
                assert placed["by"] == "name"
            body = {"name": "n1", "memory_bytes": 4.9 * GB, "tau_p_s": 0.1, "tau_c_s": 0.01, "max_batch_sessions": 16}
            async with http.post(url + placed["path"] + "/servers/register", json=body) as r:
                assert r.status == 200 and "n1" in reg.regions["r1"].registry.servers
            rtt = {"r0": 0.124, "r1": 0.086, "r2": 0.011}
            async with http.post(url + "/servers/place", json={"name": "m1", "rtt_s": rtt}) as r:
                placed = await r.json()
                assert r.status == 200 and placed["region"] == "r2" and placed["by"] == "rtt"
                assert placed["rtt_s"] == [0.124, 0.086, 0.011]
            async with http.get(url + "/regions") as r:
                view = await r.json()
                assert [x["name"] for x in view["regions"]] == NAMES
                assert view["regions"][1]["anchor"] == "http://10.9.9.9:1/health"
                assert view["regions"][1]["servers"] == ["a1", "n1"]
                assert set(view["placements"]) == {"n1", "m1"}
            before = ({k: dict(o.registry.servers) for k, o in reg.regions.items()}, dict(reg.placements))
            for bad, field in (({"name": "x", "region": "mars"}, "region"), ({"name": "x"}, "region"),
                               ({"name": "x", "region": "r0", "rtt_s": rtt}, "region"),
                               ({"name": "x", "rtt_s": {"r0": 0.1}}, "rtt_s"),
                               ({"name": "x", "rtt_s": {**rtt, "r3": 0.1}}, "rtt_s"),
                               ({"name": "x", "rtt_s": {**rtt, "r0": -1.0}}, "rtt_s"),
                               ({"name": "n1", "region": "r2"}, "region")):
                async with http.post(url + "/servers/place", json=bad) as r:
                    err = await r.json()
                    assert r.status == 400 and field in err["fields"][0], (bad, err)
            assert ({k: dict(o.registry.servers) for k, o in reg.regions.items()}, dict(reg.placements)) == before
    asyncio.run(run())
