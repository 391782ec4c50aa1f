"""Live regions: the region-aware orchestrator with one tiny-LLaMA server per region; a PETALS client leasing for
origin r0 is served where the macro plan says (at home before any plan, spread by the plan's row after a slot),
and every answer equals local greedy generation. Clients run undelayed in the root namespace (no root needed);
the delayed origins are exercised by ``python -m petals_chain.experiments torta-live``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from petals_chain.loopback.regions import RegionalSwarm
from petals_chain.loopback.swarm import ServerPlan, write_tiny_llama
from petals_chain.protocol.blocking import request_json

pytestmark = pytest.mark.live

REGIONS = ["r0", "r1"]  # two keep the test short; the experiment runs three
LATENCY_S = np.array([[0.005, 0.030], [0.030, 0.005]])
PROMPTS = [[1, 5, 17, 42, 99, 3], [1, 300, 301, 7], [1, 9, 8, 7, 6, 5, 4, 3], [1, 77]]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-block random LLaMA checkpoint (seeded)."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-regions") / "tiny-llama", seed=0)


@pytest.fixture(scope="module")
def swarm(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Two regions of one whole-model server each; slots are closed by the test (a very long slot)."""
    regions = {r: [ServerPlan(f"{r}-s0", "3MB")] for r in REGIONS}
    sw = RegionalSwarm(tiny_dir, regions, LATENCY_S, [], log_dir=tmp_path_factory.mktemp("regions-logs"),
                       slot_s=3600.0, model_name="tiny-llama", max_length=256, c=1, lease_ttl_s=20.0,
                       heartbeat_timeout_s=15.0)
    try:
        sw.start(timeout_s=240)
        yield sw
    finally:
        assert sw.stop() == []


def test_origin_requests_follow_the_plan_and_answers_are_correct(swarm: RegionalSwarm, tiny_dir: Path) -> None:
    """Before any plan r0's requests stay in r0; after a slot with r0's arrivals the plan's r0 row spreads them
    over the regions' capacity shares, and the regions that served them (the chains' servers) are the ones the
    macro layer decided, within one request of the row; every answer equals local transformers' greedy."""
    from transformers import LlamaForCausalLM

    from petals_chain import AutoDistributedModelForCausalLM

    local = LlamaForCausalLM.from_pretrained(str(tiny_dir)).eval()
    model = AutoDistributedModelForCausalLM.from_pretrained(str(tiny_dir), orchestrator=swarm.url + "/origins/r0",
                                                           lease_timeout_s=120.0, lease_ttl_s=20.0)

    from petals_chain.loopback.region_client import connect_servers, wait_announced

    wait_announced(model, len(REGIONS))
    assert connect_servers(model, swarm.get("/servers")["servers"]) == len(REGIONS)  # every server's address

    def serve(prompt: list[int]) -> str:
        """One greedy request through the swarm; checks the answer and returns the region that served it."""
        with torch.no_grad():
            want = local.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0].tolist()
        with model.inference_session(max_length=64) as s:
            got = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, session=s)[0].tolist()
            servers = {sp.server for sp in s.lease.spans}
        assert got == want
        (region,) = {swarm.region_of[n] for n in servers}
        return region

    try:
        assert serve(PROMPTS[0]) == "r0"  # A = I until a slot has seen arrivals
        plan = np.array(request_json(swarm.url + "/macro/slot", data={})["plan"])
        assert np.allclose(plan.sum(1), 1.0) and plan[0, 0] < 0.9  # one origin's mass onto every region's share
        n = 4
        served = [serve(PROMPTS[i % len(PROMPTS)]) for i in range(n)]
        macro = swarm.get("/macro")
        decided = [d["region"] for d in macro["decisions"] if d["origin"] == "r0"][-n:]
        assert served == decided
        counts = np.array([served.count(r) for r in REGIONS])
        assert np.abs(counts - n * plan[0]).max() <= 1.0 + 1e-9, (counts, plan[0])
        assert len(set(served)) >= 2
    finally:
        model.orchestrator.close()
