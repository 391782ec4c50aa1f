"""Live session migration between chains by KV transfer (and token replay), on a real orchestrated swarm.

The swarm of tests/live/test_swarm.py (tiny random LLaMA, 4 blocks): ``s1`` holds blocks 0:4, ``s2`` 0:2 and
``s3`` 2:4. A petals client generates greedily, its session moves s1 → s2+s3 (each new server imports part of
s1's cache) and back (s1 imports from two old servers), and the tokens must equal local greedy decoding's. A
migration that fails midway must leave the session on its old chain, still exact; the old servers' caches must
be free within a second (read from the servers' own accounting, petals' rpc_info).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from petals_chain.loopback.swarm import LocalSwarm
from tests.live import test_swarm
from tests.live.test_swarm import _wait_for

pytestmark = pytest.mark.live

tiny_dir = test_swarm.tiny_dir
reference = test_swarm.reference
PROMPT = [1, 5, 17, 42, 99, 3]
STEP_TOKENS = 6
FREE_WITHIN_S = 1.0


@pytest.fixture(scope="module")
def kv_swarm(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Orchestrator + s1 (0:4), s2 (0:2), s3 (2:4); the servers' peer ids by name."""
    sw = LocalSwarm(tiny_dir, test_swarm.SERVERS, log_dir=tmp_path_factory.mktemp("kv-logs"), model_name="tiny-kv",
                    max_length=test_swarm.MAX_LENGTH, arrival_rate=4.0, c=1, lease_ttl_s=20.0,
                    heartbeat_timeout_s=15.0)
    try:
        sw.start(timeout_s=240)
        yield sw
    finally:
        sw.stop()


@pytest.fixture(scope="module")
def plain_client(kv_swarm: LocalSwarm, tiny_dir: Path):
    """A plain petals client on the swarm's DHT (routes are given explicitly, no lease)."""
    import petals

    dht = kv_swarm.get("/health")["dht"]
    model = petals.AutoDistributedModelForCausalLM.from_pretrained(
        str(tiny_dir), initial_peers=dht["initial_peers"], dht_prefix=dht["dht_prefix"])
    yield model
    model.transformer.h.sequence_manager.shutdown()


def _hops(sw: LocalSwarm) -> dict[str, object]:
    """Hop per role, from the orchestrator's record of what each server serves: "whole" (0:4), "first" (0:2) and
    "second" (2:4), whichever of s2 and s3 got which half."""
    from petals_chain.protocol.hop import Hop

    def served() -> list | None:
        """The three hops once every server serves its assignment of the expected composition, else None."""
        found = []
        for r in sw.get("/servers")["servers"]:
            a = r["assignment"]
            if r["alive"] and a and a["num_blocks"] > 0 and r["serving"] == {"start": a["start"], "end": a["end"]}:
                found.append(Hop(r["name"], a["start"], a["end"], r["peer_id"]))
        found.sort(key=lambda h: (h.start, -h.end))
        return found if [(h.start, h.end) for h in found] == [(0, 4), (0, 2), (2, 4)] else None

    # a busy machine may miss a heartbeat and recompose for a while: wait for the composition to come back
    found = _wait_for(served, 120, "the composition [0:4] + [0:2, 2:4]", period_s=0.5)
    return dict(zip(("whole", "first", "second"), found))


def _generate(model, session, prompt, new_tokens: int) -> list[int]:
    """Greedy tokens through the session (prompt None: continue it)."""
    import torch

    inputs = None if prompt is None else torch.tensor([prompt])
    return model.generate(inputs, max_new_tokens=new_tokens, do_sample=False, session=session)[0].tolist()


def _wait_freed(session, peer_id: str, baseline: int) -> float:
    """Seconds until ``peer_id`` reports ``baseline`` cache tokens free again (polled every 10 ms)."""
    from petals_chain.client.kv_migrate import cache_tokens_left

    t0 = time.monotonic()
    _wait_for(lambda: cache_tokens_left(session, peer_id) == baseline, 10, f"{peer_id}'s cache to be free",
              period_s=0.01)
    return time.monotonic() - t0


def test_kv_transfer_round_trip_across_span_cuts_is_token_identical(kv_swarm: LocalSwarm, plain_client,
                                                                    reference) -> None:
    """s1[0:4] → s2[0:2] + s3[2:4] → s1[0:4] by KV transfer, then → s2 + s3 by token replay: every token equals
    local greedy decoding's; after each migration the old servers' caches are free within a second."""
    from petals_chain.client.kv_migrate import cache_tokens_left, migrate, open_route

    hops = _hops(kv_swarm)
    chain_a, chain_b = [hops["whole"]], [hops["first"], hops["second"]]
    full = {n: cache_tokens_left(plain_client.transformer.h.sequence_manager, h.peer_id) for n, h in hops.items()}
    with plain_client.inference_session(max_length=64) as sess:
        open_route(sess, chain_a)
        tokens = _generate(plain_client, sess, PROMPT, STEP_TOKENS)
        assert cache_tokens_left(sess, hops["whole"].peer_id) < full["whole"]  # the session's cache is held there
        freed = []
        for target, mode, left in ((chain_b, "kv", ["whole"]), (chain_a, "kv", ["first", "second"]),
                                   (chain_b, "replay", ["whole"])):
            position = sess.position
            rec = migrate(sess, target, mode)
            assert rec.position == position and [h[0] for h in rec.new] == [h.peer_id for h in target]
            freed += [_wait_freed(sess, hops[n].peer_id, full[n]) for n in left]
            tokens += _generate(plain_client, sess, None, STEP_TOKENS)  # continuing returns the new tokens only
        assert tokens == reference(PROMPT, 4 * STEP_TOKENS)
    print(f"\n[kv] old caches free {max(freed) * 1000:.0f} ms after the migration returned (worst)")
    assert max(freed) < FREE_WITHIN_S


def test_migration_failing_midway_leaves_the_session_on_its_old_chain(kv_swarm: LocalSwarm, plain_client,
                                                                      reference) -> None:
    """A new chain whose second hop names a server that does not hold those blocks: the first hop's import
    succeeds, then the second fails; MigrationError, the first hop's new cache is freed, and the session goes on
    on its old chain with the exact tokens."""
    from petals_chain.client.kv_migrate import MigrationError, cache_tokens_left, hops_of, migrate, open_route
    from petals_chain.protocol.hop import Hop

    hops = _hops(kv_swarm)
    s2 = hops["first"]
    bad = [s2, Hop("wrong", hops["second"].start, hops["second"].end, s2.peer_id)]  # it serves 0:2 only
    full_s2 = cache_tokens_left(plain_client.transformer.h.sequence_manager, s2.peer_id)
    with plain_client.inference_session(max_length=64) as sess:
        open_route(sess, [hops["whole"]])
        tokens = _generate(plain_client, sess, PROMPT, STEP_TOKENS)
        before = hops_of(sess)
        with pytest.raises(MigrationError, match="stays on its old chain"):
            migrate(sess, bad, "kv")
        assert hops_of(sess) == before
        _wait_freed(sess, s2.peer_id, full_s2)
        tokens += _generate(plain_client, sess, None, STEP_TOKENS)
        with pytest.raises(ValueError, match="cover blocks"):
            migrate(sess, [hops["first"]], "kv")  # bad input: the hops leave blocks 2:4 uncovered
        with pytest.raises(ValueError, match="mode"):
            migrate(sess, [hops["whole"]], "teleport")
    assert tokens == reference(PROMPT, 2 * STEP_TOKENS)


def test_leased_session_moves_to_the_other_chain_and_holds_its_lease(kv_swarm: LocalSwarm, tiny_dir: Path,
                                                                     reference) -> None:
    """An orchestrated (leased) session on the one-server chain takes a lease on the other chain, moves there by KV
    transfer and holds that lease: the orchestrator sees the first chain free and the second busy; the tokens stay
    exact, and closing the session frees every slot."""
    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.client.kv_migrate import migrate_leased

    model = AutoDistributedModelForCausalLM.from_pretrained(str(tiny_dir), orchestrator=kv_swarm.url,
                                                           lease_timeout_s=60.0, lease_ttl_s=20.0)
    try:
        with model.inference_session(max_length=64) as sess:
            tokens = _generate(model, sess, PROMPT, STEP_TOKENS)
            first = sess.lease.chain_id
            other = model.orchestrator.run(lambda c: c.lease(timeout_s=30.0, ttl_s=20.0), timeout_s=60.0)
            assert other.chain_id != first
            rec = migrate_leased(sess, other, "kv")
            assert rec.position == len(PROMPT) + STEP_TOKENS - 1
            assert sess.lease.lease_id == other.lease_id
            busy = {c["chain_id"]: c["busy"] for c in kv_swarm.get("/chains")["chains"]}
            assert busy[first] == 0 and busy[other.chain_id] == 1, busy
            tokens += _generate(model, sess, None, STEP_TOKENS)
        assert tokens == reference(PROMPT, 2 * STEP_TOKENS)
        assert _wait_for(lambda: test_swarm._full_capacity(kv_swarm), 10, "every slot free again")
    finally:
        model.orchestrator.close()


def test_kv_transfer_onto_a_chain_sharing_the_servers_reads_the_cache_in_place(kv_swarm: LocalSwarm, plain_client,
                                                                              reference) -> None:
    """s2[0:2] + s3[2:4] → s2 + s3 again by KV transfer (a move between chains that share servers): each new
    session takes its cache from the old session on its own server; tokens unchanged, old caches freed."""
    from petals_chain.client.kv_migrate import cache_tokens_left, migrate, open_route

    hops = _hops(kv_swarm)
    chain_b = [hops["first"], hops["second"]]
    with plain_client.inference_session(max_length=64) as sess:
        open_route(sess, chain_b)
        tokens = _generate(plain_client, sess, PROMPT, STEP_TOKENS)
        held = {n: cache_tokens_left(sess, hops[n].peer_id) for n in ("first", "second")}  # one session's cache
        old_ids = [s.session_id for s in sess._server_sessions]
        rec = migrate(sess, chain_b, "kv")
        assert rec.position == len(PROMPT) + STEP_TOKENS - 1 and rec.new == rec.old
        assert all(s.session_id not in old_ids for s in sess._server_sessions)  # new server sessions
        for n in ("first", "second"):  # one session's cache each again, not two: the old one was freed
            _wait_for(lambda n=n: cache_tokens_left(sess, hops[n].peer_id) == held[n], 10,
                      f"{n}'s old cache to be freed", period_s=0.01)
        tokens += _generate(plain_client, sess, None, STEP_TOKENS)
    assert tokens == reference(PROMPT, 2 * STEP_TOKENS)
