"""``python -m petals_chain.bench server-step``: one decode step of b sessions on one server's span, three ways.

On SmolLM2-135M-shaped PETALS blocks with random weights (float32, CPU, 1 torch thread by default), for each
span length, context and number of sessions b, it times one decode step of every session:

* (a) PETALS today: b steps one after another, each PETALS' ``_MergedInferenceStep`` (what the server's merged
  inference pool runs for one task) over the session's own cache;
* (a') the batched kernel called for one session at a time (separates the gain of batching from the gain of
  attending over the cache in place instead of PETALS' copy-and-concatenate);
* (b) ``BatchedMergedInferenceStep``: all b sessions in one pass, each over its own PETALS cache;
* (c) the limit: the same arithmetic for b sessions that share one preallocated contiguous cache of batch b
  (one attention matmul for all; what a server with one cache arena and equal lengths could reach).

It prints aggregate tokens/s and the ratios (b)/(a) and (b)/(c). No RPC, no pools, no runtime thread: those
costs are the server's and are measured elsewhere.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from petals_chain.bench.timing import best_of, median_of
from petals_chain.model_shapes import known_shape


def _bare_caches(backends: dict, batch: int, max_length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Contiguous caches of batch ``batch`` for every block (PETALS' layout), for the limit (c)."""
    caches = []
    for backend in backends.values():
        keys, values = (d.make_zeros() for d in backend.get_inference_cache_descriptors(batch, max_length))
        caches.append((keys, values))
    return caches


def _attention_alternatives(shape, max_ctx: int, b: int, repeat: int) -> None:
    """Time one layer's decode attention for b sessions of mixed lengths (64 ... max_ctx), three mechanisms.

    (i) ours: per session, in place over its own cache; (ii) padding + mask: every session's cache gathered
    into one padded batch-b buffer, one masked attention; (iii) torch's scaled_dot_product_attention per
    session (GQA-aware kernel) over strided views of the same cache.
    """
    import torch.nn.functional as F

    from petals_chain.server.batched_step import BatchedSpanStep

    kvh, g, d = shape.kv_heads, shape.heads // shape.kv_heads, shape.hidden // shape.heads
    lengths = torch.linspace(64, max_ctx, b).round().long().tolist()
    keys = [torch.randn(1, kvh, d, max_ctx + 1) for _ in lengths]
    values = [torch.randn(1, kvh, max_ctx + 1, d) for _ in lengths]
    q = torch.randn(b, shape.heads, d)
    out = torch.empty_like(q)
    probe = BatchedSpanStep.__new__(BatchedSpanStep)
    probe.num_kv_heads, probe.groups, probe.head_dim, probe.max_logits_bytes = kvh, g, d, 1 << 28

    def in_place():
        for i, length in enumerate(lengths):
            probe._attend(q[i:i + 1], out[i:i + 1], keys[i], values[i], 1, 1, length - 1)

    def padded():
        longest = max(lengths)
        k_pad, v_pad = torch.zeros(b, kvh, d, longest), torch.zeros(b, kvh, longest, d)
        mask = torch.ones(b, 1, 1, longest, dtype=torch.bool)
        for i, length in enumerate(lengths):
            k_pad[i, :, :, :length] = keys[i][0, :, :, :length]
            v_pad[i, :, :length] = values[i][0, :, :length]
            mask[i, ..., :length] = False
        scores = torch.matmul(q.view(b, kvh, g, d), k_pad).masked_fill(mask, float("-inf"))
        return torch.matmul(torch.softmax(scores, dim=-1), v_pad)

    def sdpa():
        for i, length in enumerate(lengths):
            F.scaled_dot_product_attention(q[i].view(1, shape.heads, 1, d), keys[i][..., :length].transpose(-1, -2),
                                           values[i][:, :, :length], enable_gqa=True)

    times = {}
    for name, fn in (("in place (ours)", in_place), ("padding + mask", padded), ("SDPA per session", sdpa)):
        fn()
        times[name] = best_of(fn, max(repeat, 3) * 5)
    print(f"one layer's decode attention, {b} sessions of contexts {lengths[0]}..{lengths[-1]} (mixed):")
    for name, t in times.items():
        print(f"  {name:18s} {t * 1e6:8.1f} µs")


def step_figures(blocks: list[int], contexts: list[int], sessions: list[int], *, repeat: int, seed: int = 0,
                 report: Any = None, median: bool = False) -> dict[tuple[int, int, int], dict[str, float]]:
    """Aggregate tokens/s of one decode step, keyed (blocks, context, b), for (a) PETALS, (a1) ours one session at a
    time, (b) ours batched and (c) the bare batched forward; ``report(key, tps)`` is called as each is measured.
    Each figure is the fastest of ``repeat`` calls, or their median with ``median``."""
    timed = median_of if median else best_of
    from petals.server.backend import _MergedInferenceStep

    from petals_chain.server.batched_step import BatchedMergedInferenceStep, BatchedSpanStep, SessionStep
    from petals_chain.server.random_span import (
        SMOLLM2_ROPE_THETA,
        allocate_session,
        inference_infos,
        llama_config,
        random_backends,
    )

    shape = known_shape("smollm2-135m")
    config = llama_config(shape, rope_theta=SMOLLM2_ROPE_THETA, max_positions=max(contexts) + 8)
    all_backends = random_backends(config, max(blocks), seed=seed)
    max_length = max(contexts) + 1
    handles = [allocate_session(all_backends, 1, max_length) for _ in range(max(sessions))]
    no_hypo = torch.empty(0, dtype=torch.int64)
    generator = torch.Generator().manual_seed(seed)
    out: dict[tuple[int, int, int], dict[str, float]] = {}
    for n_blocks in blocks:
        backends = dict(list(all_backends.items())[:n_blocks])
        merged = _MergedInferenceStep(backends)
        batched = BatchedMergedInferenceStep(backends)
        bare = BatchedSpanStep([b.module for b in backends.values()])
        for ctx in contexts:
            for b in sessions:
                hidden = [torch.randn(1, 1, shape.hidden, generator=generator) for _ in range(b)]
                infos = [inference_infos(backends, handles[i][:n_blocks], ctx) for i in range(b)]
                nones = [None] * n_blocks

                def petals_steps(hidden=hidden, infos=infos, nones=nones):
                    for x, info in zip(hidden, infos):
                        merged(x.clone(), no_hypo, info, *nones)

                def ours_one_by_one(hidden=hidden, infos=infos):
                    for x, info in zip(hidden, infos):
                        batched([(x, no_hypo, info)])

                requests = [(x, no_hypo, info) for x, info in zip(hidden, infos)]
                caches = _bare_caches(backends, b, max_length)
                stacked = torch.cat(hidden)
                times = {}
                for key, fn in (("a", petals_steps), ("a1", ours_one_by_one), ("b", lambda r=requests: batched(r)),
                                ("c", lambda s=stacked, c=caches, ctx=ctx: bare([SessionStep(s, c, ctx)]))):
                    fn()  # warm-up
                    times[key] = timed(fn, repeat)
                out[(n_blocks, ctx, b)] = {k: b / t for k, t in times.items()}
                if report is not None:
                    report((n_blocks, ctx, b), out[(n_blocks, ctx, b)])
                del caches
    return out


def run(argv: list[str] | None = None) -> int:
    """Print the table; returns 0."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.bench server-step", description=__doc__)
    p.add_argument("--blocks", type=int, nargs="+", default=[15, 30], help="span lengths (default 15 30)")
    p.add_argument("--contexts", type=int, nargs="+", default=[128, 1024], help="tokens already cached")
    p.add_argument("--sessions", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="b, concurrent sessions")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--repeat", type=int, default=5, help="timed calls per figure, the fastest is kept")
    p.add_argument("--quick", action="store_true", help="2 timed calls per figure")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-alternatives", action="store_true", help="skip the attention mechanisms' comparison")
    args = p.parse_args(argv)
    repeat = 2 if args.quick else args.repeat
    torch.set_num_threads(args.threads)

    shape = known_shape("smollm2-135m")
    if not args.no_alternatives:
        for b in sorted({8, max(args.sessions)}):
            _attention_alternatives(shape, max(args.contexts), b, repeat)
    print(f"one decode step, SmolLM2-135M-shaped blocks (random weights), float32, {args.threads} torch thread(s),"
          f" fastest of {repeat}; tokens/s summed over sessions")
    print(f"{'blocks':>6} {'ctx':>5} {'b':>3} | {'(a) petals':>10} {'(a1) ours':>10} {'(b) batch':>10}"
          f" {'(c) bare':>10} | {'b/a':>5} {'b/c':>5} {'a1/a':>5}")

    def report(key: tuple[int, int, int], tps: dict[str, float]) -> None:
        """One row of the table."""
        n_blocks, ctx, b = key
        print(f"{n_blocks:>6} {ctx:>5} {b:>3} | {tps['a']:>10.1f} {tps['a1']:>10.1f} {tps['b']:>10.1f}"
              f" {tps['c']:>10.1f} | {tps['b'] / tps['a']:>5.2f} {tps['b'] / tps['c']:>5.2f}"
              f" {tps['a1'] / tps['a']:>5.2f}", flush=True)

    step_figures(args.blocks, args.contexts, args.sessions, repeat=repeat, seed=args.seed, report=report)
    return 0
