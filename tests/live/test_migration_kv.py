"""Orchestrator-driven moves by KV transfer on a SmolLM2 swarm (issue 9): the orchestrator decides, the leased
session moves at a step boundary by the mode the adaptive division picks (KV transfer for SmolLM2 with the default
options), and its output stays local greedy decoding's, token for token.

Three SmolLM2-135M servers under an orchestrator with ``--migration jffc`` and c = 1 (experiments/mell_live.py's plans):
``whole`` holds all 30 blocks (the fast chain), ``first`` and ``second`` half each (the slow chain), so a move
between the chains takes each new span's cache from servers that cut the blocks elsewhere. In order:

1. A JFFC move onto the frozen ``whole`` server: the KV import fails, the switch rolls back, the session finishes on
   its old chain, correct, and /metrics counts a rolled-back (jffc, kv) move.
2. A drain of ``second`` while a session generates through it: the session moves to ``whole`` by KV transfer, the
   old chain's caches are free while it still runs, /metrics counts a committed (drain, kv) move with its time, and
   ``second`` leaves as drained.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from petals_chain.experiments.common import REPO
from petals_chain.loopback.swarm import LocalSwarm
from petals_chain.protocol.blocking import request_json
from petals_chain.protocol.messages import DRAINED_REASON
from tests.live.test_migration import _fast_and_slow, _Generation, _idle, _metric, _servers
from tests.live.test_swarm import _wait_for

pytestmark = pytest.mark.live

SMOLLM2 = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
MAX_LENGTH = 256
NEW_TOKENS = 40
TEXT = "The three primary colours are"
WAIT_S = 600  # a step of three CPU servers on a shared, loaded machine


@pytest.fixture(scope="module")
def kswarm(tmp_path_factory: pytest.TempPathFactory):
    """Orchestrator (JFFC with migration) + whole (0:30), first and second (15 blocks each), c = 1."""
    if not (SMOLLM2 / "model.safetensors").is_file():
        pytest.fail(f"{SMOLLM2} is missing: run scripts/prepare_model.sh")
    from petals_chain.experiments.mell_live import server_plans
    from petals_chain.checkpoint.sizing import block_sizes

    plans = server_plans(block_sizes(SMOLLM2, "float32", MAX_LENGTH))
    sw = LocalSwarm(SMOLLM2, plans, log_dir=tmp_path_factory.mktemp("kv-move-logs"), model_name="smollm2-kv",
                    max_length=MAX_LENGTH, arrival_rate=4.0, c=1, lease_ttl_s=60.0, heartbeat_timeout_s=60.0,
                    orchestrator_extra=("--migration", "jffc"))
    try:
        sw.start(timeout_s=WAIT_S)
        yield sw
    finally:
        assert sw.stop() == []


@pytest.fixture(scope="module")
def kclient(kswarm: LocalSwarm):
    """The leasing client with the default move options (the faster mode)."""
    from petals_chain import AutoDistributedModelForCausalLM

    model = AutoDistributedModelForCausalLM.from_pretrained(str(SMOLLM2), orchestrator=kswarm.url,
                                                           lease_timeout_s=WAIT_S, lease_ttl_s=60.0)
    yield model
    model.orchestrator.close()


@pytest.fixture(scope="module")
def prompt_and_reference() -> tuple[list[int], list[int]]:
    """The prompt's ids and local greedy decoding's continuation (transformers, float32)."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    ids = AutoTokenizer.from_pretrained(str(SMOLLM2))(TEXT)["input_ids"]
    local = LlamaForCausalLM.from_pretrained(str(SMOLLM2), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        out = local.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return ids, out[0].tolist()


def _gen(model, prompt: list[int], hold: threading.Event | None = None) -> _Generation:
    """A greedy generation in a thread (see tests/live/test_migration.py)."""
    return _Generation(model, hold, prompt=prompt, new_tokens=NEW_TOKENS, max_length=MAX_LENGTH)


def test_a_kv_move_onto_a_frozen_server_rolls_back(kswarm: LocalSwarm, kclient, prompt_and_reference) -> None:
    """The fast chain's server is frozen when the session is offered a JFFC move there: the KV import fails, the
    session finishes on its old chain with greedy decoding's tokens, the orchestrator counts one rolled-back (jffc,
    kv) move and no slot stays reserved."""
    prompt, reference = prompt_and_reference
    fast, slow = _fast_and_slow(kswarm)
    assert _servers(fast) == ("whole",) and len(_servers(slow)) == 2
    holder = request_json(kswarm.url + "/lease", data={"timeout_s": 60.0, "client": "holder"})
    assert holder["chain_id"] == fast["chain_id"]
    victim = next(p for p in kswarm.procs if p.name == "whole")
    rolled = _metric(kswarm, "petals_chain_migrations_rolled_back_total", reason="jffc", mode="kv")
    gen = _gen(kclient, prompt)
    try:
        gen.wait_generating(2)
        os.killpg(victim.pgid, signal.SIGSTOP)
        request_json(kswarm.url + f"/lease/{holder['lease_id']}/release", data={})
        _wait_for(lambda: _metric(kswarm, "petals_chain_migrations_rolled_back_total", reason="jffc", mode="kv")
                  > rolled or gen.tokens is not None or gen.error is not None, WAIT_S, "the failed move")
    finally:
        os.killpg(victim.pgid, signal.SIGCONT)
    gen.join(WAIT_S)
    assert gen.tokens == reference
    moves = gen.record.migrations
    assert len(moves) == 1 and moves[0].mode == "kv" and moves[0].error is not None and moves[0].done_s is None
    assert gen.record.chain_id == slow["chain_id"]
    assert _metric(kswarm, "petals_chain_migrations_rolled_back_total", reason="jffc", mode="kv") == rolled + 1
    assert _metric(kswarm, "petals_chain_migration_slots_reserved") == 0
    _wait_for(lambda: _idle(kswarm), 120, "every slot free again")


def test_a_drain_moves_the_session_by_kv_transfer(kswarm: LocalSwarm, kclient, prompt_and_reference) -> None:
    """POST /servers/second/drain while a session generates on first+second (whole held by a bare lease, migration
    policy off): the drain queues the session, the held lease is released, the session moves to whole by KV transfer
    (whole's one span takes its cache from two servers); first's cache is free within a second while the session
    still runs on whole; tokens equal local greedy decoding's; /metrics counts a committed (drain, kv) move with its
    time and no reserved slot; second is recorded as drained."""
    from petals_chain.client.kv_migrate import cache_tokens_left

    prompt, reference = prompt_and_reference
    kswarm.wait_ready(["whole", "first", "second"], timeout_s=WAIT_S)
    assert request_json(kswarm.url + "/migrations", data={"policy": "none"})["policy"] == "none"
    fast, slow = _fast_and_slow(kswarm)
    peers = {r["name"]: r["peer_id"] for r in kswarm.get("/servers")["servers"]}
    manager = kclient.transformer.h.sequence_manager
    full_first = cache_tokens_left(manager, peers["first"])
    committed = _metric(kswarm, "petals_chain_migrations_committed_total", reason="drain", mode="kv")
    timed = _metric(kswarm, "petals_chain_migration_seconds_count", mode="kv")
    holder = request_json(kswarm.url + "/lease", data={"timeout_s": 60.0, "client": "holder"})
    assert holder["chain_id"] == fast["chain_id"]
    hold = threading.Event()
    gen = _gen(kclient, prompt, hold)
    try:
        gen.wait_generating(2)
        assert _servers(slow) == tuple(h.server for h in gen.session.lease.spans)
        assert cache_tokens_left(manager, peers["first"]) < full_first  # the session's cache is held there
        status = request_json(kswarm.url + "/servers/second/drain", data={})
        assert status["draining"] and status["sessions"] == 1, status
        request_json(kswarm.url + f"/lease/{holder['lease_id']}/release", data={})
        moves = gen.session.record.migrations
        _wait_for(lambda: gen.error is not None or (moves and moves[0].done_s is not None), WAIT_S, "the KV move")
        assert gen.error is None, gen.error
        _wait_for(lambda: cache_tokens_left(manager, peers["first"]) == full_first, 10, "first's cache to be free",
                  period_s=0.01)
        freed_s = time.monotonic() - moves[0].done_s
        assert gen.closed_s is None  # freed by the move: the session is still open on whole
    finally:
        hold.set()
    gen.join(WAIT_S)
    assert gen.tokens == reference
    moves = gen.record.migrations
    assert len(moves) == 1 and moves[0].error is None and moves[0].mode == "kv", moves
    assert (moves[0].from_chain, moves[0].to_chain) == (slow["chain_id"], fast["chain_id"])
    assert freed_s < 1.0
    assert _metric(kswarm, "petals_chain_migrations_committed_total", reason="drain", mode="kv") == committed + 1
    assert _metric(kswarm, "petals_chain_migration_seconds_count", mode="kv") == timed + 1
    assert _metric(kswarm, "petals_chain_migration_slots_reserved") == 0
    _wait_for(lambda: next(r for r in kswarm.get("/servers")["servers"] if r["name"] == "second")["dead_reason"]
              == DRAINED_REASON, 120, "second to leave as drained")
    print(f"\n[kv drain] moved {moves[0].tokens} tokens {slow['chain_id']} -> {fast['chain_id']} in "
          f"{moves[0].downtime_s:.3f} s; first's cache free {freed_s * 1000:.0f} ms after the move")
