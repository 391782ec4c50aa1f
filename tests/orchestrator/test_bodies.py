"""Request bodies over real HTTP: unknown keys, wrong types and out-of-range numbers are a 400 naming the field (never
a 500) and change nothing; every body the API accepted before is still accepted."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from petals_chain.orchestrator.state.registry import Registry, RegistryError
from petals_chain.protocol.http_client import OrchestratorClient
from petals_chain.protocol.limits import MAX_TTL_S
from petals_chain.protocol.parsing import BadRequestError, parse
from petals_chain.protocol.requests import LeaseBody
from tests.orchestrator.test_orchestrator import GB, MODEL, make_orchestrator, run, serving

HUGE = "1" + "0" * 400  # 10**400 written out as a JSON number
REGISTER = {"name": "newcomer", "memory_bytes": 8e9, "tau_p_s": 0.1, "tau_c_s": 0.01, "max_batch_sessions": 16}

# (path, raw JSON body, the field the error must name)
BAD: list[tuple[str, str, str]] = [
    ("/servers/register", json.dumps({**REGISTER, "memory_byte": 8e9}), "memory_byte"),
    ("/servers/register", json.dumps({k: v for k, v in REGISTER.items() if k != "tau_c_s"}), "tau_c_s"),
    ("/servers/register", json.dumps({**REGISTER, "memory_bytes": "8e9"}), "memory_bytes"),
    ("/servers/register", json.dumps({**REGISTER, "memory_bytes": True}), "memory_bytes"),
    ("/servers/register", json.dumps({**REGISTER, "memory_bytes": None}), "memory_bytes"),
    ("/servers/register", json.dumps(REGISTER)[:-1] + ', "tau_p_s": NaN}', "tau_p_s"),
    ("/servers/register", json.dumps(REGISTER)[:-1] + ', "tau_p_s": Infinity}', "tau_p_s"),
    ("/servers/register", json.dumps(REGISTER)[:-1] + ', "memory_bytes": 1e400}', "memory_bytes"),
    ("/servers/register", json.dumps(REGISTER)[:-1] + f', "memory_bytes": {HUGE}}}', "memory_bytes"),
    ("/servers/register", json.dumps({**REGISTER, "tau_c_s": -0.5}), "tau_c_s"),
    ("/servers/register", json.dumps({**REGISTER, "tau_p_s": 1e6}), "tau_p_s"),
    ("/servers/register", json.dumps({**REGISTER, "peer_id": ""}), "peer_id"),
    ("/servers/register", json.dumps({**REGISTER, "address": ["10.0.0.1"]}), "address"),
    ("/servers/register", json.dumps({**REGISTER, "name": 7}), "name"),
    ("/servers/heartbeat", json.dumps({"name": "d", "serving": [0, 2]}), "serving"),
    ("/servers/heartbeat", json.dumps({"name": "d", "serving": {"start": 0, "end": 2, "stop": 4}}), "serving"),
    ("/servers/heartbeat", json.dumps({"name": "d", "serving": {"start": 0.0, "end": 2}}), "serving.start"),
    ("/servers/heartbeat", json.dumps({"name": "d", "serving": {"start": True, "end": 2}}), "serving.start"),
    ("/servers/heartbeat", f'{{"name": "d", "serving": {{"start": {HUGE}, "end": 2}}}}', "serving.start"),
    ("/servers/heartbeat", json.dumps({"name": "d", "serving": {"start": 0}}), "serving"),
    ("/servers/heartbeat", json.dumps({"name": "d", "serving": "0:2"}), "serving"),
    ("/servers/heartbeat", '{"name": "d", "tau_c_s": NaN}', "tau_c_s"),
    ("/servers/heartbeat", json.dumps({"name": "d", "servng": [0, 2]}), "servng"),
    ("/servers/d/leave", json.dumps({"reason": 5}), "reason"),
    ("/servers/d/leave", json.dumps({"reason": "x" * 201}), "reason"),
    ("/servers/d/leave", json.dumps({"why": "x"}), "why"),
    ("/lease", json.dumps({"timeout_s": 0}), "timeout_s"),
    ("/lease", '{"timeout_s": NaN}', "timeout_s"),
    ("/lease", f'{{"timeout_s": {HUGE}}}', "timeout_s"),
    ("/lease", json.dumps({"ttl_s": MAX_TTL_S * 2}), "ttl_s"),
    ("/lease", '{"ttl_s": -Infinity}', "ttl_s"),
    ("/lease", json.dumps({"client": "c" * 201}), "client"),
    ("/lease", json.dumps({"client": 3}), "client"),
    ("/lease", json.dumps({"ttl": 5}), "ttl"),
]


async def post(url: str, path: str, raw: str) -> tuple[int, dict[str, Any]]:
    """POST a raw body; the status and the JSON reply."""
    async with aiohttp.ClientSession() as http:
        async with http.post(url + path, data=raw, headers={"Content-Type": "application/json"}) as resp:
            return resp.status, await resp.json()


def test_bad_bodies_are_400_naming_the_field_and_change_nothing() -> None:
    """Each bad body gets 400 with the field in the message and in ``fields``; no 500, no state change."""

    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            lease = await oc.lease(timeout_s=5)
            before = json.dumps([await oc.servers(), await oc.chains()], sort_keys=True)
            cases = BAD + [
                (f"/lease/{lease.lease_id}/renew", json.dumps({"ttl_s": "5"}), "ttl_s"),
                (f"/lease/{lease.lease_id}/renew", json.dumps({"tll_s": 5}), "tll_s"),
                (f"/lease/{lease.lease_id}/release", json.dumps({"failed": True}), "failed"),
                (f"/lease/{lease.lease_id}/report-failure", json.dumps({"timeout_s": 1}), "server"),
                (f"/lease/{lease.lease_id}/report-failure", json.dumps({"server": "a", "timeout_s": -1}),
                 "timeout_s"),
                (f"/lease/{lease.lease_id}/report-failure", json.dumps({"server": "a", "sever": "a"}), "sever"),
            ]
            for path, raw, field_name in cases:
                status, reply = await post(url, path, raw)
                assert status == 400, (path, raw, reply)
                assert f"'{field_name}'" in reply["error"] and field_name in reply["fields"], (path, raw, reply)
            assert json.dumps([await oc.servers(), await oc.chains()], sort_keys=True) == before
            assert set(orch.http_errors) == {400} and orch.http_errors[400] == len(cases)
            assert orch.leases.counters.requested == 1 and orch.leases.has(lease.lease_id)

    run(body())


def test_a_misspelt_key_is_named_first() -> None:
    """`memory_byte` for `memory_bytes`: the message starts with the unknown key and lists the allowed ones."""

    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch) as url:
            raw = json.dumps({"name": "z", "memory_byte": 8e9, "tau_p_s": 0.1, "tau_c_s": 0.01,
                              "max_batch_sessions": 1})
            status, reply = await post(url, "/servers/register", raw)
        assert status == 400 and reply["status"] == 400
        assert reply["error"].startswith("unknown field 'memory_byte' (allowed: address, batch_slowdown, device, "
                                         "max_batch_sessions, memory_bytes, name,")
        assert reply["fields"] == ["memory_byte", "memory_bytes"]  # and the right key is then missing
        assert "z" not in orch.registry.servers

    run(body())


def test_bodies_accepted_before_are_still_accepted() -> None:
    """Integers for seconds and bytes, explicit nulls for optional fields, empty bodies where a body is optional."""

    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch) as url:
            ok = [
                ("/servers/register", json.dumps({"name": "n1", "memory_bytes": int(8 * GB), "tau_p_s": 1,
                                                  "tau_c_s": 0, "peer_id": None, "address": None,
                                                  "max_batch_sessions": 1, "batch_slowdown": None,
                                                  "device": None})),
                ("/servers/heartbeat", json.dumps({"name": "n1", "serving": None, "tau_p_s": None,
                                                   "tau_c_s": None})),
                ("/servers/heartbeat", json.dumps({"name": "n1", "serving": {"start": 0, "end": 0}, "tau_p_s": 1,
                                                          "tau_c_s": 0.0})),
                ("/lease", ""),
                ("/lease", json.dumps({"timeout_s": None, "ttl_s": None, "client": None})),
                ("/lease", json.dumps({"timeout_s": 5, "ttl_s": 30, "client": "me"})),
            ]
            replies = []
            for path, raw in ok:
                status, reply = await post(url, path, raw)
                assert status == 200, (path, raw, reply)
                replies.append(reply)
            first, second, third = replies[3], replies[4], replies[5]
            assert third["ttl_s"] == 30 and first["ttl_s"] == second["ttl_s"] == orch.leases.default_ttl_s
            for path, raw in [(f"/lease/{first['lease_id']}/renew", ""),
                              (f"/lease/{second['lease_id']}/renew", json.dumps({"ttl_s": None})),
                              (f"/lease/{third['lease_id']}/renew", json.dumps({"ttl_s": 45})),
                              (f"/lease/{first['lease_id']}/release", ""),
                              (f"/lease/{second['lease_id']}/release", "{}"),
                              ("/servers/n1/leave", ""),
                              ("/servers/d/leave", json.dumps({"reason": "maintenance"}))]:
                status, reply = await post(url, path, raw)
                assert status == 200, (path, raw, reply)
            assert orch.leases.get(third["lease_id"]).ttl_s == 45
            assert orch.registry.servers["n1"].dead_reason == "left: left"
            assert orch.registry.servers["d"].dead_reason == "left: maintenance"
            assert not orch.http_errors

    run(body())


def test_parse_reads_defaults_and_refuses_non_objects() -> None:
    """The parser alone: defaults for an empty optional body, 400s for a required empty body and a JSON list."""
    assert parse(LeaseBody, b"", required=False) == LeaseBody()
    assert parse(LeaseBody, b'{"timeout_s": null}').timeout_s == LeaseBody().timeout_s == 600.0
    with pytest.raises(BadRequestError, match="must be a JSON object"):
        parse(LeaseBody, b"  ")
    with pytest.raises(BadRequestError, match="JSON object, got list"):
        parse(LeaseBody, b"[1]")
    with pytest.raises(BadRequestError, match="malformed JSON"):
        parse(LeaseBody, b'{"timeout_s": ' + b"1" * 5000 + b"}")  # more digits than Python converts: not JSON here


def test_the_registry_refuses_huge_integers_from_any_caller() -> None:
    """Called directly (a cluster file, Python code), the registry answers a 400-digit integer with its own error
    naming the field, not an OverflowError."""
    registry = Registry(MODEL)
    with pytest.raises(RegistryError, match="memory_bytes"):
        registry.register("x", 10**400, 0.1, 0.01, now_s=0.0)
    with pytest.raises(RegistryError, match="tau_c_s"):
        registry.register("x", 8 * GB, 0.1, -(10**400), now_s=0.0)
    assert not registry.servers
