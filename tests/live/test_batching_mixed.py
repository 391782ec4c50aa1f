"""Everything at once on batching servers: sessions joining and leaving at random steps, speculative decoding with
rollbacks, a KV migration of a live session and a server killed mid-generation, in one run on one swarm, under a
tokens-per-step budget (16) that the longer prompts and every failover replay exceed, so those prefills run in
chunks beside the other sessions' steps.

The swarm: the tiny random LLaMA of tests/live/test_swarm.py (4 blocks; its checkpoint and local greedy reference
are reused) on five batching servers (the default; each writes its ``--step-log``) composed, as in
tests/live/test_failover.py, into three chains: ``[w]`` (all blocks) and two of two hops (two blocks per server),
of C = 4 slots each, so several sessions share a chain and its servers batch their steps. One client process, its
sessions in threads:

* ``g0`` … ``g4``: greedy sessions with prompts of different (seeded random) lengths and numbers of new tokens;
  ``g0`` is the pacer, the others open once ``g0`` has written their (seeded random) number of tokens, so they
  join running batches with a prefill and leave them at different steps;
* ``mig``: a greedy session that, after a few tokens and while the others run, takes a lease on another chain and
  moves there by KV transfer (``kv_migrate.migrate_leased``, as tests/live/test_kv_migrate.py), then goes on;
* ``spec``: speculative decoding (width 4) through a leased session, opened once the migration is done; its
  drafter proposes a seeded random number of correct tokens followed by a wrong one, so drafts are both kept and
  rejected and every server of its chain rolls its cache back, inside batches shared with the greedy sessions;
* failover: once ``spec`` has written some tokens, the last server of its chain is SIGKILLed with its whole process
  group (as tests/live/test_failover.py); the sessions on that chain (``spec`` always, greedy ones as JFFC placed
  them) report it, take replacement leases on the two surviving chains (8 slots: room for everyone) and replay.

Every session's output must equal local transformers' greedy decoding token for token; the servers' step logs must
show steps of several sessions run as one batch; the orchestrator must mark the victim dead, never over-commit a
chain and end with every slot free.

Model: the tiny LLaMA everywhere, although test_batching.py and test_speculative.py use SmolLM2-135M: one swarm
must serve all four features, failover and KV migration are tested on the tiny model, and five SmolLM2 servers on
two cores would start in minutes, not seconds. The batched step is the same code for both (LLaMA blocks). The
drafts come from the reference output (a seeded number right, then one wrong) rather than prompt lookup, which on
a random model's text would rarely be kept: verification and rollback are what is tested, not the drafter.

What is not mixed, and why: the migration and the kill are sequential (the kill waits until the migration is done
and the speculative session has written some tokens), not simultaneous. A KV migration whose source or target
server dies midway is a different contract (the migration fails, the session stays on its old chain,
tests/live/test_migration*.py; if that chain is the dead one, a failover follows), and racing the two would make
which path runs a matter of timing, so the test could not say what it checks. Both still run while other
sessions generate on the same servers (asserted for the migration), and the kill hits the speculative session
mid-generation. Since ``spec`` opens on the fastest chain with a free slot, the victim is in practice ``w``.
"""

from __future__ import annotations

import csv
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from petals_chain.loopback.swarm import LocalSwarm, ServerPlan, group_members
from tests.live import test_swarm
from tests.live.test_failover import _ChainWatch
from tests.live.test_swarm import _chains, _full_capacity, _wait_for

pytestmark = pytest.mark.live

tiny_dir = test_swarm.tiny_dir
reference = test_swarm.reference

SEED = 22
VOCAB = 512  # write_tiny_llama's
MAX_LENGTH = 256
SESSION_LENGTH = 128
C = 4  # slots per chain: several sessions per chain, so the servers batch
WIDTH = 4  # the speculative session's width
MAX_BATCH_TOKENS = 16  # below the longest prompts and every failover replay: those prefills run in chunks
PACER_TOKENS = 64  # g0's new tokens; the other greedy sessions join at steps of it
MIGRATE_AFTER, MIGRATE_THEN = 8, 24  # mig's tokens before and after its move
SPEC_TOKENS = 60
KILL_AFTER = 12  # new tokens of the speculative session before its chain's last server is killed
STALL_S = 60  # a wait fails after this long without any session making progress
# test_failover's budgets scaled to c = 4 (c = 2 there): w holds every block with 4 sessions' caches, the others
# half of them: three chains, [w] and two of two hops.
BUDGETS = {"w": "4.6MB", "a1": "2.3MB", "a2": "2.3MB", "b1": "2.3MB", "b2": "2.3MB"}


@dataclass
class Job:
    """One session of the run: what it is, its prompt and new tokens, when it joins, and what happened to it."""

    name: str
    kind: str  # "greedy", "migrate" or "spec"
    prompt: list[int]
    new_tokens: int
    join_at: int = 0  # g0's new tokens before this session opens
    session: Any = None
    tokens: list[int] | None = None
    error: BaseException | None = None
    done_s: float | None = None  # when its last token came back
    record: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def written(self) -> int:
        """New tokens this session holds in the servers' caches so far (0 before it opens)."""
        s = self.session
        return max(0, s.position - len(self.prompt)) if s is not None else 0


def _jobs() -> list[Job]:
    """The seeded plan: five greedy sessions of different prompt lengths, joining and leaving at different steps,
    the migrating one and the speculative one."""
    rng = random.Random(SEED)

    def prompt() -> list[int]:
        """A prompt of 2 to 24 random tokens after BOS."""
        return [1] + [rng.randrange(3, VOCAB) for _ in range(rng.randint(2, 24))]

    jobs = [Job("g0", "greedy", prompt(), PACER_TOKENS)]
    joins = sorted(rng.sample(range(1, PACER_TOKENS * 2 // 3), 4))
    jobs += [Job(f"g{i}", "greedy", prompt(), rng.randint(10, 40), join_at=j) for i, j in enumerate(joins, 1)]
    jobs.append(Job("mig", "migrate", prompt(), MIGRATE_AFTER + MIGRATE_THEN))
    jobs.append(Job("spec", "spec", prompt(), SPEC_TOKENS))
    assert len({len(j.prompt) for j in jobs}) >= 5, "prompts of different lengths"
    return jobs


@pytest.fixture(scope="module")
def mixed_swarm(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Orchestrator + w (0:4) and a1, a2, b1, b2 (two blocks each), c = 4, each server logging its batches; the
    leasing client; the step logs by server name."""
    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.client.model import close_client

    log_dir = tmp_path_factory.mktemp("mixed-logs")
    steps = {name: log_dir / f"{name}-steps.csv" for name in BUDGETS}
    plans = [ServerPlan(name, budget, ("--step-log", str(steps[name]), "--max-batch-tokens", str(MAX_BATCH_TOKENS)))
             for name, budget in BUDGETS.items()]
    with LocalSwarm(tiny_dir, plans, log_dir=log_dir, model_name="tiny-mixed", max_length=MAX_LENGTH,
                    arrival_rate=15.0, c=C, lease_ttl_s=20.0, heartbeat_timeout_s=15.0) as sw:
        sw.start(timeout_s=240)
        model = AutoDistributedModelForCausalLM.from_pretrained(str(tiny_dir), orchestrator=sw.url,
                                                               lease_timeout_s=120.0, lease_ttl_s=20.0)
        try:
            yield sw, model, steps
        finally:
            close_client(model)
    assert all(not group_members(pg) for pg in sw.started_pgids)


def _step_rows(path: Path) -> list[tuple[int, int]]:
    """(sessions, tokens) of every batch a server's ``--step-log`` recorded."""
    if not path.is_file():
        return []
    with path.open() as f:
        return [(int(r["sessions"]), int(r["tokens"])) for r in csv.DictReader(f)]


def _oracle_drafter(truth: list[int], rng: random.Random) -> Callable[[list[int], int], list[int]]:
    """Drafts of a seeded random number of correct next tokens (from ``truth``, the reference output) and then one
    wrong token: some drafts are kept, the first wrong one and everything after it rolled back."""

    def draft(tokens: list[int], count: int) -> list[int]:
        """Up to ``count`` drafted tokens after ``tokens``."""
        if list(tokens) != truth[:len(tokens)]:
            return []  # the output already differs: the final comparison says so
        right = truth[len(tokens):len(tokens) + count]
        keep = rng.randint(0, len(right))
        return right[:keep] + [(t + 1) % VOCAB for t in right[keep:keep + 1]]

    return draft


def test_mixed_sessions_speculation_migration_and_failover_on_batching_servers(mixed_swarm, reference) -> None:
    """All at once on one swarm of batching servers; see the module docstring. Every session writes local greedy
    decoding's tokens; drafts were kept and rejected; the migration moved the session by KV transfer to another
    chain; the sessions on the killed server's chain failed over to surviving chains; steps of several sessions ran
    as one batch; the orchestrator marks the victim dead, never over-commits and ends with every slot free."""
    from petals_chain.client.kv_migrate import hops_of, migrate_leased
    from petals_chain.client.speculative import open_speculative_session, speculative_generate

    sw, model, steps = mixed_swarm
    chains = _chains(sw)
    assert len(chains) == 3 and all(c["capacity"] == C for c in chains), chains
    assert sorted(len(c["spans"]) for c in chains) == [1, 2, 2], chains
    capacity = sum(c["capacity"] for c in chains)
    jobs = _jobs()
    by_name = {j.name: j for j in jobs}
    expected = {j.name: reference(j.prompt, j.new_tokens) for j in jobs}  # computed before the swarm gets busy
    migrated, failed = threading.Event(), threading.Event()

    def progress() -> tuple[int, ...]:
        """Every session's tokens so far: waits time out only while none of them moves."""
        return tuple(j.written for j in jobs)

    def generate(session: Any, prompt: list[int] | None, new_tokens: int) -> list[int]:
        """Greedy tokens through ``session`` (prompt None: continue it; then only the new tokens come back)."""
        inputs = None if prompt is None else torch.tensor([prompt])
        return model.generate(inputs, max_new_tokens=new_tokens, do_sample=False, session=session)[0].tolist()

    def run_greedy(job: Job) -> None:
        """Open once the pacer has written ``join_at`` tokens, generate, leave."""
        if job.join_at:
            _wait_for(lambda: failed.is_set() or by_name["g0"].written >= job.join_at, STALL_S,
                      f"{job.name}'s turn to join", period_s=0.005, progress=progress)
            if failed.is_set():
                return
        with model.inference_session(max_length=SESSION_LENGTH) as s:
            job.session = s
            job.tokens = generate(s, job.prompt, job.new_tokens)
            job.done_s = time.monotonic()
        job.record = s.record

    def run_migrate(job: Job) -> None:
        """A few tokens, then a lease on another chain (leases JFFC grants on its own chain are held meanwhile and
        given back) and the move there by KV transfer, while the others run; then the rest of its tokens."""
        with model.inference_session(max_length=SESSION_LENGTH) as s:
            job.session = s
            tokens = generate(s, job.prompt, MIGRATE_AFTER)
            source, held, target = s.lease.chain_id, [], None
            try:
                for _ in range(C):  # at most C - 1 more leases fit on the source chain
                    lease = model.orchestrator.run(lambda c: c.lease(timeout_s=60.0, ttl_s=20.0, client="mix-move"),
                                                   timeout_s=120.0)
                    if lease.chain_id != source:
                        target = lease
                        break
                    held.append(lease)
            finally:
                for lease in held:
                    model.orchestrator.run(lambda c, lid=lease.lease_id: c.release(lid), timeout_s=60.0)
            assert target is not None, f"no lease on a chain other than {source}"
            job.extra["alongside"] = {j.name for j in jobs if j is not job and j.session is not None
                                      and j.done_s is None}
            rec = migrate_leased(s, target, "kv")
            job.extra.update(migration=rec, source=source, target=target.chain_id, lease=s.lease.chain_id,
                             hops=hops_of(s), target_peers=tuple(h.peer_id for h in target.spans))
            migrated.set()
            tokens += generate(s, None, MIGRATE_THEN)  # continuing returns the new tokens only
            job.tokens = tokens
            job.done_s = time.monotonic()
        job.record = s.record

    def run_spec(job: Job) -> None:
        """Once the migration is done: speculative decoding at width WIDTH with the half-right drafter."""
        _wait_for(lambda: failed.is_set() or migrated.is_set(), STALL_S, "the migration", period_s=0.005,
                  progress=progress)
        if failed.is_set():
            return
        session = open_speculative_session(model, max_length=len(job.prompt) + job.new_tokens + WIDTH + 1)
        job.session = session
        try:
            job.tokens, job.extra["stats"] = speculative_generate(
                model, session, job.prompt, job.new_tokens, WIDTH,
                drafter=_oracle_drafter(expected[job.name], random.Random(SEED + 1)))
            job.done_s = time.monotonic()
        finally:
            session.close()
        job.record = session.record

    def guarded(job: Job) -> None:
        """Run the job; a failure is kept and stops the sessions still waiting to join."""
        try:
            {"greedy": run_greedy, "migrate": run_migrate, "spec": run_spec}[job.kind](job)
        except BaseException as exc:  # reported by the test
            job.error = exc
            failed.set()

    started_s = time.monotonic()
    watch = _ChainWatch(sw)
    threads = [threading.Thread(target=guarded, args=(j,), daemon=True, name=j.name) for j in jobs]
    for t in threads:
        t.start()
    spec = by_name["spec"]
    try:
        # -- the kill: once spec writes, its chain's last server dies with its whole process group --
        _wait_for(lambda: failed.is_set() or spec.done_s is not None or spec.written >= KILL_AFTER, STALL_S,
                  f"spec to write {KILL_AFTER} tokens", period_s=0.002, progress=progress)
        assert not failed.is_set(), [(j.name, j.error) for j in jobs if j.error]
        assert spec.done_s is None, "spec finished before the kill"
        victim_name = spec.session.lease.spans[-1].server
        victim = next(p for p in sw.procs if p.name == victim_name)
        running = [j for j in jobs if j.session is not None and j.done_s is None]
        on_victim = {j.name for j in running if victim_name in {h.server for h in j.session.lease.spans}}
        elsewhere = {j.name for j in running} - on_victim
        # A step may be in flight at the kill; with two or more steps left, one is sent to the dead server for sure
        # (a speculative step writes several tokens: spec is far from its end, checked above).
        must_fail = {j.name for j in running
                     if j.name in on_victim and (j.kind == "spec" or j.written <= j.new_tokens - 3)}
        killed_s = time.monotonic()
        os.killpg(victim.pgid, signal.SIGKILL)
        for t in threads:
            _wait_for(lambda t=t: not t.is_alive(), STALL_S, f"session {t.name} to end", period_s=0.05,
                      progress=progress)
    finally:
        failed.set()  # sessions still waiting to join give up
        watch.stop()
    elapsed_s = time.monotonic() - started_s

    # -- users: every session wrote local greedy decoding's tokens --
    assert not any(j.error for j in jobs), [(j.name, repr(j.error)) for j in jobs if j.error]
    for j in jobs:
        assert j.tokens == expected[j.name], (j.name, j.tokens, expected[j.name])

    # -- speculation: drafts kept and rejected, so the servers rolled back --
    stats = spec.extra["stats"]
    assert 0 < stats.accepted < stats.drafted, (stats.accepted, stats.drafted)
    assert stats.steps < 1 + SPEC_TOKENS  # kept drafts saved steps

    # -- migration: by KV transfer, onto another chain, at the position it had, holding the new lease --
    mig = by_name["mig"]
    rec = mig.extra["migration"]
    assert mig.extra["target"] != mig.extra["source"] and mig.extra["lease"] == mig.extra["target"]
    assert rec.mode == "kv" and rec.position == len(mig.prompt) + MIGRATE_AFTER - 1, rec
    assert tuple(h[0] for h in rec.new) == mig.extra["target_peers"] == tuple(h[0] for h in mig.extra["hops"])
    assert not {h[0] for h in rec.old} & {h[0] for h in rec.new}  # every block's cache went to another server
    assert mig.extra["alongside"], "no other session ran during the migration"

    # -- failover: the sessions on the victim's chain moved off it (each one with steps left to send after the kill
    #    had to); every failover names the victim; the sessions on the other chains were not disturbed --
    assert "spec" in must_fail
    for j in jobs:
        fails = j.record.failovers
        assert all(f.server == victim_name and f.action == "reported" for f in fails), (j.name, fails)
        if j.name in must_fail:
            assert fails and victim_name not in {s for s, _, _ in j.record.spans}, (j.name, fails, j.record.spans)
        elif j.name in elsewhere:
            assert fails == [], (j.name, fails)
    rec_victim = next(r for r in sw.get("/servers")["servers"] if r["name"] == victim_name)
    assert rec_victim["alive"] is False, rec_victim
    assert watch.polls > 0 and not watch.overcommitted, watch.overcommitted[:3]
    _wait_for(lambda: _full_capacity(sw), 30, "every lease released")
    chains_after = _chains(sw)
    assert all(victim_name not in {h["server"] for h in c["spans"]} for c in chains_after), chains_after
    assert sum(c["capacity"] for c in chains_after) < capacity

    # -- batching: steps of several sessions ran as one batch --
    rows = {name: _step_rows(path) for name, path in steps.items()}
    largest = {name: max((s for s, _ in r), default=0) for name, r in rows.items()}
    assert max(largest.values()) >= 2, largest
    mixed = sum(1 for r in rows.values() for s, t in r if s >= 2 and t > s)
    assert mixed >= 1, rows  # a prefill or a speculative verification shared a step with other sessions
    # -- chunked prefill: steps longer than the budget (prompts, replays) ran in chunks within it --
    assert max(len(j.prompt) for j in jobs) > MAX_BATCH_TOKENS
    assert max(t for r in rows.values() for _, t in r) <= MAX_BATCH_TOKENS, rows
    resumed = [f.recovered_s - killed_s for f in spec.record.failovers if f.recovered_s is not None]
    print(f"\n[mixed] {elapsed_s:.1f} s; killed {victim_name} with {sorted(on_victim)} on it (spec resumed "
          f"{min(resumed, default=float('nan')):.2f} s after the kill); failovers: "
          f"{ {j.name: len(j.record.failovers) for j in jobs if j.record.failovers} }; migration "
          f"{mig.extra['source']} -> {mig.extra['target']} ({rec.position} tokens, {rec.seconds * 1000:.0f} ms, "
          f"{sorted(mig.extra['alongside'])} running); "
          f"spec kept {stats.accepted}/{stats.drafted} drafts in {stats.steps} steps; largest batch per server "
          f"{largest}; batches of >= 2 sessions with a multi-token step: {mixed}")
