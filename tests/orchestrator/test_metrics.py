"""GET /metrics over real HTTP, parsed with prometheus_client's own parser: names, types and values against the
orchestrator's state; chain series that do not multiply with recompositions; one registry per orchestrator."""

from __future__ import annotations

import asyncio
import math

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from petals_chain.protocol.http_client import OrchestratorClient
from tests.orchestrator.test_orchestrator import (
    BASE_CHAINS,
    MODEL,
    SERVERS,
    hand_composition,
    make_orchestrator,
    run,
    serving,
    wait_until,
)

P = "petals_chain_"
Families = dict[str, tuple[str, list[Sample]]]  # family name -> (type, samples)


async def scrape(url: str, accept: str | None = None) -> tuple[Families, str]:
    """GET /metrics: {family name: (type, samples)} from prometheus_client's parser, and the Content-Type."""
    headers = {"Accept": accept} if accept else {}
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics", headers=headers) as resp:
        assert resp.status == 200
        text, content_type = await resp.text(), resp.headers["Content-Type"]
    return {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text)}, content_type


def value(families: Families, family: str, sample: str | None = None, **labels: str) -> float:
    """The one sample of ``family`` named ``sample`` (default: the family name) with exactly these labels."""
    _, samples = families[family]
    name = sample or family
    found = [s.value for s in samples if s.name == name and s.labels == labels]
    assert len(found) == 1, (family, name, labels, samples)
    return found[0]


def by_label(families: Families, family: str, label: str) -> dict[str, float]:
    """{label value: sample value} of a family with one label."""
    return {s.labels[label]: s.value for s in families[family][1]}


def test_metrics_match_the_orchestrator_state() -> None:
    """Four leases (two on chain a, one on b, one on d→e), one waiting, d serving its span, one bad request: every
    family has the Prometheus type its name promises and the value the orchestrator holds."""

    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            held = [await oc.lease(timeout_s=5) for _ in range(4)]
            waiter = asyncio.create_task(oc.lease(timeout_s=10, client="w"))
            await wait_until(lambda: _queued(oc))
            await oc.heartbeat("d", serving=(0, 2))
            async with aiohttp.ClientSession() as http, http.post(url + "/lease", json={"timout_s": 1}) as resp:
                assert resp.status == 400
            fam, content_type = await scrape(url)

            assert content_type.startswith("text/plain; version=0.0.4")
            types = {name: t for name, (t, _) in fam.items()}
            for name in ("queue_length", "active_leases", "orphaned_leases", "capacity", "capacity_free", "chains",
                         "chains_composed", "composition_version", "servers_registered", "servers_alive",
                         "server_blocks_assigned", "server_blocks_served", "server_cache_slots",
                         "server_cache_slots_in_use", "server_memory_bytes", "server_block_time_seconds",
                         "server_rtt_seconds", "server_state", "chain_capacity", "chain_occupancy",
                         "chain_service_time_seconds", "chain_offered", "orchestrator_info"):
                assert types[P + name] == "gauge", name  # the 0.0.4 text format has no stateset or info type
            for name in ("lease_requests", "leases_granted", "leases_released", "leases_expired", "leases_failed",
                         "leases_abandoned", "lease_waits_cancelled", "lease_waits_timed_out", "recompositions",
                         "http_errors"):
                assert types[P + name] == "counter", name
                assert all(s.name == P + name + "_total" for s in fam[P + name][1]), name
            assert types[P + "wait_seconds"] == types[P + "service_seconds"] == "histogram"
            gauges = [n for n, t in types.items() if n.startswith(P) and t == "gauge"]
            assert not [n for n in gauges if n.endswith("_total")]
            assert "process_resident_memory_bytes" in fam  # the process collector rides along

            snap = orch.leases.snapshot()
            assert value(fam, P + "queue_length") == orch.leases.queue_length() == 1
            assert value(fam, P + "active_leases") == snap.active == 4
            assert value(fam, P + "capacity") == sum(snap.capacities) == 4
            assert value(fam, P + "capacity_free") == orch.leases.free_capacity() == 0
            assert value(fam, P + "chains") == value(fam, P + "chains_composed") == 3
            assert value(fam, P + "composition_version") == orch.registry.version
            assert value(fam, P + "servers_alive") == value(fam, P + "servers_registered") == len(SERVERS)
            c = orch.leases.counters
            assert value(fam, P + "lease_requests", P + "lease_requests_total") == c.requested == 5
            assert value(fam, P + "leases_granted", P + "leases_granted_total") == c.granted == 4
            assert value(fam, P + "recompositions", P + "recompositions_total") == orch.recompositions == 1
            assert value(fam, P + "http_errors", P + "http_errors_total", status="400") == orch.http_errors[400] == 1
            assert value(fam, P + "wait_seconds", P + "wait_seconds_count") == orch.leases.wait_hist.count == 4
            assert value(fam, P + "wait_seconds", P + "wait_seconds_bucket", le="+Inf") == 4
            assert math.isclose(value(fam, P + "wait_seconds", P + "wait_seconds_sum"), orch.leases.wait_hist.sum_s)

            info = [s for s in fam[P + "orchestrator_info"][1]]
            assert len(info) == 1 and info[0].value == 1
            assert info[0].labels["composition_version"] == str(orch.registry.version)
            assert info[0].labels["c"] == "1" and info[0].labels["model"] == MODEL.name and info[0].labels["version"]

            assert by_label(fam, P + "chain_capacity", "chain") == {"0": 2, "1": 1, "2": 1}
            assert by_label(fam, P + "chain_occupancy", "chain") == dict(zip("012", snap.occupancy)) == {
                "0": 2, "1": 1, "2": 1}
            assert by_label(fam, P + "chain_service_time_seconds", "chain") == {"0": 1.0, "1": 2.0, "2": 3.0}
            assert by_label(fam, P + "chain_offered", "chain") == {"0": 1, "1": 1, "2": 1}

            blocks = {"a": 4, "b": 4, "d": 2, "e": 2}
            assert by_label(fam, P + "server_blocks_assigned", "server") == blocks
            assert by_label(fam, P + "server_blocks_served", "server") == {"a": 0, "b": 0, "d": 2, "e": 0}
            slots = {n: math.floor((SERVERS[n] - MODEL.block_bytes * m) / MODEL.cache_bytes + 1e-9)
                     for n, m in blocks.items()}  # M~_j: the memory its blocks leave, in cache slots
            assert by_label(fam, P + "server_cache_slots", "server") == slots
            assert by_label(fam, P + "server_cache_slots_in_use", "server") == {"a": 8, "b": 4, "d": 2, "e": 2}
            assert by_label(fam, P + "server_memory_bytes", "server") == SERVERS
            assert by_label(fam, P + "server_block_time_seconds", "server") == dict.fromkeys(SERVERS, 0.1)
            states = {(s.labels["server"], s.labels[P + "server_state"]): s.value for s in fam[P + "server_state"][1]}
            assert len(states) == 5 * len(SERVERS)
            assert [k for k, v in states.items() if v == 1] == [("a", "loading"), ("b", "loading"),
                                                                ("d", "serving"), ("e", "loading")]

            await oc.release(held[0].lease_id)  # the waiter takes the freed slot of chain a
            await asyncio.wait_for(waiter, 5)
            fam, _ = await scrape(url)
            assert value(fam, P + "queue_length") == 0
            assert value(fam, P + "leases_released", P + "leases_released_total") == 1
            assert value(fam, P + "service_seconds", P + "service_seconds_count") == 1

            fam, content_type = await scrape(url, accept="application/openmetrics-text; version=1.0.0")
            assert content_type.startswith("application/openmetrics-text")

    run(body())


async def _queued(oc: OrchestratorClient) -> bool:
    """Whether one request waits in the central queue."""
    return (await oc.queue())["length"] == 1


def test_recompositions_do_not_grow_the_chain_series_and_dead_servers_show() -> None:
    """Ten recompositions (alternating chain sets, a dead server) leave one series per composed chain, labelled by
    its position; the version moves on in the info metric and its gauge only."""

    async def body() -> None:
        orch = make_orchestrator()
        other = [(("d", "e"), (2, 2), 1, 3.0), (("b",), (4,), 1, 2.0), (("a",), (4,), 2, 1.0)]
        async with serving(orch) as url:
            first, _ = await scrape(url)
            before = {name: len(samples) for name, (_, samples) in first.items() if name.startswith(P + "chain_")}
            for i in range(10):
                orch.install(hand_composition(orch.registry, other if i % 2 == 0 else BASE_CHAINS))
            fam, _ = await scrape(url)
            after = {name: len(samples) for name, (_, samples) in fam.items() if name.startswith(P + "chain_")}
            assert after == before == dict.fromkeys(
                (P + "chain_capacity", P + "chain_occupancy", P + "chain_service_time_seconds", P + "chain_offered"),
                3)
            assert by_label(fam, P + "chain_capacity", "chain") == {"0": 2, "1": 1, "2": 1}  # BASE_CHAINS again
            assert value(fam, P + "composition_version") == 11
            assert [s.labels["composition_version"] for s in fam[P + "orchestrator_info"][1]] == ["11"]

            orch.registry.mark_dead("e", "test")
            orch.install(hand_composition(orch.registry, BASE_CHAINS[:2]))  # d→e is gone: two chains, two series
            fam, _ = await scrape(url)
            assert by_label(fam, P + "chain_capacity", "chain") == {"0": 2, "1": 1}
            states = {s.labels["server"]: s.labels[P + "server_state"]
                      for s in fam[P + "server_state"][1] if s.value == 1}
            assert states["e"] == "dead" and value(fam, P + "servers_alive") == 3

    run(body())


def test_each_orchestrator_has_its_own_registry() -> None:
    """Two orchestrators in one process: a lease on one is counted by that one only."""

    async def body() -> None:
        busy, idle = make_orchestrator(), make_orchestrator()
        assert busy.metrics is not idle.metrics
        async with serving(busy) as url_busy, serving(idle) as url_idle, OrchestratorClient(url_busy) as oc:
            await oc.lease(timeout_s=5)
            fam_busy, _ = await scrape(url_busy)
            fam_idle, _ = await scrape(url_idle)
        assert value(fam_busy, P + "leases_granted", P + "leases_granted_total") == 1
        assert value(fam_idle, P + "leases_granted", P + "leases_granted_total") == 0

    run(body())


def test_metrics_under_ws_rr_routing() -> None:
    """With the WS-RR lease manager (routes per request, no fixed chains) no composed chain is offered, and the
    cache slots in use per server are the blocks of the routes leased."""
    from petals_chain.orchestrator.leasing.ws_rr import WsRrLeaseManager

    async def body() -> None:
        orch = make_orchestrator(lease_manager=WsRrLeaseManager)
        orch.install(hand_composition(orch.registry, BASE_CHAINS))
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            leases = [await oc.lease(timeout_s=5) for _ in range(3)]
            fam, _ = await scrape(url)
        held: dict[str, int] = dict.fromkeys(SERVERS, 0)
        for lease in leases:
            for span in lease.spans:
                held[span.server] += span.end - span.start
        assert by_label(fam, P + "server_cache_slots_in_use", "server") == held
        assert sum(held.values()) == 3 * MODEL.num_blocks
        assert set(by_label(fam, P + "chain_offered", "chain").values()) == {0}
        assert value(fam, P + "active_leases") == 3
        assert value(fam, P + "leases_granted", P + "leases_granted_total") == 3

    run(body())
