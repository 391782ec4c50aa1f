"""Cross-session batching on a real swarm: SmolLM2-135M over two orchestrated servers that batch their sessions'
steps (the default), 1, 2, 4 and 8 concurrent greedy sessions of different prompt lengths and lengths of output.
The first server keeps its caches as a GPU server does by default (``--kv-arena on``: rows of one arena per block;
``--batch-attention gathered``: decode batches attend over the arena in place), the second as a CPU server does.

Sessions open one after the other (each as soon as the previous one holds its lease) and stop after different
numbers of tokens, so they join running batches with a prefill and leave them at different steps. Every
session's output must equal local transformers' greedy output token for token; the servers' logs must show that
steps of several sessions really ran as one batch.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
import torch

from petals_chain.loopback.swarm import LocalSwarm, ServerPlan, group_members
from petals_chain.server.batching import BATCH_LOG_PREFIX
from petals_chain.server.kv_arena import ARENA_LOG_PREFIX

REPO = Path(__file__).resolve().parents[2]
SMOLLM2 = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"
TEXTS = [
    "The capital of France is",
    "Count: 1, 2, 3, 4, 5,",
    "Write one sentence about the sea.",
    "Q: What is two plus two? A:",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "Paris, Berlin, Madrid, Rome,",
    "Once upon a time, in a small village near the mountains, there lived an old baker who",
    "def add(a, b):",
]
NEW_TOKENS = [9, 5, 12, 7, 10, 4, 11, 6]  # sessions leave at different steps
MAX_SESSIONS = 8


@pytest.fixture(scope="module")
def swarm_model(tmp_path_factory: pytest.TempPathFactory):
    """Orchestrator + two batching servers of SmolLM2 (15 blocks each, room for 8 sessions: c = 8) and the client."""
    if not (SMOLLM2 / "model.safetensors").is_file():
        pytest.fail(f"{SMOLLM2} is missing: run scripts/prepare_model.sh")
    from petals_chain import AutoDistributedModelForCausalLM
    from petals_chain.client.model import close_client

    # a: the layout a GPU server gets by default (its caches rows of one arena per block, decode batches attending
    # over them in place); b: this machine's default (each session's own tensors, attention per session)
    plans = [ServerPlan("a", "300MB", ("--kv-arena", "on", "--batch-attention", "gathered")), ServerPlan("b", "300MB")]
    with LocalSwarm(SMOLLM2, plans, log_dir=tmp_path_factory.mktemp("batch-logs"), model_name="SmolLM2-135M-Instruct",
                    max_length=256, arrival_rate=0.2, c=MAX_SESSIONS) as sw:
        sw.start(timeout_s=360)
        model = AutoDistributedModelForCausalLM.from_pretrained(str(SMOLLM2), orchestrator=sw.url,
                                                               lease_timeout_s=300.0)
        try:
            yield sw, model
        finally:
            close_client(model)
    assert all(not group_members(pg) for pg in sw.started_pgids)


@pytest.fixture(scope="module")
def cases():
    """Per session: its prompt's token ids and local transformers' greedy output (prompt + new tokens)."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(SMOLLM2))
    local = LlamaForCausalLM.from_pretrained(str(SMOLLM2)).eval()
    out = []
    with torch.no_grad():
        for text, n in zip(TEXTS, NEW_TOKENS):
            ids = tok(text, return_tensors="pt")["input_ids"]
            out.append((ids, local.generate(ids, max_new_tokens=n, do_sample=False)[0].tolist()))
    assert len({ids.shape[1] for ids, _ in out}) >= 5, "prompts of different lengths"
    return out


def _largest_batch(sw: LocalSwarm) -> int:
    """The most sessions any server logged for one batched step (1 if none logged more)."""
    most, pattern = 1, re.compile(re.escape(BATCH_LOG_PREFIX) + r" (\d+) sessions")
    for proc in sw.procs:
        for m in pattern.finditer(proc.log_path.read_text(errors="replace")):
            most = max(most, int(m.group(1)))
    return most


def _run_concurrent(model, cases, n: int) -> list[list[int]]:
    """``n`` sessions, each opened once the previous one holds its lease, generating concurrently; their outputs."""
    results: list[list[int] | None] = [None] * n
    errors: list[BaseException] = []
    leased = [threading.Event() for _ in range(n)]

    def one(i: int) -> None:
        """Session i: wait for session i-1's lease, open its own, generate greedily."""
        try:
            if i > 0 and not leased[i - 1].wait(300):
                raise TimeoutError(f"session {i - 1} never got a lease")
            ids, _ = cases[i]
            with model.inference_session(max_length=128) as s:
                leased[i].set()
                out = model.generate(ids, max_new_tokens=NEW_TOKENS[i], do_sample=False, session=s)
            results[i] = out[0].tolist()
        except BaseException as exc:  # reported by the test
            errors.append(exc)
            leased[i].set()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors[:3]
    return results  # type: ignore[return-value]


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_concurrent_sessions_equal_local_greedy(swarm_model, cases, n: int) -> None:
    """1, 2, 4 and 8 concurrent sessions on batching servers: each writes exactly local transformers' tokens."""
    sw, model = swarm_model
    chains = sw.get("/chains")["chains"]
    assert sum(c["capacity"] for c in chains) >= MAX_SESSIONS, chains  # all sessions served at once
    got = _run_concurrent(model, cases, n)
    for i in range(n):
        assert got[i] == cases[i][1], (i, got[i], cases[i][1])


def test_steps_of_several_sessions_ran_as_one_batch(swarm_model, cases) -> None:
    """The servers run with batching on by default, and steps of several sessions ran together (their logs say how
    many at most); this code is the worktree's (the log line exists only here)."""
    sw, model = swarm_model
    for proc in sw.procs:
        if proc.name in ("a", "b"):
            text = proc.log_path.read_text(errors="replace")
            assert "sessions run together" in text, proc.log_tail()
            assert (ARENA_LOG_PREFIX in text) == (proc.name == "a"), proc.log_tail()  # only a keeps arenas
    if _largest_batch(sw) < 2:  # run on its own, this test makes its own concurrency
        _run_concurrent(model, cases, 4)
    assert _largest_batch(sw) >= 2, [p.log_tail() for p in sw.procs]
