"""GET /dashboard and /dashboard.json over real HTTP against an in-process orchestrator: what the live page draws
equals what /servers, /chains and /queue say, the bounds are Theorem 3.7's, finished leases land in a bounded ring."""

from __future__ import annotations

import asyncio
import json
import math
import time

import aiohttp
import pytest

from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.orchestrator.engine.chains import ChainInfo
from petals_chain.orchestrator.http.dashboard import bounds_json
from petals_chain.orchestrator.leasing.leases import LeaseManager
from petals_chain.orchestrator.leasing.recent import RecentLeases
from petals_chain.protocol.hop import Hop
from petals_chain.protocol.http_client import OrchestratorClient
from tests.orchestrator.test_orchestrator import make_orchestrator, run, serving, wait_until


async def _get(url: str, path: str, token: str | None = None) -> tuple[int, str, dict[str, str]]:
    """GET a path: (status, body text, headers)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http, http.get(url + path, headers=headers) as resp:
        return resp.status, await resp.text(), dict(resp.headers)


def test_dashboard_json_matches_servers_chains_queue_and_leases() -> None:
    """Three leases held, one waiting, one released: servers, chains, occupancy, queue and the recent ring agree with
    the other routes, and the JSON is strict (no NaN/Infinity)."""

    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            held = [await oc.lease(timeout_s=5, client=f"c{i}") for i in range(4)]
            waiter = asyncio.create_task(oc.lease(timeout_s=10, client="w<script>"))

            async def queued() -> bool:
                return (await oc.queue())["length"] == 1

            await wait_until(queued)
            await oc.heartbeat("d", serving=(0, 2))
            status, text, _ = await _get(url, "/dashboard.json")
            assert status == 200
            d = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c}"))
            servers = (await oc.servers())["servers"]
            chains = (await oc.chains())["chains"]

            assert [s["name"] for s in d["servers"]] == [s["name"] for s in servers]
            for mine, theirs in zip(d["servers"], servers):
                a = theirs["assignment"]
                assert mine["assignment"] == {"start": a["start"], "end": a["end"]}
            states = {s["name"]: s["state"] for s in d["servers"]}
            assert states == {"a": "loading", "b": "loading", "d": "serving", "e": "loading"}
            keys = ("chain_id", "spans", "capacity", "busy")
            shown = [[c[k] for k in keys] for c in d["chains"] if c["offered"]]
            offered = [[c[k] for k in keys] for c in chains]
            assert shown == offered
            busy = [c["busy"] for c in d["chains"]]
            assert busy == [2, 1, 1]
            assert d["totals"] == {"capacity": 4, "busy": 4, "free": 0, "active_leases": 4, "orphaned_leases": 0}
            assert d["queue"]["length"] == 1 and d["queue"]["head"][0]["client"] == "w<script>"
            slots = {s["name"]: (s["cache_slots_in_use"], s["cache_slots"]) for s in d["servers"]}
            assert slots["a"][0] == 2 * 4 and slots["d"][0] == 2 and slots["e"][0] == 2  # blocks of held leases
            assert d["recent"] == [] and d["recent_mean"]["count"] == 0

            await oc.release(held[2].lease_id)  # chain b frees; the waiter takes it
            got = await asyncio.wait_for(waiter, 5)
            d = json.loads((await _get(url, "/dashboard.json"))[1])
            assert [r["lease_id"] for r in d["recent"]] == [held[2].lease_id]
            rec = d["recent"][0]
            assert (rec["client"], rec["outcome"], rec["servers"]) == ("c2", "released", ["b"])
            assert rec["held_s"] > 0 and math.isclose(rec["response_s"], rec["waited_s"] + rec["held_s"])
            assert d["queue"]["length"] == 0 and d["counters"]["released"] == 1
            for x in (*held[:2], held[3], got):
                await oc.release(x.lease_id)
            d = json.loads((await _get(url, "/dashboard.json"))[1])
            assert len(d["recent"]) == 5 and d["recent"][0]["lease_id"] == got.lease_id  # newest first
            assert d["totals"]["busy"] == 0

    run(body())


def test_dashboard_bounds_are_theorem37_of_the_composed_and_offered_chains() -> None:
    """The composed bounds are theorem37_bounds of all composed chains at the registry's λ; the offered ones those of
    the chains offered now (none while every server loads, with offer_when_serving)."""

    async def body() -> None:
        orch = make_orchestrator(offer_when_serving=True)
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            d = json.loads((await _get(url, "/dashboard.json"))[1])
            want = theorem37_bounds([1.0, 0.5, 1 / 3], [2, 1, 1], 0.5)
            got = d["bounds"]["composed"]
            assert got["stable"] and math.isclose(got["lower_s"], want.lower_s)
            assert math.isclose(got["upper_s"], want.upper_s) and got["lower_s"] < got["upper_s"]
            assert d["bounds"]["offered"] == {"chains": 0, "total_rate_per_s": 0, "lower_s": None, "upper_s": None,
                                              "stable": False, "why": "no chains"}
            await oc.heartbeat("b", serving=(0, 4))  # b alone (μ = 0.5/s, c = 1) cannot carry λ = 0.5/s
            d = json.loads((await _get(url, "/dashboard.json"))[1])
            assert [c["offered"] for c in d["chains"]] == [False, True, False]
            assert d["bounds"]["offered"]["lower_s"] is None and "no steady state" in d["bounds"]["offered"]["why"]
            await oc.heartbeat("a", serving=(0, 4))
            d = json.loads((await _get(url, "/dashboard.json"))[1])
            a_and_b = theorem37_bounds([1.0, 0.5], [2, 1], 0.5)
            assert d["bounds"]["offered"]["chains"] == 2
            assert math.isclose(d["bounds"]["offered"]["lower_s"], a_and_b.lower_s)
            assert math.isclose(d["bounds"]["offered"]["upper_s"], a_and_b.upper_s)

    run(body())


def test_bounds_json_unstable_is_null_with_the_reason() -> None:
    """λ at or above the chains' total service rate: no bound, null (strict JSON) and why."""
    chain = ChainInfo((Hop("a", 0, 4),), capacity=1, service_time_s=2.0)
    out = bounds_json([chain], 0.5)
    assert out["lower_s"] is None and out["upper_s"] is None and not out["stable"]
    assert "no steady state" in out["why"]
    assert bounds_json([chain], 0.4)["stable"]
    json.dumps(out, allow_nan=False)


def test_page_is_open_its_data_needs_the_token() -> None:
    """With a token, /dashboard (HTML, no data, nothing loaded from elsewhere) answers without it and
    /dashboard.json only with it."""

    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch, token="s3cret") as url:
            status, html, headers = await _get(url, "/dashboard")
            assert status == 200 and headers["Content-Type"].startswith("text/html")
            assert "dashboard.json" in html and "s3cret" not in html
            assert "http://" not in html and "https://" not in html  # no CDN: works offline
            assert "connect-src 'self'" in headers["Content-Security-Policy"]
            assert (await _get(url, "/dashboard.json"))[0] == 401
            assert (await _get(url, "/dashboard.json", token="wrong"))[0] == 401
            assert (await _get(url, "/dashboard.json", token="s3cret"))[0] == 200

    run(body())


def test_expired_leases_enter_the_ring_and_the_ring_is_bounded() -> None:
    """A lease nobody renews is recorded as expired; the ring keeps only the newest maxlen leases."""

    async def body() -> None:
        now = [0.0]
        mgr = LeaseManager(clock=lambda: now[0])
        mgr.recent = RecentLeases(maxlen=3)
        mgr.set_chains([ChainInfo((Hop("a", 0, 4),), capacity=2, service_time_s=1.0, chain_id="v1.0")], 1)
        first = await mgr.acquire(timeout_s=1, ttl_s=5, client="x")
        now[0] = 6.0
        assert mgr.expire_due() == [first]
        (rec,) = mgr.recent.newest_first()
        assert (rec.outcome, rec.held_s, rec.client, rec.chain_id) == ("expired", 6.0, "x", "v1.0")
        ids = []
        for _ in range(4):
            lease = await mgr.acquire(timeout_s=1)
            now[0] += 1.0
            mgr.release(lease.lease_id, failed=len(ids) == 3)
            ids.append(lease.lease_id)
        assert [r.lease_id for r in mgr.recent.newest_first()] == ids[::-1][:3]
        assert mgr.recent.newest_first()[0].outcome == "failed"

    run(body())


@pytest.mark.parametrize("maxlen", [0, -1, 2.5, True, None])
def test_recent_leases_refuses_a_bad_size(maxlen: object) -> None:
    """The ring's size must be an integer >= 1; the error names the field."""
    with pytest.raises(ValueError, match="maxlen"):
        RecentLeases(maxlen)  # type: ignore[arg-type]


def test_recent_leases_refuses_an_unknown_outcome() -> None:
    """Only released, failed and expired are outcomes."""
    ring = RecentLeases()
    chain = ChainInfo((Hop("a", 0, 4),), capacity=1, service_time_s=1.0)
    from petals_chain.orchestrator.leasing.leases import Lease

    lease = Lease("L0", 0, chain, 0, 0, 1, time.monotonic(), 0.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="outcome"):
        ring.add(lease, time.monotonic(), "vanished")
    assert len(ring) == 0


def test_dashboard_under_ws_rr_routing_lists_what_chains_lists() -> None:
    """With routes per request (WS-RR) the chains table is /chains' one row per server with its slots in use, no
    fixed chain is offered, and the offered bounds say why there are none."""
    from petals_chain.orchestrator.leasing.ws_rr import WsRrLeaseManager
    from tests.orchestrator.test_orchestrator import BASE_CHAINS, hand_composition

    async def body() -> None:
        orch = make_orchestrator(lease_manager=WsRrLeaseManager)
        orch.install(hand_composition(orch.registry, BASE_CHAINS))
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            for _ in range(3):
                await oc.lease(timeout_s=5)
            d = json.loads((await _get(url, "/dashboard.json"))[1])
            chains = (await oc.chains())["chains"]
        assert d["routing"] == "ws-rr"
        rows = [[c["chain_id"], c["spans"], c["capacity"], c["busy"], c["service_time_s"]] for c in d["chains"]]
        want = [[c["chain_id"], c["spans"], c["capacity"], c["busy"], None] for c in chains]
        assert rows == want
        assert sum(c["busy"] for c in d["chains"]) == 3 * 4  # three routes over all four blocks
        assert d["bounds"]["offered"]["lower_s"] is None and "WS-RR" in d["bounds"]["offered"]["why"]
        assert d["bounds"]["composed"]["stable"]

    run(body())


def test_a_dead_server_keeps_the_span_it_had() -> None:
    """A server that fails is shown dead, with no assignment and the span it held (its lost blocks), and the reason."""

    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch) as url:
            await orch.server_failed("d", "test: process killed")
            d = json.loads((await _get(url, "/dashboard.json"))[1])
        row = next(s for s in d["servers"] if s["name"] == "d")
        assert (row["state"], row["alive"], row["assignment"]) == ("dead", False, None)
        assert row["previous"] == {"start": 0, "end": 2} and "process killed" in row["dead_reason"]
        assert all("d" not in [h["server"] for h in c["spans"]] for c in d["chains"])

    run(body())
