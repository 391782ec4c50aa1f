"""Failover on real processes: a server killed mid-generation is invisible to users (issue 4).

Two swarms of the tiny random LLaMA that tests/test_swarm.py builds (its fixtures are reused):

* orchestrated: orchestrator + DHT + four servers composed into three chains (two one-hop, one two-hop);
  as many concurrent generations as there are slots, then one server of the two-hop chain is killed
  (its whole process group, SIGKILL). Every request must finish with exactly local greedy decoding's
  tokens; the orchestrator must mark the server dead, drop its chains and recompose; no slot may be
  over-committed or leaked; the killed server then rejoins and capacity is what it was.
* plain petals (patches/0002 alone, no orchestrator): two servers for blocks 0:2, two for 2:4. One
  session loses its first-hop server (SIGKILL) and then its last-hop server (SIGSTOP, a hang); the
  tokens stay identical; the dead peer leaves the routing table at once; a failed connection is
  charged to the server it was for.

Recovery times are printed (``pytest -s``); they are measurements, not assertions.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

import torch

from tests.patches import test_patches  # noqa: E402
from tests.live import test_swarm  # noqa: E402
from tests.live.test_swarm import _chains, _counters, _wait_for  # noqa: E402

from petals_chain.loopback.swarm import LocalSwarm, ServerPlan, SwarmProcess, group_members  # noqa: E402

# Fixtures shared with the swarm and patch tests: the tiny checkpoint, local greedy decoding, a site-packages copy.
tiny_dir = test_swarm.tiny_dir
reference = test_swarm.reference
site_copy = test_patches.site_copy

ROOT = Path(__file__).resolve().parents[2]
PATCH_0001 = ROOT / "patches" / "0001-petals-hivemind-1.1.12-imports.diff"
PATCH_0002 = ROOT / "patches" / "0002-petals-failover-587.diff"
MAX_LENGTH = 256
SESSION_LENGTH = MAX_LENGTH
NEW_TOKENS = 200  # long enough that the other chains are still full when the dead chain's requests need a slot
# Budgets that make GBP-CR (c = 2, λ = 15/s) compose three chains of two slots each: [f1], [f4] and a two-hop one.
ORCH_SERVERS = [ServerPlan("f1", "3.6MB"), ServerPlan("f2", "1.8MB"), ServerPlan("f3", "1.8MB"),
                ServerPlan("f4", "3.6MB")]


def _prompt(i: int) -> list[int]:
    """A distinct short prompt per request."""
    return [1, 7 + 11 * i, 40 + i, 99, 3 + i]


def _failed_leases(swarm: LocalSwarm) -> float:
    """petals_chain_leases_failed_total from the orchestrator's Prometheus text."""
    import urllib.request

    with urllib.request.urlopen(swarm.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("petals_chain_leases_failed_total "))
    return float(line.split()[1])


class _ChainWatch:
    """Polls GET /chains in the background and remembers any chain holding more leases than its capacity."""

    def __init__(self, swarm: LocalSwarm) -> None:
        self.swarm = swarm
        self.overcommitted: list[dict] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """Poll every 50 ms until stopped."""
        while not self._stop.wait(0.05):
            try:
                chains = _chains(self.swarm)
            except OSError:
                continue
            self.polls += 1
            self.overcommitted += [c for c in chains if c["busy"] > c["capacity"]]

    def stop(self) -> None:
        """Stop polling."""
        self._stop.set()
        self._thread.join(5)


# ---- orchestrated swarm ----------------------------------------------------------------------------------------


@pytest.mark.live
def test_killed_chain_server_is_invisible_to_users(tiny_dir: Path, reference, tmp_path: Path) -> None:
    """Every slot busy, then a server of the two-hop chain is SIGKILLed with its whole process group: each request
    completes with local greedy decoding's tokens (the ones on the dead chain after reporting it, taking a
    replacement lease and replaying their history); the orchestrator marks it dead, drops its chains and
    recomposes; no chain is ever over-committed, no lease is leaked; after the server rejoins, capacity is back."""
    from petals_chain import AutoDistributedModelForCausalLM

    with LocalSwarm(tiny_dir, ORCH_SERVERS, log_dir=tmp_path / "logs", model_name="tiny-llama", max_length=MAX_LENGTH,
                    arrival_rate=15.0, c=2, lease_ttl_s=20.0, heartbeat_timeout_s=15.0) as sw:
        sw.start(timeout_s=240)
        chains = _chains(sw)
        capacity = sum(c["capacity"] for c in chains)
        two_hop = [c for c in chains if len(c["spans"]) >= 2]
        assert two_hop and capacity >= 4, f"the fixture should compose several chains, one with two hops: {chains}"
        victim_name = two_hop[0]["spans"][-1]["server"]
        victim = next(p for p in sw.procs if p.name == victim_name)
        health_before, counters_before, failed_before = sw.get("/health"), _counters(sw), _failed_leases(sw)
        model = AutoDistributedModelForCausalLM.from_pretrained(str(tiny_dir), orchestrator=sw.url,
                                                               lease_timeout_s=120.0, lease_ttl_s=20.0)
        n = capacity  # every slot busy: JFFC puts some requests on the two-hop chain
        sessions: dict[int, object] = {}
        results: dict[int, list[int]] = {}
        records: dict[int, object] = {}
        errors: list[BaseException] = []

        def one(i: int) -> None:
            """One user: a leased session generating NEW_TOKENS greedily."""
            try:
                with model.inference_session(max_length=SESSION_LENGTH) as s:
                    sessions[i] = s
                    out = model.generate(torch.tensor([_prompt(i)]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                         session=s)
                    results[i] = out[0].tolist()
                records[i] = s.record
            except BaseException as exc:  # collected and reported below
                errors.append(exc)

        try:
            watch = _ChainWatch(sw)
            threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
            for t in threads:
                t.start()
            # Follows the swarm, not the clock: the wait fails only after 60 s in which no session started or
            # advanced (or at once if a user already failed), however slowly a busy machine decodes.
            _wait_for(lambda: errors or (len(sessions) == n and all(s.position >= len(_prompt(i)) + 6
                                                                    for i, s in sessions.items())),
                      60, "every request to be generating", period_s=0.005,
                      progress=lambda: (len(sessions), sum(s.position for s in list(sessions.values()))))
            assert not errors, errors[:3]
            on_victim = sorted(i for i, s in sessions.items() if victim_name in {h.server for h in s.lease.spans})
            assert on_victim, f"no request runs through {victim_name}"
            assert all(s.position < len(_prompt(i)) + NEW_TOKENS for i, s in sessions.items()), "some finished early"
            killed_s = time.monotonic()
            os.killpg(victim.pgid, signal.SIGKILL)
            for t in threads:
                t.join(120)
            watch.stop()
        finally:
            model.orchestrator.close()

        # -- users: nothing visible but a short stall --
        assert not errors, errors[:3]
        assert sorted(results) == list(range(n))
        for i in range(n):
            assert results[i] == reference(_prompt(i), NEW_TOKENS), f"request {i} (on victim: {i in on_victim})"
        print(f"\n[failover] killed {victim_name} (pgid {victim.pgid}) with {len(on_victim)}/{n} requests on it")
        reported = 0
        for i in range(n):
            fails = records[i].failovers
            if i not in on_victim:
                assert fails == [], f"request {i} did not run through {victim_name} but failed over: {fails}"
                continue
            assert fails and fails[0].server == victim_name and fails[0].action == "reported", fails
            assert victim_name not in {s for s, _, _ in records[i].spans}  # it finished on a chain without it
            reported += sum(f.action == "reported" for f in fails)
            f = fails[0]
            print(f"[failover] request {i}: {f.from_chain} -> {f.to_chain}; failure seen "
                  f"{f.detected_s - killed_s:.2f} s after the kill ({f.cause[:60]}); replacement lease (queued "
                  f"{f.queue_waited_s:.2f} s) + replay of {f.replayed_tokens} tokens {f.recovery_s:.2f} s; resumed "
                  f"{f.recovered_s - killed_s:.2f} s after the kill")

        # -- orchestrator: dead server, chains dropped, recomposed, nothing leaked or over-committed --
        assert watch.polls > 0 and not watch.overcommitted, watch.overcommitted[:3]
        rec = next(r for r in sw.get("/servers")["servers"] if r["name"] == victim_name)
        assert rec["alive"] is False and rec["dead_reason"].startswith("failure reported by lease"), rec
        chains_after = _chains(sw)
        assert chains_after and all(victim_name not in {h["server"] for h in c["spans"]} for c in chains_after)
        health = sw.get("/health")
        assert health["version"] > health_before["version"]
        assert health["servers_alive"] == health_before["servers_alive"] - 1
        assert health["capacity"] == sum(c["capacity"] for c in chains_after) < capacity
        assert health["free"] == health["capacity"] and health["active_leases"] == 0 and health["queue_length"] == 0
        counters = _counters(sw)
        granted = counters["granted"] - counters_before["granted"]
        failed = _failed_leases(sw) - failed_before
        assert granted == n + reported and failed == reported
        assert counters["released"] - counters_before["released"] == n
        assert counters["expired"] == counters_before["expired"]  # every lease given back, none left to expire

        # -- the killed server rejoins: the composition and its capacity are back --
        assert not group_members(victim.pgid)
        sw.procs.remove(victim)  # done with (its group stays on the final orphan check); the same name starts again
        sw.start_server(next(p for p in ORCH_SERVERS if p.name == victim_name))
        sw.wait_ready([p.name for p in ORCH_SERVERS], timeout_s=120)
        _wait_for(lambda: sw.get("/health")["capacity"] == capacity, 30, "capacity back to its value before the kill")
        assert any(victim_name in {h["server"] for h in c["spans"]} for c in _chains(sw))
        assert sw.get("/health")["free"] == capacity
        assert sw.stop() == []


# ---- plain petals with patches/0002 --------------------------------------------------------------------------

PLAIN_PREFIX = "tiny-failover"
PLAIN_SERVERS = {"A": "0:2", "B": "0:2", "C": "2:4", "D": "2:4"}
STEP_TIMEOUT_S = 4.0
MADDR_RE = re.compile(r"(/ip4/127\.0\.0\.1/tcp/\d+/p2p/\w+)")


def _start_plain_swarm(sw: LocalSwarm, model_dir: Path, tmp_path: Path) -> str:
    """A petals DHT and the PLAIN_SERVERS (petals' own CLI, fixed spans), each in its own process group; the DHT's
    multiaddr."""
    dht = sw._spawn("dht", ["-m", "petals.cli.run_dht", "--host_maddrs", "/ip4/127.0.0.1/tcp/0",
                            "--identity_path", str(tmp_path / "dht.id")])
    maddr = _wait_for(lambda: MADDR_RE.search(dht.log_path.read_text(errors="replace")), 60, "the DHT's address")[1]
    for name, blocks in PLAIN_SERVERS.items():
        sw._spawn(name, ["-m", "petals.cli.run_server", str(model_dir), "--dht_prefix", PLAIN_PREFIX,
                         "--initial_peers", maddr, "--host_maddrs", "/ip4/127.0.0.1/tcp/0", "--block_indices", blocks,
                         "--device", "cpu", "--torch_dtype", "float32", "--throughput", "1", "--num_handlers", "1",
                         "--attn_cache_tokens", "2048", "--public_name", name])
    return maddr


def _online_peers(manager) -> dict[str, object] | None:
    """public_name -> PeerID once every plain server announces all its blocks as online, else None."""
    from petals.data_structures import ServerState
    from petals.utils.dht import get_remote_module_infos

    infos = get_remote_module_infos(manager.dht, manager.block_uids, latest=True)
    peers: dict[str, object] = {}
    for name, blocks in PLAIN_SERVERS.items():
        start, end = map(int, blocks.split(":"))
        found = {p for i in infos[start:end] for p, s in i.servers.items()
                 if s.public_name == name and s.state == ServerState.ONLINE}
        if len(found) != 1:
            return None
        peers[name] = found.pop()
    return peers


def _generate_through(model, session, prompt: list[int] | None, new_tokens: int, at_position: int,
                      action) -> tuple[list[int], float]:
    """Generate in a thread; when the session reaches ``at_position`` call ``action()``; return the new tokens and
    the longest time after the action during which the session made no progress (the recovery)."""
    out: dict[str, object] = {}

    def run() -> None:
        """The generation (its exception, if any, is kept)."""
        try:
            inputs = None if prompt is None else torch.tensor([prompt])
            out["tokens"] = model.generate(inputs, max_new_tokens=new_tokens, do_sample=False,
                                           session=session)[0].tolist()
        except BaseException as exc:
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    _wait_for(lambda: session.position >= at_position or not thread.is_alive(), 60, f"position {at_position}",
              period_s=0.002)
    assert thread.is_alive(), f"generation ended before position {at_position}: {out}"
    action()
    last_s, pos, longest = time.monotonic(), session.position, 0.0
    while thread.is_alive():
        time.sleep(0.002)
        now = time.monotonic()
        if session.position != pos:
            longest, last_s, pos = max(longest, now - last_s), now, session.position
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["tokens"], longest


def _group_of(sw: LocalSwarm, name: str) -> SwarmProcess:
    """The started process named ``name``."""
    return next(p for p in sw.procs if p.name == name)


@pytest.mark.live
def test_patched_petals_survives_server_death_and_hang_token_identical(tiny_dir: Path, reference,
                                                                         tmp_path: Path) -> None:
    """patches/0002 alone, with petals' own routing: SIGKILL of the first-hop server mid-generation (noticed by the
    connection check; the replacement replays the history, the healthy last hop takes only the new tokens), then
    SIGSTOP of the last-hop server (noticed by inference_step_timeout): the tokens equal local greedy decoding's.
    The dead peer is out of the routing table at once, and a failed connection is charged to its server."""
    import petals

    with LocalSwarm(tiny_dir, [], log_dir=tmp_path / "logs", model_name=PLAIN_PREFIX, max_length=MAX_LENGTH) as sw:
        maddr = _start_plain_swarm(sw, tiny_dir, tmp_path)
        model = petals.AutoDistributedModelForCausalLM.from_pretrained(
            str(tiny_dir), initial_peers=[maddr], dht_prefix=PLAIN_PREFIX, inference_step_timeout=STEP_TIMEOUT_S,
            max_retries=4)
        manager = model.transformer.h.sequence_manager
        peers = _wait_for(lambda: _online_peers(manager), 180, "all four plain servers online", period_s=0.5)
        names = {p: n for n, p in peers.items()}
        prompt = _prompt(0)
        frozen: SwarmProcess | None = None
        try:
            with model.inference_session(max_length=SESSION_LENGTH) as sess:
                # 1) the first hop dies mid-generation
                killed: list[str] = []

                def kill_first_hop() -> None:
                    """SIGKILL the process group of the server holding blocks 0:2 for this session."""
                    killed.append(names[sess._server_sessions[0].span.peer_id])
                    os.killpg(_group_of(sw, killed[0]).pgid, signal.SIGKILL)

                tokens, stall_kill_s = _generate_through(model, sess, prompt, NEW_TOKENS, len(prompt) + 8,
                                                         kill_first_hop)
                assert tokens == reference(prompt, NEW_TOKENS)
                dead = peers[killed[0]]
                survivor = "B" if killed[0] == "A" else "A"
                assert names[sess._server_sessions[0].span.peer_id] == survivor
                table = manager.state.sequence_info.spans_containing_block
                assert all(span.peer_id != dead for spans in table for span in spans), "dead peer still routed"
                assert dead in manager.state.banned_peers

                # 2) the last hop hangs (stopped, still connected): only the step timeout can tell
                def freeze_last_hop() -> None:
                    """SIGSTOP the process group of the server holding blocks 2:4 for this session."""
                    nonlocal frozen
                    frozen = _group_of(sw, names[sess._server_sessions[-1].span.peer_id])
                    os.killpg(frozen.pgid, signal.SIGSTOP)

                more = 24
                tokens2, stall_hang_s = _generate_through(model, sess, None, more, sess.position + 5, freeze_last_hop)
                assert tokens2 == reference(prompt, NEW_TOKENS + more)[len(prompt) + NEW_TOKENS:]
                assert names[sess._server_sessions[-1].span.peer_id] != frozen.name
            os.killpg(frozen.pgid, signal.SIGCONT)
            print(f"\n[plain failover] SIGKILL of {killed[0]}: longest stall {stall_kill_s:.2f} s; SIGSTOP of "
                  f"{frozen.name}: longest stall {stall_hang_s:.2f} s (inference_step_timeout={STEP_TIMEOUT_S:g} s)")

            # 3) a client that can only reach the dead server for blocks 0:2 charges the failed connection to it
            fresh = petals.AutoDistributedModelForCausalLM.from_pretrained(
                str(tiny_dir), initial_peers=[maddr], dht_prefix=PLAIN_PREFIX, max_retries=1,
                allowed_servers=[dead.to_base58(), peers["C"].to_base58(), peers["D"].to_base58()])
            fresh_manager = fresh.transformer.h.sequence_manager
            fresh_manager.state.rpc_info = manager.state.rpc_info  # not fetched from (maybe) the dead server
            try:
                with pytest.raises(Exception):
                    fresh.generate(torch.tensor([prompt]), max_new_tokens=1, do_sample=False)
                assert dead in fresh_manager.state.banned_peers
            finally:
                fresh_manager.shutdown()
        finally:
            if frozen is not None:
                os.killpg(frozen.pgid, signal.SIGCONT)
            manager.shutdown()
        assert sw.stop() == []


# ---- the patch file ------------------------------------------------------------------------------------------


def test_failover_patch_is_installed_and_applies_after_0001(site_copy: Path) -> None:
    """The venv's petals carries patches/0002; on pristine petals 2.2.0.post1 files, 0001 then 0002 apply and give
    exactly the installed files; a second application is a no-op."""
    ap = test_patches._applier()
    assert ap.apply_patch(site_copy, PATCH_0002, check_only=False) == "already applied"
    files = {fp.path for patch in (PATCH_0001, PATCH_0002) for fp in ap.parse(patch.read_text())}
    installed = {p: (site_copy / p).read_text() for p in files}
    for patch in (PATCH_0002, PATCH_0001):  # undo both, newest first: the pristine sources
        for fp in ap.parse(patch.read_text()):
            (site_copy / fp.path).write_text("".join(ap.plan_file(site_copy, fp, reverse=True)))
    assert "end_position" not in (site_copy / "petals/client/inference_session.py").read_text()
    assert ap.apply_patch(site_copy, PATCH_0001, check_only=False) == "applied"
    assert ap.apply_patch(site_copy, PATCH_0002, check_only=False) == "applied"
    assert {p: (site_copy / p).read_text() for p in files} == installed
    assert ap.apply_patch(site_copy, PATCH_0002, check_only=False) == "already applied"
    shutil.rmtree(site_copy / "petals")


def test_bad_failover_options_are_clear_errors() -> None:
    """LeaseOptions names the bad failover field."""
    from petals_chain.model import SpecError
    from petals_chain.client.lease import LeaseOptions

    with pytest.raises(SpecError, match="'max_failovers' must be an integer >= 0"):
        LeaseOptions(max_failovers=-1)
    with pytest.raises(SpecError, match="'max_failovers'"):
        LeaseOptions(max_failovers=2.5)
    with pytest.raises(SpecError, match="'reload_wait_s' must be > 0 seconds"):
        LeaseOptions(reload_wait_s=0)
    assert LeaseOptions(max_failovers=0).max_failovers == 0
