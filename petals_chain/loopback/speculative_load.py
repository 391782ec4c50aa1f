"""Speculative decoding on a loopback swarm: measure the tokens per second at each width k, then serve Poisson arrivals
whose widths the orchestrator picks in their leases (greedy(p*), fixed 1, fixed max), recording every session
(docs/moldable.md, "Speculative width on the swarm", "Width through the lease API")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from tqdm import tqdm

from petals_chain.client.speculative import open_speculative_session, speculative_generate

# Prompts where looking the next tokens up in the text helps some of the time: copying, lists, code edits.
PROMPTS = (
    "Repeat the sentence exactly. Sentence: the quick brown fox jumps over the lazy dog near the river bank. "
    "Repeated: the quick brown",
    "Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Copy the list: apples, pears, plums, cherries, grapes, lemons. Copy: apples, pears,",
    "Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Monday, Tuesday,",
    "The cat sat on the mat. The dog sat on the log. The bird sat on",
)


@dataclass(frozen=True)
class SessionResult:
    """One session of a load run: when it arrived, its (first) width, wait for its lease, service and response
    times, tokens."""

    policy: str
    load: float
    arrival_s: float
    width: int
    wait_s: float
    service_s: float
    new_tokens: int
    steps: int
    accepted: int
    drafted: int

    @property
    def response_s(self) -> float:
        """Waiting for the lease + service."""
        return self.wait_s + self.service_s

    def row(self) -> dict:
        """A CSV row (with the response time and tokens per second)."""
        return {**asdict(self), "response_s": self.response_s, "tokens_per_s": self.new_tokens / self.service_s}


def one_session(model, tokenizer, prompt: str, new_tokens: int, width: int, rtt_s: float):
    """One speculative generation at a fixed width on a fresh leased session; its stats."""
    ids = tokenizer(prompt)["input_ids"]
    session = open_speculative_session(model, max_length=len(ids) + new_tokens + width + 1, emulated_rtt_s=rtt_s)
    try:
        _, stats = speculative_generate(model, session, ids, new_tokens, width, eos_token_id=tokenizer.eos_token_id)
    finally:
        session.close()
    return stats


def measure_speedup(model, tokenizer, widths: Sequence[int], new_tokens: int, rtt_s: float, repeats: int = 1,
                    prompts: Sequence[str] = PROMPTS) -> list[dict]:
    """Tokens per second of a lone session at each width (every prompt ``repeats`` times, widths interleaved so
    that a busy machine hurts all of them alike); one row per width."""
    samples: dict[int, list] = {k: [] for k in widths}
    one_session(model, tokenizer, prompts[0], 4, 1, rtt_s)  # warm up: connections, caches
    order = [(r, p, k) for r in range(repeats) for p in prompts for k in widths]
    for _, prompt, k in tqdm(order, desc="s(k) calibration", leave=False):
        samples[k].append(one_session(model, tokenizer, prompt, new_tokens, k, rtt_s))
    rows = []
    for k in widths:
        st = samples[k]
        tokens, elapsed = sum(s.new_tokens for s in st), sum(s.elapsed_s for s in st)
        steps = sum(s.steps for s in st)
        rows.append({"width": k, "sessions": len(st), "tokens_per_s": tokens / elapsed,
                     "tokens_per_step": tokens / steps, "service_s": elapsed / len(st),
                     "accept_rate": sum(s.accepted for s in st) / max(1, sum(s.drafted for s in st))})
    return rows


def serve_load(model, tokenizer, policy: str, load: float, arrival_rate_per_s: float, window_s: float,
               new_tokens: int, rng: np.random.Generator, prompts: Sequence[str] = PROMPTS,
               clock: Callable[[], float] = time.monotonic) -> list[SessionResult]:
    """Poisson arrivals for ``window_s`` seconds, each a thread that leases a session (waiting in the orchestrator's
    queue), decodes with ``model.generate()`` at the width the lease says and closes it; ``model`` must be loaded
    with ``speculative_k_max`` from an orchestrator choosing widths by ``policy`` (POST /width). Returns every
    session once all have finished."""
    results: list[SessionResult] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    t0 = clock()
    k_max = model.transformer.h.sequence_manager.options.k_max

    def session(arrived: float, prompt: str) -> None:
        """Lease (the width comes with it), generate, release."""
        try:
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            s = model.transformer.h.open_session(ids.shape[1] + new_tokens + k_max + 1)
            started = clock()
            try:
                model.generate(ids, max_new_tokens=new_tokens, do_sample=False, session=s,
                               eos_token_id=tokenizer.eos_token_id)
            finally:
                s.close()
                done = clock()
            st = s.stats
            with lock:
                results.append(SessionResult(policy, load, arrived - t0, st.width, started - arrived, done - started,
                                             st.new_tokens, st.steps, st.accepted, st.drafted))
        except BaseException as exc:  # reported after the run
            errors.append(exc)

    threads = []
    t_next = t0 + rng.exponential(1.0 / arrival_rate_per_s)
    while t_next < t0 + window_s:
        time.sleep(max(0.0, t_next - clock()))
        th = threading.Thread(target=session, args=(t_next, prompts[int(rng.integers(len(prompts)))]), daemon=True)
        th.start()
        threads.append(th)
        t_next += rng.exponential(1.0 / arrival_rate_per_s)
    for th in threads:
        th.join(900)
    if errors:
        raise RuntimeError(f"{len(errors)} of {len(threads)} sessions failed; first: {errors[0]!r}") from errors[0]
    return sorted(results, key=lambda r: r.arrival_s)
