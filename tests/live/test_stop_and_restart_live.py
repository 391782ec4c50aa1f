"""Issue 23, live: a restart opens no door, a finished generation never waits for the orchestrator, and Ctrl-C
stops a server as SIGTERM does.

One swarm of the tiny random LLaMA (tests/live/test_swarm.py's fixtures): orchestrator with its DHT, role tokens and
``--state-dir`` on a fixed port, and two whole-model servers (two chains).

1. A session finishes generating, the orchestrator is SIGKILLed, and the session is closed during the outage: close()
   returns at once; the orchestrator restarts with the same arguments and, while server s1 is stopped (SIGSTOP, so it
   cannot speak first), a registration of ``s1`` with a new peer id and the server token alone is refused (403). s1
   resumes with the secret it had before the restart, the swarm serves greedy tokens again, and the session's release
   reaches the restarted orchestrator (a release, not an expiry).
2. SIGINT to a server's process (as PETALS' CI stops its servers) while a session generates through it: the session is
   drained to the other chain and finishes with greedy tokens, the server leaves as drained and exits with code 0,
   no abort.
3. Ctrl-C twice (SIGINT to the whole process group) on a server whose session cannot be moved: the first starts the
   drain, the second ends it at once; exit code 0, no abort.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from petals_chain.loopback.swarm import LocalSwarm, ServerPlan, group_members
from petals_chain.protocol.messages import DRAINED_REASON
from tests.live import test_swarm
from tests.live.test_restart import _free_port
from tests.live.test_swarm import MAX_LENGTH, _wait_for
from tests.live.test_trust_live import INVENTED_PEER, TOKENS, call, role_tokens_in_env

pytestmark = pytest.mark.live

tiny_dir = test_swarm.tiny_dir
reference = test_swarm.reference
SERVERS = [ServerPlan("s1", "3MB"), ServerPlan("s2", "3MB")]
CLOSE_PROMPT_S = 5.0  # a close that waited for the orchestrator would take its whole retry budget (120 s)
ABORT = "terminate called"


@pytest.fixture(scope="module")
def swarm(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Orchestrator (DHT, role tokens, --state-dir, a fixed port) + 2 whole-model servers."""
    state = tmp_path_factory.mktemp("state")
    with role_tokens_in_env():
        sw = LocalSwarm(tiny_dir, SERVERS, log_dir=tmp_path_factory.mktemp("issue23-logs"), model_name="tiny-llama",
                        max_length=MAX_LENGTH, arrival_rate=4.0, c=1, lease_ttl_s=20.0, heartbeat_timeout_s=15.0,
                        orchestrator_args=("--state-dir", str(state)), port=_free_port(),
                        api_token=TOKENS["operator"])
        try:
            sw.start(timeout_s=240)
            yield sw
        finally:
            sw.stop()


@pytest.fixture(scope="module")
def model(swarm: LocalSwarm, tiny_dir: Path):
    """The leasing PETALS client (its token from $PETALS_CHAIN_CLIENT_TOKEN)."""
    from petals_chain import AutoDistributedModelForCausalLM

    m = AutoDistributedModelForCausalLM.from_pretrained(str(tiny_dir), orchestrator=swarm.url, lease_timeout_s=120.0,
                                                       lease_ttl_s=20.0, max_retries=2)
    yield m
    m.orchestrator.close()


def _servers(swarm: LocalSwarm) -> dict[str, dict]:
    """GET /servers by name."""
    return {r["name"]: r for r in swarm.get("/servers")["servers"]}


def _counters(swarm: LocalSwarm) -> dict[str, float]:
    """The lease counters of /metrics (the operator's route)."""
    req = urllib.request.Request(swarm.url + "/metrics", headers={"Authorization": f"Bearer {TOKENS['operator']}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        text = resp.read().decode()
    return {key: float(next(ln for ln in text.splitlines() if ln.startswith(f"petals_chain_leases_{key}_total "))
                       .split()[1]) for key in ("released", "expired", "granted")}


def _proc(swarm: LocalSwarm, name: str):
    """The SwarmProcess called ``name``."""
    return next(p for p in swarm.procs if p.name == name)


def _full(swarm: LocalSwarm, capacity: int) -> bool:
    """Every chain offered again and every slot free."""
    h = swarm.get("/health")
    return h["capacity"] == capacity and h["free"] == capacity and h["active_leases"] == 0


def test_restart_keeps_names_to_their_secrets_and_close_never_waits(swarm: LocalSwarm, model, reference) -> None:
    capacity = swarm.get("/health")["capacity"]
    assert capacity >= 2
    peers = {n: r["peer_id"] for n, r in _servers(swarm).items()}
    orch = _proc(swarm, "orchestrator")
    prompt = [1, 5, 17, 42]
    closed: dict[str, float] = {}

    session = model.transformer.h.open_session(max_length=MAX_LENGTH)  # closable from any thread
    out = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, session=session)[0].tolist()
    assert out == reference(prompt, 8)
    os.killpg(orch.pgid, signal.SIGKILL)
    _wait_for(lambda: orch.popen.poll() is not None and not group_members(orch.pgid), 30, "the orchestrator gone")
    swarm.procs.remove(orch)

    def close() -> None:
        t0 = time.monotonic()
        session.close()
        closed["s"] = time.monotonic() - t0

    closer = threading.Thread(target=close, daemon=True)
    closer.start()
    closer.join(CLOSE_PROMPT_S)
    stack_now = "".join(traceback.format_stack(sys._current_frames()[closer.ident])) if closer.is_alive() else ""
    assert "s" in closed, f"closing a finished session waited > {CLOSE_PROMPT_S} s for the orchestrator:\n{stack_now}"

    s1 = _proc(swarm, "s1")
    os.killpg(s1.pgid, signal.SIGSTOP)  # s1 cannot speak first: the takeover comes in the window after the restart
    try:
        url = swarm.url
        assert swarm.start_orchestrator() == url
        grab = {"name": "s1", "memory_bytes": 50e6, "tau_p_s": 1e-4, "tau_c_s": 0.0, "peer_id": INVENTED_PEER,
                "max_batch_sessions": 16}
        status, reply, _ = call(swarm, "POST", "/servers/register", grab, TOKENS["server"])
        assert status == 403 and "only it may register again" in reply["error"], (status, reply)
        assert call(swarm, "POST", "/servers/s1/leave", {}, TOKENS["server"])[0] == 403
        rec = _servers(swarm)["s1"]
        assert rec["alive"] and rec["peer_id"] == peers["s1"]
    finally:
        os.killpg(s1.pgid, signal.SIGCONT)

    _wait_for(lambda: _full(swarm, capacity), 90, "every chain offered again with every slot free")
    assert {n: r["peer_id"] for n, r in _servers(swarm).items()} == peers  # nobody took a name
    counters = _counters(swarm)
    assert counters["released"] == 1 and counters["expired"] == 0, counters  # the close's release, sent after all
    assert model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0].tolist() == out


def test_sigint_drains_the_server_like_sigterm_and_exits_0(swarm: LocalSwarm, model, reference) -> None:
    c = TOKENS["client"]
    status, blocker, _ = call(swarm, "POST", "/lease", {"timeout_s": 60}, c)  # the session gets the other chain
    assert status == 200
    prompt, result, info = [1, 9, 8, 7], {}, {}
    started = threading.Event()

    def generate() -> None:
        with model.inference_session(max_length=MAX_LENGTH) as s:
            info["server"], info["session"] = s.lease.spans[0].server, s
            started.set()
            result["tokens"] = model.generate(torch.tensor([prompt]), max_new_tokens=60, do_sample=False,
                                              session=s)[0].tolist()

    gen = threading.Thread(target=generate, daemon=True)
    gen.start()
    assert started.wait(60)
    assert call(swarm, "POST", f"/lease/{blocker['lease_id']}/release", {}, c)[0] == 200  # room to drain into
    _wait_for(lambda: info["session"].position >= len(prompt) + 3, 60, "the session to be generating")
    victim = _proc(swarm, info["server"])
    victim.popen.send_signal(signal.SIGINT)
    code = victim.popen.wait(90)
    gen.join(120)
    log = victim.log_path.read_text(errors="replace")
    assert code == 0 and ABORT not in log, (code, log[-2000:])
    assert "draining" in log
    assert _servers(swarm)[info["server"]]["dead_reason"].startswith(DRAINED_REASON)
    assert result.get("tokens") == reference(prompt, 60)
    _wait_for(lambda: not group_members(victim.pgid), 30, "the server's children gone")


def test_a_second_ctrl_c_cuts_the_drain_short(swarm: LocalSwarm) -> None:
    plan = ServerPlan("s3", "3MB")
    proc = swarm.start_server(plan)
    swarm.wait_ready([p.name for p in swarm.plans if _proc(swarm, p.name).popen.poll() is None] + ["s3"], 180)
    c = TOKENS["client"]
    health = swarm.get("/health")
    held = []
    for _ in range(health["capacity"]):  # every slot held: the drain has nowhere to move s3's session
        status, lease, _ = call(swarm, "POST", "/lease", {"timeout_s": 30}, c)
        assert status == 200
        held.append(lease)
    assert any(h["server"] == "s3" for x in held for h in x["spans"])
    try:
        os.killpg(proc.pgid, signal.SIGINT)  # Ctrl-C reaches the whole process group
        _wait_for(lambda: "draining" in proc.log_path.read_text(errors="replace"), 30, "the drain to start")
        t0 = time.monotonic()
        os.killpg(proc.pgid, signal.SIGINT)
        code = proc.popen.wait(30)
        took = time.monotonic() - t0
    finally:
        for lease in held:
            call(swarm, "POST", f"/lease/{lease['lease_id']}/release", {}, c)
    log = proc.log_path.read_text(errors="replace")
    assert code == 0 and ABORT not in log, (code, log[-2000:])
    assert took < 20.0, took  # not the drain's 60 s
    rec = _servers(swarm)["s3"]
    assert not rec["alive"] and rec["dead_reason"].startswith("left"), rec
    _wait_for(lambda: not group_members(proc.pgid), 30, "the server's children gone")
