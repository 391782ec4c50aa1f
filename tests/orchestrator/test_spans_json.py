"""The orchestrator's JSON writes every span as {"start": S, "end": E} (0-indexed, end exclusive), both ways."""

from __future__ import annotations

import pytest

from petals_chain.protocol.http_client import OrchestratorClient, OrchestratorError
from tests.orchestrator.test_orchestrator import MODEL, make_orchestrator, run, serving


def test_servers_chains_and_heartbeats_use_one_span_form() -> None:
    async def body() -> None:
        orch = make_orchestrator()
        async with serving(orch) as url, OrchestratorClient(url) as oc:
            await oc.heartbeat("d", serving=(0, 2))
            recs = {r["name"]: r for r in (await oc.servers())["servers"]}
            # d and e hold the paper's blocks 1-2 and 3-4: PETALS spans 0:2 and 2:4
            assert {n: (r["assignment"]["start"], r["assignment"]["end"]) for n, r in recs.items()} == {
                "a": (0, 4), "b": (0, 4), "d": (0, 2), "e": (2, 4)}
            assert recs["d"]["serving"] == {"start": 0, "end": 2}
            assert recs["e"]["serving"] is None
            for chain in (await oc.chains())["chains"]:
                spans = chain["spans"]
                assert all(set(s) == {"server", "start", "end"} for s in spans)
                assert spans[0]["start"] == 0 and spans[-1]["end"] == MODEL.num_blocks
                assert all(x["end"] == y["start"] for x, y in zip(spans, spans[1:]))

            before = (await oc.servers())["servers"]
            for bad in ([0, 2], {"start": 0}, {"start": 0, "end": 2, "blocks": 2}, "0:2"):
                with pytest.raises(OrchestratorError) as err:
                    await oc._call("POST", "/servers/heartbeat", {"name": "d", "serving": bad})
                assert err.value.status == 400 and "'serving'" in err.value.message and '"start"' in err.value.message
            assert (await oc.servers())["servers"] == before

    run(body())
