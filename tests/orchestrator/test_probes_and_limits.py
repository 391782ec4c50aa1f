"""/health and /ready over real HTTP, and bodies no handler should choke on: oversized, deeply nested, huge numbers."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable

import aiohttp
import pytest

from petals_chain.orchestrator.engine.config import OrchestratorConfig
from petals_chain.orchestrator.engine.core import Orchestrator
from petals_chain.orchestrator.state.registry import Registry
from petals_chain.protocol.limits import MAX_BODY_BYTES
from tests.orchestrator.test_orchestrator import MODEL, PAPER, make_orchestrator, serving

GB = 1e9
POST_ROUTES = ["/servers/register", "/servers/heartbeat", "/servers/a/leave", "/lease", "/lease/x/renew",
               "/lease/x/release", "/lease/x/report-failure"]


def run(coro: Awaitable[None]) -> None:
    """Run one async test body."""
    asyncio.run(coro)


async def get(http: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    """GET → (status, JSON body)."""
    async with http.get(url) as r:
        return r.status, await r.json()


async def post(http: aiohttp.ClientSession, url: str, data: bytes, **headers: str) -> tuple[int, dict]:
    """POST raw bytes as JSON → (status, JSON body)."""
    async with http.post(url, data=data, headers={"Content-Type": "application/json", **headers}) as r:
        return r.status, await r.json()


def test_ready_is_503_until_a_chain_is_offered_then_200() -> None:
    """No servers: 503; a server registered but not yet serving its span: 503; serving it: 200. /health: always 200."""

    async def body() -> None:
        orch = Orchestrator(Registry(MODEL), OrchestratorConfig(heartbeat_timeout_s=None, offer_when_serving=True),
                            composition_policy=PAPER)
        async with serving(orch) as url, aiohttp.ClientSession() as http:
            status, reply = await get(http, url + "/ready")
            assert status == 503 and reply["ready"] is False and reply["chains"] == 0
            assert "not ready" in reply["error"] and "0 servers alive" in reply["error"]
            assert (await get(http, url + "/health"))[0] == 200

            reg = {"name": "a", "memory_bytes": 8 * GB, "tau_p_s": 0.1, "tau_c_s": 0.01, "max_batch_sessions": 16}
            status, reply = await post(http, url + "/servers/register", json.dumps(reg).encode())
            assert status == 200, reply
            span = reply["assignment"]
            assert (span["start"], span["end"]) == (0, 4)  # one server: it holds the whole model
            status, reply = await get(http, url + "/ready")
            assert status == 503 and "still loading" in reply["error"], reply

            beat = {"name": "a", "serving": {"start": span["start"], "end": span["end"]}}
            status, reply = await post(http, url + "/servers/heartbeat", json.dumps(beat).encode())
            assert status == 200, reply
            status, reply = await get(http, url + "/ready")
            assert status == 200 and reply["ready"] is True and reply["chains"] >= 1 and reply["capacity"] >= 1
            assert (await get(http, url + "/health"))[0] == 200
        assert 503 not in orch.http_errors  # a probe polling /ready is not an error

    run(body())


def test_probes_need_no_token_other_routes_do() -> None:
    """With a token, /health and /ready answer anyone (orchestration tools send no credentials); /chains does not."""

    async def body() -> None:
        async with serving(make_orchestrator(), token="s3cret") as url, aiohttp.ClientSession() as http:
            assert (await get(http, url + "/health"))[0] == 200
            status, reply = await get(http, url + "/ready")
            assert status == 200 and reply["chains"] == 3 and reply["capacity"] == 4
            assert (await get(http, url + "/chains"))[0] == 401

    run(body())


def test_ready_503_when_no_composition_exists() -> None:
    """A server too small to hold the model: the composition error is the reason /ready gives."""

    async def body() -> None:
        registry = Registry(MODEL)
        registry.register("tiny", 2 * GB, 0.1, 0.01, now_s=time.monotonic())
        orch = Orchestrator(registry, OrchestratorConfig(heartbeat_timeout_s=None), composition_policy=PAPER)
        orch.recompose_now()
        async with serving(orch) as url, aiohttp.ClientSession() as http:
            status, reply = await get(http, url + "/ready")
            assert status == 503 and "no composition:" in reply["error"], reply

    run(body())


@pytest.mark.parametrize("route", POST_ROUTES)
def test_oversized_body_is_413_with_a_message(route: str) -> None:
    """A 10 MB body on any POST route: 413 naming the limit, never a 5xx; the swarm keeps serving."""

    async def body() -> None:
        orch = make_orchestrator()
        big = b'{"name": "' + b"x" * (10 * 1024 * 1024) + b'"}'
        async with serving(orch) as url, aiohttp.ClientSession() as http:
            status, reply = await post(http, url + route, big)
            assert status == 413, reply
            assert reply["status"] == 413 and str(MAX_BODY_BYTES) in reply["error"]
            assert (await get(http, url + "/ready"))[0] == 200
        assert not any(code >= 500 for code in orch.http_errors)

    run(body())


@pytest.mark.parametrize("depth", [50, 5_000, 100_000])
def test_deeply_nested_body_is_400(depth: int) -> None:
    """Nested arrays as a field's value or as the whole body: 400 with a message, never a 5xx."""

    async def body() -> None:
        orch = make_orchestrator()
        nested = b"[" * depth + b"]" * depth
        async with serving(orch) as url, aiohttp.ClientSession() as http:
            if len(nested) <= MAX_BODY_BYTES:
                for data in (nested, b'{"client": ' + nested + b"}", b'{"ttl_s": ' + nested + b"}"):
                    status, reply = await post(http, url + "/lease", data)
                    assert status == 400 and reply["error"], reply
            else:
                status, reply = await post(http, url + "/lease", nested)
                assert status == 413, reply
        assert orch.leases.counters.requested == 0
        assert not any(code >= 500 for code in orch.http_errors)

    run(body())


def test_huge_and_non_finite_numbers_are_400() -> None:
    """10^400 as an integer, as a float, NaN and Infinity in a numeric field: 400 naming the field."""

    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch) as url, aiohttp.ClientSession() as http:
            for value in (b"1" + b"0" * 400, b"1e400", b"NaN", b"Infinity", b"-Infinity", b"1" + b"0" * 5000):
                status, reply = await post(http, url + "/lease", b'{"ttl_s": ' + value + b"}")
                assert status == 400 and reply["error"], (value[:20], reply)
        assert orch.leases.counters.requested == 0
        assert not any(code >= 500 for code in orch.http_errors)

    run(body())
