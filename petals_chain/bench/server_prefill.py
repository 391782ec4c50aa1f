"""``python -m petals_chain.bench server-prefill``: a long prompt reaching a server whose sessions are decoding, three
ways in the same run: PETALS' pool, our batching pool with PETALS' block-by-block path for the prompt, and our
batching pool with chunked prefill.

In process, as in the server but without RPC: SmolLM2-135M-shaped PETALS blocks with random weights (float32, one
torch thread) behind PETALS' backends, the merged inference pool and a runtime thread. ``b`` sessions with
``--context`` tokens cached decode one token per step, each in its own thread submitting its next step once the
last one is back (as a client does). Once every one of them has run a few steps, one more session sends a prompt
of P tokens. The three servers, with the same weights and inputs:

* ``petals``: PETALS' pool and runtime (one task at a time); the prompt goes block by block, one pool task per
  block, which is what PETALS' ``iterate_rpc_inference`` does with a step over 128 tokens;
* ``per block``: our batching pool and runtime, the prompt still block by block and each block's task whole (the
  batching server before chunked prefill; its token budget raised to the prompt so nothing is cut);
* ``chunked T``: the prompt as one task, which the pool cuts into chunks of T tokens that share steps with the
  decodes (``--prefill-chunk-tokens T``, the default ``--max-batch-tokens``), for each T of ``--chunks``.

Per (b, P) it prints the prompt's latency, the decode steps' median and longest latency while the prompt was in
flight (a decode's stall behind the prompt), the decodes' tokens/s over that interval, and their median latency
before the prompt came, with ratios to PETALS'. The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from dataclasses import dataclass

import torch

from petals_chain import defaults
from petals_chain.model_shapes import known_shape

WARM_STEPS = 3  # decode steps every session runs before the prompt is sent
NO_HYPO = torch.empty(0, dtype=torch.int64)


@dataclass
class Figures:
    """One run: the prompt's latency and the decode steps' latencies (s) before and while it was in flight."""

    prompt_s: float
    before: list[float]
    during: list[float]
    during_tps: float


def _server(config, n_blocks: int, mode: str, max_tokens: int, chunk: int | None, seed: int):
    """(backends, runtime) of one server: ``mode`` "petals" (PETALS' pool and runtime) or a batching one."""
    from petals.server.backend import merge_inference_pools_inplace
    from petals.server.server import RuntimeWithDeduplicatedPools

    from petals_chain.server.batching import BatchingConfig, BatchingRuntime, merge_batching_pools_inplace
    from petals_chain.server.random_span import random_backends, submit_in_process

    backends = random_backends(config, n_blocks, seed=seed)
    if mode == "petals":
        merge_inference_pools_inplace(backends)
        runtime_class = RuntimeWithDeduplicatedPools
    else:
        merge_batching_pools_inplace(backends, BatchingConfig(max_tokens=max_tokens, prefill_chunk_tokens=chunk))
        runtime_class = BatchingRuntime
    submit_in_process(backends)
    return backends, runtime_class(backends, device=None, prefetch_batches=1)


def _one_run(config, n_blocks: int, mode: str, b: int, context: int, prompt_len: int, chunk: int,
             seed: int) -> Figures:
    """Start a server, ``b`` decoding sessions, then the prompt; stop everything; the figures. ``chunk``: the
    chunked server's ``--prefill-chunk-tokens``."""
    from petals.data_structures import InferenceMetadata
    from petals.server.backend import _MergedInferenceStep

    from petals_chain.server.random_span import allocate_session, inference_infos

    max_tokens = defaults.MAX_BATCH_TOKENS
    if mode == "per block":  # each block's task whole: budget and chunks of the prompt's tokens
        max_tokens = chunk = max(prompt_len, max_tokens)
    backends, runtime = _server(config, n_blocks, mode, max_tokens, chunk, seed)
    pool = next(iter(backends.values())).inference_pool
    gen = torch.Generator().manual_seed(seed)
    max_length = context + 4096
    nones = [None] * n_blocks
    sessions = [allocate_session(backends, 1, max_length) for _ in range(b)]
    merged = _MergedInferenceStep(backends)
    for handles in sessions:  # caches filled to the context before the server starts
        merged(torch.randn(1, context, config.hidden_size, generator=gen), NO_HYPO,
               inference_infos(backends, handles, 0), *nones)
    steps = [torch.randn(1, 1, config.hidden_size, generator=gen) for _ in range(b)]
    prompt = torch.randn(1, prompt_len, config.hidden_size, generator=gen)
    prompt_handles = allocate_session(backends, 1, prompt_len + 1)
    spans: list[list[tuple[float, float]]] = [[] for _ in range(b)]
    stop = threading.Event()
    errors: list[BaseException] = []

    def decode(i: int) -> None:
        """Session i: one step after another until told to stop (or its cache is full)."""
        try:
            pos = context
            while not stop.is_set() and pos < max_length - 1:
                t0 = time.perf_counter()
                pool.submit_task(steps[i], NO_HYPO, inference_infos(backends, sessions[i], pos), *nones,
                                 priority=1.0).result(600)
                spans[i].append((t0, time.perf_counter()))
                pos += 1
        except BaseException as exc:  # reported below
            errors.append(exc)

    runtime.start()
    if not runtime.ready.wait(60):
        raise RuntimeError("the runtime did not start")
    threads = [threading.Thread(target=decode, args=(i,), daemon=True) for i in range(b)]
    try:
        for t in threads:
            t.start()
        while min(len(s) for s in spans) < WARM_STEPS and not errors:
            time.sleep(0.01)
        t_in = time.perf_counter()
        if mode.startswith("chunked"):
            pool.submit_task(prompt, NO_HYPO, inference_infos(backends, prompt_handles, 0), *nones,
                             priority=1.0).result(600)
        else:  # PETALS' path for a step over 128 tokens: one task per block, each on the last one's output
            h = prompt
            for uid, handles in zip(backends, prompt_handles):
                (h,) = pool.submit_task(h, NO_HYPO, (InferenceMetadata(uid, 0, tuple(handles), None),), None,
                                        priority=1.0).result(600)
        t_out = time.perf_counter()
    finally:
        stop.set()
        for t in threads:
            t.join(600)
        runtime.shutdown()
    if errors:
        raise RuntimeError(f"a decoding session failed: {errors[0]!r}")
    before = [e - s for ss in spans for s, e in ss if e <= t_in]
    during = [e - s for ss in spans for s, e in ss if e > t_in and s < t_out]
    done_inside = sum(1 for ss in spans for s, e in ss if t_in < e <= t_out)
    return Figures(t_out - t_in, before, during, done_inside / (t_out - t_in))


def run(argv: list[str] | None = None) -> int:
    """Print the table; returns 0 (2 with a one-line error for bad options)."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.bench server-prefill",
                                description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=15, help="blocks of the span (default 15)")
    p.add_argument("--sessions", type=int, nargs="+", default=[4, 8], help="b, decoding sessions (default 4 8)")
    p.add_argument("--prompts", type=int, nargs="+", default=[512, 1024], help="prompt lengths (default 512 1024)")
    p.add_argument("--context", type=int, default=128, help="tokens in each decoding session's cache (default 128)")
    p.add_argument("--chunks", type=int, nargs="+",
                   default=[defaults.PREFILL_CHUNK_TOKENS_CPU, defaults.PREFILL_CHUNK_TOKENS_CUDA],
                   help="the chunked servers' --prefill-chunk-tokens, one run each (default "
                        f"{defaults.PREFILL_CHUNK_TOKENS_CPU} {defaults.PREFILL_CHUNK_TOKENS_CUDA})")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.blocks < 1 or min(args.sessions) < 1 or min(args.prompts) < 1 or args.context < 1 \
            or min(args.chunks) < 2:
        print("error: --blocks, --sessions, --prompts and --context must be >= 1, --chunks >= 2")
        return 2
    from petals_chain.server.batching import route_long_steps_to_merged_pool
    from petals_chain.server.random_span import SMOLLM2_ROPE_THETA, llama_config

    torch.set_num_threads(1)
    config = llama_config(known_shape("smollm2-135m"), rope_theta=SMOLLM2_ROPE_THETA,
                          max_positions=args.context + 4096 + max(args.prompts))
    load_before = os.getloadavg()
    modes = ("petals", "per block", *(f"chunked {t}" for t in args.chunks))
    print(f"SmolLM2-135M-shaped blocks (random weights), {args.blocks} blocks, float32, 1 torch thread, in process; "
          f"decoding sessions at context {args.context}; chunked T: a batching server with chunks of T "
          f"tokens (--max-batch-tokens {defaults.MAX_BATCH_TOKENS})")
    print(f"{'b':>3} {'P':>5} {'server':>11} | {'prompt s':>8} | {'decode ms: before':>17} {'during p50':>10} "
          f"{'max':>7} | {'decode tok/s during':>19} | {'prompt/petals':>13} {'max/petals':>10}")
    try:
        for b in args.sessions:
            for prompt_len in args.prompts:
                figures = {m: _one_run(config, args.blocks, m, b, args.context, prompt_len,
                                       int(m.split()[1]) if m.startswith("chunked") else 0, args.seed)
                           for m in modes}
                ref = figures["petals"]
                for mode, f in figures.items():
                    print(f"{b:>3} {prompt_len:>5} {mode:>11} | {f.prompt_s:>8.2f} | "
                          f"{1e3 * statistics.median(f.before):>17.1f} {1e3 * statistics.median(f.during):>10.1f} "
                          f"{1e3 * max(f.during):>7.1f} | {f.during_tps:>19.1f} | {f.prompt_s / ref.prompt_s:>13.2f} "
                          f"{max(f.during) / max(ref.during):>10.2f}", flush=True)
    finally:
        route_long_steps_to_merged_pool(False)  # merge_batching_pools_inplace set it for a server process
    print(f"load average (1, 5, 15 min) before {tuple(round(x, 2) for x in load_before)}, after "
          f"{tuple(round(x, 2) for x in os.getloadavg())}")
    return 0
