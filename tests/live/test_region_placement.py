"""Live region placement: real servers name their region (``--region r0``) or are placed by the round trips they
measure to the regions' anchors (``--region auto``; each anchor is a delaying relay in front of the orchestrator);
a server naming an unknown region exits with one line and code 2, registered nowhere. A PETALS client leasing for
origin r1 is then served by the server placed there by RTT, and its answer equals local greedy generation.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch

from petals_chain.loopback.regions import RegionalSwarm
from petals_chain.loopback.swarm import ServerPlan, write_tiny_llama

pytestmark = pytest.mark.live

REGIONS = ["r0", "r1"]
LATENCY_S = np.array([[0.005, 0.030], [0.030, 0.005]])
ANCHOR_DELAY_MS = {"r0": 40.0, "r1": 2.0}  # one-way: the RTT-placed server is far from r0's anchor, near r1's


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-block random LLaMA checkpoint (seeded)."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-place") / "tiny-llama", seed=0)


@pytest.fixture(scope="module")
def swarm(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """r0's server names its region; r1's is placed by RTT (listed under r1: where it is expected to land)."""
    regions = {"r0": [ServerPlan("r0-named", "3MB")], "r1": [ServerPlan("r1-auto", "3MB", ("--region", "auto"))]}
    sw = RegionalSwarm(tiny_dir, regions, LATENCY_S, [], log_dir=tmp_path_factory.mktemp("place-logs"),
                       slot_s=3600.0, model_name="tiny-llama", max_length=256, c=1, lease_ttl_s=20.0,
                       heartbeat_timeout_s=15.0, anchor_delay_ms=ANCHOR_DELAY_MS)
    try:
        sw.start(timeout_s=240)
        yield sw
    finally:
        assert sw.stop() == []


def test_servers_join_the_region_they_name_or_measure(swarm: RegionalSwarm, tiny_dir: Path) -> None:
    """/servers and /regions show r0-named in r0 (by name) and r1-auto in r1 (by RTT, its measured round trips at
    least the anchors' delays: ≥ 80 ms to r0's, well below to r1's); a server naming 'mars' exits 2 with one line
    naming the region and is registered nowhere; a client of origin r1 is served by r1-auto, correctly."""
    where = {s["name"]: s["region"] for s in swarm.get("/servers")["servers"]}
    assert where == {"r0-named": "r0", "r1-auto": "r1"}
    placements = swarm.get("/regions")["placements"]
    assert placements["r0-named"] == {"region": "r0", "by": "name", "rtt_s": None}
    auto = placements["r1-auto"]
    assert auto["region"] == "r1" and auto["by"] == "rtt"
    rtt_r0, rtt_r1 = auto["rtt_s"]
    assert rtt_r0 >= 2 * ANCHOR_DELAY_MS["r0"] * 1e-3 and rtt_r1 < rtt_r0 / 2, auto["rtt_s"]

    bad = swarm.start_server(ServerPlan("mars-server", "3MB", ("--region", "mars")))
    deadline = time.monotonic() + 180
    while bad.popen.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert bad.popen.returncode == 2, bad.log_tail()
    errors = [ln for ln in bad.log_path.read_text(errors="replace").splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "region" in errors[0] and "mars" in errors[0], errors
    assert "mars-server" not in {s["name"] for s in swarm.get("/servers")["servers"]}
    assert "mars-server" not in swarm.get("/regions")["placements"]

    from transformers import LlamaForCausalLM

    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.loopback.region_client import connect_servers, wait_announced

    local = LlamaForCausalLM.from_pretrained(str(tiny_dir)).eval()
    model = AutoDistributedModelForCausalLM.from_pretrained(str(tiny_dir), orchestrator=swarm.url + "/origins/r1",
                                                           lease_timeout_s=120.0, lease_ttl_s=20.0)
    try:
        wait_announced(model, len(REGIONS))
        assert connect_servers(model, swarm.get("/servers")["servers"]) == len(REGIONS)
        prompt = [1, 5, 17, 42, 99, 3]
        with torch.no_grad():
            want = local.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False)[0].tolist()
            with model.inference_session(max_length=64) as s:
                got = model.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False,
                                     session=s)[0].tolist()
                servers = {sp.server for sp in s.lease.spans}
        assert got == want and servers == {"r1-auto"}  # A = I before any slot: r1's request stays in r1
    finally:
        model.orchestrator.close()
