"""The orchestrator survives its own restart (issue 12): SIGKILLed under load and started again with the same
arguments (``--state-dir``), nobody notices but a stall.

Orchestrator (with its DHT) + three servers of the tiny random LLaMA that tests/live/test_swarm.py builds; as many
concurrent generations as there are slots plus three that wait in the queue; then the orchestrator's whole process
group is SIGKILLed, two more requests are sent while it is down, and it is started again with the same arguments.
Every request must complete with local greedy decoding's tokens; the queued ones keep their jobs (their place in
line: they re-attached instead of queueing again) and come before the ones sent during the outage; no chain is ever
over-committed (GET /chains sampled throughout); the DHT node keeps its peer id and address and the composition is
the same; and a fresh client process (bootstrapping from the orchestrator's DHT) generates correctly afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from tests.live import test_swarm
from tests.live.test_failover import _ChainWatch
from tests.live.test_swarm import _chains, _full_capacity, _wait_for

from petals_chain.loopback.swarm import LocalSwarm, ServerPlan, group_members

tiny_dir = test_swarm.tiny_dir
reference = test_swarm.reference

REPO = Path(__file__).resolve().parents[2]
MAX_LENGTH = 256
NEW_TOKENS = 60
QUEUED = 3  # requests waiting in the queue when the orchestrator dies
DURING_OUTAGE = 2  # requests sent while it is down
SERVERS = [ServerPlan("r1", "3MB"), ServerPlan("r2", "1.6MB"), ServerPlan("r3", "1.6MB")]


def _prompt(i: int) -> list[int]:
    """A distinct short prompt per request."""
    return [1, 5 + 13 * i, 60 + i, 42, 7 + i]


def _free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _job(lease_id: str) -> int:
    """The job number in a lease id ("L<job>-<random>"): the request's place in line."""
    return int(lease_id[1:].split("-")[0])


FRESH_CLIENT = """
import json, sys, torch
from petals_chain import AutoDistributedModelForCausalLM
model = AutoDistributedModelForCausalLM.from_pretrained(sys.argv[1], orchestrator=sys.argv[2], lease_timeout_s=60.0)
try:
    out = model.generate(torch.tensor([json.loads(sys.argv[3])]), max_new_tokens=int(sys.argv[4]), do_sample=False)
    print("TOKENS " + json.dumps(out[0].tolist()), flush=True)
finally:
    model.orchestrator.close()
"""


@pytest.mark.live
def test_orchestrator_killed_under_load_and_restarted(tiny_dir: Path, reference, tmp_path: Path) -> None:
    from petals_chain import AutoDistributedModelForCausalLM

    state_dir = tmp_path / "state"
    with LocalSwarm(tiny_dir, SERVERS, log_dir=tmp_path / "logs", model_name="tiny-llama", max_length=MAX_LENGTH,
                    arrival_rate=8.0, c=2, lease_ttl_s=20.0, heartbeat_timeout_s=20.0, port=_free_port(),
                    orchestrator_args=("--state-dir", str(state_dir))) as sw:
        sw.start(timeout_s=240)
        chains = _chains(sw)
        capacity = sum(c["capacity"] for c in chains)
        assert capacity >= 2, chains
        health_before = sw.get("/health")
        servers_before = {r["name"]: r["assignment"] for r in sw.get("/servers")["servers"]}
        model = AutoDistributedModelForCausalLM.from_pretrained(str(tiny_dir), orchestrator=sw.url,
                                                               lease_timeout_s=120.0, lease_ttl_s=20.0)
        results: dict[int, list[int]] = {}
        records: dict[int, object] = {}
        errors: list[BaseException] = []

        def one(i: int) -> None:
            """One user: a leased session generating NEW_TOKENS greedily."""
            try:
                with model.inference_session(max_length=MAX_LENGTH) as s:
                    out = model.generate(torch.tensor([_prompt(i)]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                         session=s)
                    results[i] = out[0].tolist()
                records[i] = s.record
            except BaseException as exc:  # collected and reported below
                errors.append(exc)

        n = capacity + QUEUED
        watch = _ChainWatch(sw)
        threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
        try:
            for t in threads:
                t.start()
            _wait_for(lambda: (lambda h: h["active_leases"] == capacity and h["queue_length"] == QUEUED)(
                sw.get("/health")), 90, "every slot busy and the rest queued", period_s=0.05)
            queued_jobs = {q["job"] for q in sw.get("/queue")["head"]}
            orch = next(p for p in sw.procs if p.name == "orchestrator")
            killed_s = time.monotonic()
            os.killpg(orch.pgid, signal.SIGKILL)
            _wait_for(lambda: orch.popen.poll() is not None and not group_members(orch.pgid), 30,
                      "the orchestrator's process group to be gone")
            sw.procs.remove(orch)
            late = [threading.Thread(target=one, args=(n + k,), daemon=True) for k in range(DURING_OUTAGE)]
            for t in late:  # these find no orchestrator: they wait and retry
                t.start()
            url_before = sw.url
            assert sw.start_orchestrator() == url_before  # the same arguments, the same address
            restarted_s = time.monotonic()
            for t in threads + late:
                t.join(240)
        finally:
            watch.stop()
            model.orchestrator.close()

        # -- users: every request completed with the right tokens --
        assert not errors, errors[:3]
        assert sorted(results) == list(range(n + DURING_OUTAGE))
        for i, tokens in results.items():
            assert tokens == reference(_prompt(i), NEW_TOKENS), f"request {i}"
        jobs = {i: _job(r.lease_id) for i, r in records.items()}
        assert all(not r.failovers for r in records.values()), [r.failovers for r in records.values()]
        # The queued requests kept their jobs (their place in line) and precede those sent during the outage.
        assert queued_jobs <= set(jobs.values()), (queued_jobs, jobs)
        assert min(jobs[n + k] for k in range(DURING_OUTAGE)) > max(queued_jobs)
        assert len(set(jobs.values())) == len(jobs)

        # -- orchestrator: never over-committed; same DHT identity and address, same composition --
        assert watch.polls > 0 and not watch.overcommitted, watch.overcommitted[:3]
        health = sw.get("/health")
        assert health["dht"]["initial_peers"] == health_before["dht"]["initial_peers"]
        servers_after = {r["name"]: r for r in sw.get("/servers")["servers"]}
        assert all(r["alive"] for r in servers_after.values())
        assert {k: (a["start"], a["end"]) for k, a in servers_before.items()} == \
            {k: (r["assignment"]["start"], r["assignment"]["end"]) for k, r in servers_after.items()}
        _wait_for(lambda: _full_capacity(sw), 30, "every slot free again")
        assert sw.get("/health")["capacity"] == capacity
        print(f"\n[restart] {n} requests in flight ({QUEUED} queued) + {DURING_OUTAGE} during the outage; "
              f"orchestrator back {restarted_s - killed_s:.1f} s after the kill", flush=True)

        # -- a fresh client process joins through the restarted orchestrator's DHT --
        env = dict(os.environ, PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
        prompt = [1, 250, 300, 42, 9]  # not one of the requests above (the tiny model's vocabulary has 512 tokens)
        fresh_s = time.monotonic()
        proc = subprocess.run([sys.executable, "-c", FRESH_CLIENT, str(tiny_dir), sw.url, json.dumps(prompt),
                               "20"], env=env, capture_output=True, text=True, timeout=240)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("TOKENS ")), None)
        assert proc.returncode == 0 and line is not None, proc.stderr[-3000:]
        assert json.loads(line[len("TOKENS "):]) == reference(prompt, 20)
        print(f"[restart] a fresh client process generated correctly ({time.monotonic() - fresh_s:.1f} s with its "
              "start)", flush=True)
        assert sw.stop() == []
