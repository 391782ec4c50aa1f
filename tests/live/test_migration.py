"""Live session migration on a real swarm (issue 9): a running session moves between chains at a step boundary and
its output stays local greedy decoding's, token for token.

One swarm of the tiny random LLaMA (tests/live/test_swarm.py's checkpoint and servers: s1 holds every block, s2 and
s3 two each; c = 1, so two chains of one slot) under an orchestrator with ``--migration jffc``. One client whose
moves go by token replay (its link budget is 0), one with the default division (the faster mode: KV transfer here).
In order:

1. JFFC with migration: the fast chain is held by a bare lease, a session generates on the slow one; the lease is
   released, the orchestrator reserves the fast slot for the session, which moves there by token replay.
2. A move that fails midway (the fast chain's server is frozen when the session replays onto it) leaves the session
   on its old chain, correct; the orchestrator is told and drops the reservation.
3. The same JFFC move by KV transfer: the old chain's servers' caches are free while the session still runs on the
   new chain, and /metrics counts it (committed, jffc, kv) with the time the client reported.
4. A KV transfer onto a frozen server fails and rolls back: the session finishes on its old chain, correct; /metrics
   counts it rolled back (jffc, kv).
5. Drain by SIGTERM: a session generates on the two-hop chain, its last server gets SIGTERM, the session moves to
   s1 by KV transfer, the server leaves and is recorded as drained; no recomposition happens before the move.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch

from petals_chain.loopback.swarm import LocalSwarm
from petals_chain.protocol.blocking import request_json  # noqa: E402
from petals_chain.protocol.messages import DRAINED_REASON  # noqa: E402
from tests.live import test_swarm  # noqa: E402
from tests.live.test_failover import _ChainWatch  # noqa: E402
from tests.live.test_swarm import _chains, _wait_for  # noqa: E402

tiny_dir = test_swarm.tiny_dir
reference = test_swarm.reference
MAX_LENGTH = 256
NEW_TOKENS = 160
PROMPT = [1, 5, 17, 42, 99, 3]


class MigratingSwarm(LocalSwarm):
    """The loopback swarm with the orchestrator moving sessions by JFFC with migration."""

    def orchestrator_args(self) -> list[str]:
        """LocalSwarm's arguments plus ``--migration jffc``."""
        return [*super().orchestrator_args(), "--migration", "jffc"]


@pytest.fixture(scope="module")
def mswarm(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Orchestrator (JFFC with migration) + s1 (all blocks) + s2, s3 (two blocks each), c = 1: two chains."""
    sw = MigratingSwarm(tiny_dir, test_swarm.SERVERS, log_dir=tmp_path_factory.mktemp("migration-logs"),
                        model_name="tiny-llama", max_length=MAX_LENGTH, arrival_rate=4.0, c=1, lease_ttl_s=20.0,
                        heartbeat_timeout_s=15.0, orchestrator_args=("--method", "max-chains"))  # two chains always
    try:
        sw.start(timeout_s=240)
        yield sw
    finally:
        assert sw.stop() == []


def _client(sw: LocalSwarm, tiny_dir: Path, **lease_options):
    """A leasing PETALS client."""
    from petals_chain import AutoDistributedModelForCausalLM

    return AutoDistributedModelForCausalLM.from_pretrained(str(tiny_dir), orchestrator=sw.url, lease_timeout_s=120.0,
                                                          lease_ttl_s=20.0, lease_options=lease_options)


@pytest.fixture(scope="module")
def mclient(mswarm: LocalSwarm, tiny_dir: Path):
    """The leasing PETALS client whose moves go by token replay (no link budget for KV transfer)."""
    model = _client(mswarm, tiny_dir, move_link_bytes=0.0)
    yield model
    model.orchestrator.close()


@pytest.fixture(scope="module")
def kvclient(mswarm: LocalSwarm, tiny_dir: Path):
    """The leasing PETALS client with the default division: the faster mode, KV transfer for this model."""
    model = _client(mswarm, tiny_dir)
    yield model
    model.orchestrator.close()


def _metric(sw: LocalSwarm, sample: str, **labels: str) -> float:
    """One sample of the orchestrator's GET /metrics (0 when absent), by prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(sw.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found = [s.value for f in text_string_to_metric_families(text) for s in f.samples
             if s.name == sample and s.labels == labels]
    return found[0] if found else 0.0


def _fast_and_slow(sw: LocalSwarm) -> tuple[dict, dict]:
    """The two chains, fastest first (JFFC order by service time)."""
    chains = sorted(_chains(sw), key=lambda c: c["service_time_s"])
    assert len(chains) == 2 and chains[0]["service_time_s"] < chains[1]["service_time_s"], chains
    return chains[0], chains[1]


def _servers(chain: dict) -> tuple[str, ...]:
    """Server names of a /chains entry."""
    return tuple(h["server"] for h in chain["spans"])


class _Generation:
    """One leased session generating NEW_TOKENS greedily in a thread; ``session`` once it has a lease."""

    def __init__(self, model, hold: threading.Event | None = None, prompt: list[int] = PROMPT,
                 new_tokens: int = NEW_TOKENS, max_length: int = MAX_LENGTH) -> None:
        self.model = model
        self.hold = hold  # when given: the session stays open after generating until it is set
        self.prompt, self.new_tokens, self.max_length = prompt, new_tokens, max_length
        self.closed_s: float | None = None
        self.session = None
        self.tokens: list[int] | None = None
        self.record = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        """The generation; its exception, if any, is kept."""
        try:
            with self.model.inference_session(max_length=self.max_length) as s:
                self.session = s
                out = self.model.generate(torch.tensor([self.prompt]), max_new_tokens=self.new_tokens,
                                          do_sample=False, session=s)
                self.tokens = out[0].tolist()
                if self.hold is not None:
                    self.hold.wait(180)
                self.closed_s = time.monotonic()
            self.record = s.record
        except BaseException as exc:
            self.error = exc

    def wait_generating(self, tokens: int = 4) -> None:
        """Until the session stepped a few tokens (it holds its lease and server sessions)."""
        _wait_for(lambda: self.error is not None or (self.session is not None
                                                     and self.session.position >= len(self.prompt) + tokens), 300,
                  "the session to be generating", period_s=0.005)
        assert self.error is None, self.error
        assert self.session.position < len(self.prompt) + self.new_tokens, "generation ended before the test acted"

    def join(self, timeout_s: float = 180.0) -> None:
        """Wait for the end; re-raise its error."""
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "generation did not end"
        if self.error is not None:
            raise self.error


def _idle(sw: LocalSwarm) -> bool:
    """No lease, nobody waiting, every slot free."""
    h = sw.get("/health")
    return h["active_leases"] == 0 and h["queue_length"] == 0 and h["free"] == h["capacity"] > 0


def test_jffc_moves_the_slow_chains_session_to_a_freed_fast_slot(mswarm: LocalSwarm, mclient, reference) -> None:
    """A bare lease holds the fast chain; a session generates on the slow one; releasing the lease reserves the fast
    slot for it and it moves there by token replay at a step boundary: greedy output unchanged, one completed move
    recorded by client and orchestrator, no chain ever over capacity, every slot free at the end."""
    fast, slow = _fast_and_slow(mswarm)
    holder = request_json(mswarm.url + "/lease", data={"timeout_s": 30.0, "client": "holder"})
    assert holder["chain_id"] == fast["chain_id"]
    before = mswarm.get("/migrations")
    watch = _ChainWatch(mswarm)
    gen = _Generation(mclient)
    try:
        gen.wait_generating()
        assert _servers(slow) == tuple(h.server for h in gen.session.lease.spans)
        request_json(mswarm.url + f"/lease/{holder['lease_id']}/release", data={})
        gen.join()
    finally:
        watch.stop()
    assert gen.tokens == reference(PROMPT, NEW_TOKENS)
    moves = gen.record.migrations
    assert len(moves) == 1 and moves[0].error is None and moves[0].mode == "token", moves
    assert (moves[0].from_chain, moves[0].to_chain) == (slow["chain_id"], fast["chain_id"])
    assert moves[0].tokens >= len(PROMPT) + 4 and gen.record.chain_id == fast["chain_id"]
    after = mswarm.get("/migrations")
    assert after["completed"] - before["completed"] == 1 and after["pending"] == []
    assert watch.polls > 0 and not watch.overcommitted, watch.overcommitted[:3]
    _wait_for(lambda: _idle(mswarm), 30, "every slot free again")
    print(f"\n[migration] moved {moves[0].tokens} tokens {slow['chain_id']} -> {fast['chain_id']} in "
          f"{moves[0].downtime_s:.3f} s")



def _generate_while_the_fast_chain_freezes(mswarm: LocalSwarm, client, fast: dict) -> _Generation:
    """A session generates on the slow chain while a bare lease holds the fast one; once it generates, the fast
    chain's server is frozen (SIGSTOP) and the lease released, so the session is offered a move onto a frozen
    server; returns the finished generation once the failed move was reported (the server thawed)."""
    holder = request_json(mswarm.url + "/lease", data={"timeout_s": 30.0, "client": "holder"})
    assert holder["chain_id"] == fast["chain_id"]
    victim = next(p for p in mswarm.procs if p.name == _servers(fast)[0])
    before = mswarm.get("/migrations")
    gen = _Generation(client)
    try:
        gen.wait_generating()
        os.killpg(victim.pgid, signal.SIGSTOP)
        request_json(mswarm.url + f"/lease/{holder['lease_id']}/release", data={})
        _wait_for(lambda: mswarm.get("/migrations")["failed"] > before["failed"] or gen.tokens is not None, 120,
                  "the failed move to be reported")
    finally:
        os.killpg(victim.pgid, signal.SIGCONT)
    gen.join()
    return gen

def test_a_move_onto_a_frozen_chain_fails_and_the_session_stays_correct(mswarm: LocalSwarm, mclient,
                                                                       reference) -> None:
    """The fast chain's only server is frozen (SIGSTOP) when the session is offered a move there: the replay fails,
    the session goes on on its old chain with greedy decoding's tokens, the orchestrator drops the reservation and
    counts a failed move; the server is thawed and serves again."""
    fast, slow = _fast_and_slow(mswarm)
    before = mswarm.get("/migrations")
    gen = _generate_while_the_fast_chain_freezes(mswarm, mclient, fast)
    assert gen.tokens == reference(PROMPT, NEW_TOKENS)
    moves = gen.record.migrations
    assert len(moves) == 1 and moves[0].error is not None and moves[0].done_s is None, moves
    assert gen.record.chain_id == slow["chain_id"]  # it finished where it was
    after = mswarm.get("/migrations")
    assert after["failed"] - before["failed"] == 1 and after["pending"] == []
    _wait_for(lambda: _idle(mswarm), 60, "every slot free again")


def test_a_jffc_move_by_kv_transfer_frees_the_old_cache_and_is_counted(mswarm: LocalSwarm, kvclient,
                                                                       reference) -> None:
    """As the first test with the default division (KV transfer for this model): the session moves by KV transfer,
    its old chain's servers report their cache free again within a second while the session is still open on the
    new chain, the tokens are local greedy decoding's, and /metrics counts one committed (jffc, kv) move with the
    time the client reported and no slot left reserved."""
    from petals_chain.client.kv_migrate import cache_tokens_left

    fast, slow = _fast_and_slow(mswarm)
    peers = {r["name"]: r["peer_id"] for r in mswarm.get("/servers")["servers"]}
    manager = kvclient.transformer.h.sequence_manager
    full = {n: cache_tokens_left(manager, peers[n]) for n in _servers(slow)}
    committed = _metric(mswarm, "petals_chain_migrations_committed_total", reason="jffc", mode="kv")
    timed = _metric(mswarm, "petals_chain_migration_seconds_count", mode="kv")
    holder = request_json(mswarm.url + "/lease", data={"timeout_s": 30.0, "client": "holder"})
    assert holder["chain_id"] == fast["chain_id"]
    hold = threading.Event()
    gen = _Generation(kvclient, hold)
    try:
        gen.wait_generating()
        assert _servers(slow) == tuple(h.server for h in gen.session.lease.spans)
        assert any(cache_tokens_left(manager, peers[n]) < full[n] for n in _servers(slow))  # its cache is there
        request_json(mswarm.url + f"/lease/{holder['lease_id']}/release", data={})
        moves = gen.session.record.migrations
        _wait_for(lambda: gen.error is not None or (moves and moves[0].done_s is not None), 120, "the KV move")
        assert gen.error is None, gen.error
        _wait_for(lambda: all(cache_tokens_left(manager, peers[n]) == full[n] for n in _servers(slow)), 10,
                  "the old chain's caches to be free", period_s=0.01)
        freed_s = time.monotonic() - moves[0].done_s
        assert gen.closed_s is None  # freed by the move: the session is still open on the new chain
    finally:
        hold.set()
    gen.join()
    assert gen.tokens == reference(PROMPT, NEW_TOKENS)
    moves = gen.record.migrations
    assert len(moves) == 1 and moves[0].error is None and moves[0].mode == "kv", moves
    assert (moves[0].from_chain, moves[0].to_chain) == (slow["chain_id"], fast["chain_id"])
    assert freed_s < 1.0
    assert _metric(mswarm, "petals_chain_migrations_committed_total", reason="jffc", mode="kv") == committed + 1
    assert _metric(mswarm, "petals_chain_migration_seconds_count", mode="kv") == timed + 1
    assert _metric(mswarm, "petals_chain_migration_slots_reserved") == 0
    _wait_for(lambda: _idle(mswarm), 30, "every slot free again")
    print(f"\n[migration kv] moved {moves[0].tokens} tokens {slow['chain_id']} -> {fast['chain_id']} in "
          f"{moves[0].downtime_s:.3f} s; old caches free {freed_s * 1000:.0f} ms after the move")


def test_a_kv_transfer_onto_a_frozen_server_rolls_back(mswarm: LocalSwarm, kvclient, reference) -> None:
    """The fast chain's server is frozen when the session is offered a move there by KV transfer: the import fails,
    the switch rolls back, the session finishes on its old chain with greedy decoding's tokens, and /metrics counts
    one rolled-back (jffc, kv) move; the server is thawed and serves again."""
    fast, slow = _fast_and_slow(mswarm)
    rolled = _metric(mswarm, "petals_chain_migrations_rolled_back_total", reason="jffc", mode="kv")
    gen = _generate_while_the_fast_chain_freezes(mswarm, kvclient, fast)
    assert gen.tokens == reference(PROMPT, NEW_TOKENS)
    moves = gen.record.migrations
    assert len(moves) == 1 and moves[0].mode == "kv" and moves[0].error is not None and moves[0].done_s is None
    assert gen.record.chain_id == slow["chain_id"]
    assert _metric(mswarm, "petals_chain_migrations_rolled_back_total", reason="jffc", mode="kv") == rolled + 1
    _wait_for(lambda: _idle(mswarm), 60, "every slot free again")


def test_sigterm_drains_a_server_before_it_leaves(mswarm: LocalSwarm, kvclient, reference) -> None:
    """SIGTERM on the two-hop chain's last server while a session generates through it (the fast chain held by a bare
    lease, migration policy off): the drain queues the session for a slot elsewhere, the held lease is released, the
    session moves to the fast chain by KV transfer (a lease granted under the composition it started on: no
    recomposition before the move), the server ends on its own once it is off, recorded as drained, and only then is
    the swarm recomposed without it; /metrics counts a committed (drain, kv) move."""
    mswarm.wait_ready([p.name for p in test_swarm.SERVERS], timeout_s=120)
    _wait_for(lambda: len(_chains(mswarm)) == 2, 60, "both chains offered again")
    assert request_json(mswarm.url + "/migrations", data={"policy": "none"})["policy"] == "none"
    fast, slow = _fast_and_slow(mswarm)
    version = mswarm.get("/health")["version"]
    holder = request_json(mswarm.url + "/lease", data={"timeout_s": 30.0, "client": "holder"})
    assert holder["chain_id"] == fast["chain_id"]
    victim = next(p for p in mswarm.procs if p.name == _servers(slow)[-1])
    committed = _metric(mswarm, "petals_chain_migrations_committed_total", reason="drain", mode="kv")
    gen = _Generation(kvclient)
    try:
        gen.wait_generating()
        assert _servers(slow) == tuple(h.server for h in gen.session.lease.spans)
        victim.popen.send_signal(signal.SIGTERM)
        _wait_for(lambda: any(m["reason"] == "drain" for m in mswarm.get("/migrations")["pending"]), 60,
                  "the drain to ask a slot for the session")
        assert victim.popen.poll() is None  # it waits for its session to leave
        request_json(mswarm.url + f"/lease/{holder['lease_id']}/release", data={})
        gen.join()
        victim.popen.wait(120)  # it ends on its own once drained (its exit code is shutdown's, not the drain's)
    finally:
        if victim.popen.poll() is None:
            mswarm.stop_process(victim)
    assert gen.tokens == reference(PROMPT, NEW_TOKENS)
    moves = gen.record.migrations
    assert len(moves) == 1 and moves[0].error is None and moves[0].to_chain == fast["chain_id"], moves
    assert moves[0].mode == "kv"
    assert _metric(mswarm, "petals_chain_migrations_committed_total", reason="drain", mode="kv") == committed + 1
    assert gen.record.version == version  # the lease it moved to predates any recomposition
    assert f"drained {victim.name}: " in victim.log_path.read_text(errors="replace"), victim.log_tail()
    rec = next(r for r in mswarm.get("/servers")["servers"] if r["name"] == victim.name)
    assert rec["alive"] is False and rec["dead_reason"] == DRAINED_REASON, rec
    _wait_for(lambda: mswarm.get("/health")["version"] > version, 30, "the recomposition after the drain")
    assert all(victim.name not in _servers(c) for c in _chains(mswarm))
    print(f"\n[drain] {victim.name}: its session moved {moves[0].tokens} tokens in {moves[0].downtime_s:.3f} s")
