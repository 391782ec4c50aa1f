"""Servers that keep an emulated GPU's time, on a real swarm: tokens stay exact, steps last the device's time.

Two orchestrated servers emulate an A100 3g.40gb and a 2g.20gb MIG slice (``--emulate-device``, time dilated × 2)
while computing on the tiny LLaMA-shaped checkpoint; memory is counted in LLaMA-2-7B units, so the orchestrator
composes with 40 / 20 GB of 0.405 GB blocks. Concurrent greedy sessions must write exactly local transformers'
tokens; each server's step log must hold the steps it ran, each at least its device time apart, and a session alone
must take at least the device time of its steps.
"""

from __future__ import annotations

import csv
import threading
import time
from pathlib import Path

import pytest
import torch

from petals_chain.checkpoint.tiny_llama import NAME, write_tiny_llama
from petals_chain.device_profile import device, emulated_sizes
from petals_chain.loopback.swarm import LocalSwarm, ServerPlan, group_members

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / ".cache" / "models" / NAME
MAX_LENGTH = 256
K = 2.0
PROMPTS = [[5, 17, 99, 3, 250], list(range(40, 101)), [7] * 12]
NEW_TOKENS = [6, 4, 8]


@pytest.fixture(scope="module")
def swarm_model(tmp_path_factory: pytest.TempPathFactory):
    """Orchestrator + a 3g.40gb and a 2g.20gb emulated server of the tiny model, and the leasing client."""
    write_tiny_llama(TINY)
    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.client.model import close_client

    logs = tmp_path_factory.mktemp("emulated-logs")
    plans = [ServerPlan(name, memory, ("--emulate-device", dev, "--time-dilation", str(K),
                                       "--device-log", str(logs / f"{name}.csv")))
             for name, memory, dev in (("big", "40GB", "a100-3g.40gb"), ("small", "20GB", "a100-2g.20gb"))]
    sw = LocalSwarm(TINY, plans, log_dir=logs, model_name="tiny-emulated", max_length=MAX_LENGTH, arrival_rate=0.2,
                    c=4)
    sw.sizes = sw.sizes.emulated(*emulated_sizes(MAX_LENGTH))  # the orchestrator counts LLaMA-2-7B's bytes too
    with sw:
        sw.start(timeout_s=360)
        model = AutoDistributedModelForCausalLM.from_pretrained(str(TINY), orchestrator=sw.url, lease_timeout_s=300.0)
        try:
            yield sw, model, logs
        finally:
            close_client(model)
    assert all(not group_members(pg) for pg in sw.started_pgids)


@pytest.fixture(scope="module")
def expected():
    from transformers import LlamaForCausalLM

    local = LlamaForCausalLM.from_pretrained(str(TINY)).eval()
    with torch.no_grad():
        return [local.generate(torch.tensor([p]), max_new_tokens=n, do_sample=False)[0].tolist()
                for p, n in zip(PROMPTS, NEW_TOKENS)]


def _steps(path: Path) -> list[dict[str, float]]:
    with path.open() as fh:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def test_the_orchestrator_counts_llama_2_7b_units(swarm_model) -> None:
    """Budgets of 40 and 20 GB of 0.405 GB blocks: no chain holds more sessions than its servers' LLaMA-2-7B caches,
    and each server registered the device's τp (not the tiny checkpoint's CPU time)."""
    sw, _, _ = swarm_model
    block, cache = emulated_sizes(MAX_LENGTH)
    recs = {r["name"]: r for r in sw.get("/servers")["servers"]}
    for name, memory, dev in (("big", 40e9, "a100-3g.40gb"), ("small", 20e9, "a100-2g.20gb")):
        assert recs[name]["memory_bytes"] == pytest.approx(memory)
        assert recs[name]["tau_p_s"] == pytest.approx(device(dev).dilated(K).job_s(32, 16), rel=1e-6)
    for chain in sw.get("/chains")["chains"]:
        for hop in chain["spans"]:
            m = hop["end"] - hop["start"]
            memory = recs[hop["server"]]["memory_bytes"]
            assert chain["capacity"] <= (memory - m * block) // (cache * m)


def test_a_lone_session_takes_at_least_its_device_time(swarm_model, expected) -> None:
    sw, model, logs = swarm_model
    before = {p.name: len(_steps(p)) for p in logs.glob("*.csv")}
    t0 = time.monotonic()
    with model.inference_session(max_length=128) as s:
        out = model.generate(torch.tensor([PROMPTS[0]]), max_new_tokens=NEW_TOKENS[0], do_sample=False, session=s)
    wall = time.monotonic() - t0
    assert out[0].tolist() == expected[0]
    device_s = {p.name: sum(r["device_s"] for r in _steps(p)[before.get(p.name, 0):]) for p in logs.glob("*.csv")}
    assert sum(device_s.values()) > 0
    assert wall >= sum(device_s.values())  # the chain's hops run one after the other, each for its device time
    for name, dev in (("big", "a100-3g.40gb"), ("small", "a100-2g.20gb")):
        mine = _steps(logs / f"{name}.csv")[before.get(f"{name}.csv", 0):]
        if mine:  # the session's first step on this server: its prompt over the server's span
            profile = device(dev).dilated(K)
            assert mine[0]["tokens"] == len(PROMPTS[0]) and mine[0]["context"] == 0
            assert mine[0]["device_s"] == pytest.approx(profile.step_s(int(mine[0]["blocks"]), [len(PROMPTS[0])],
                                                                       [0]), rel=1e-3)


def test_concurrent_sessions_write_local_greedy_tokens_on_the_devices_clock(swarm_model, expected) -> None:
    sw, model, logs = swarm_model
    results: list[list[int] | None] = [None] * len(PROMPTS)
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            with model.inference_session(max_length=128) as s:
                results[i] = model.generate(torch.tensor([PROMPTS[i]]), max_new_tokens=NEW_TOKENS[i],
                                            do_sample=False, session=s)[0].tolist()
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors[:2]
    assert results == expected
    steps = [r for name in ("big", "small") for r in _steps(logs / f"{name}.csv")]
    assert sum(r["sessions"] for r in steps) >= sum(NEW_TOKENS)  # every session's steps went through a device clock
    for name in ("big", "small"):  # one device each: a step starts once the previous one's device time has passed
        by_start = sorted(_steps(logs / f"{name}.csv"), key=lambda r: r["t_s"])
        for a, b in zip(by_start, by_start[1:]):
            assert b["t_s"] >= a["t_s"] + max(a["device_s"], a["real_s"]) - 2e-3
