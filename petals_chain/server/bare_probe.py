"""The bare batched forward, timed inside a live server next to the step it mirrors (``--bare-probe-every N``).

Issue 22's goal for the batching runtime is a share of the *bare* forward: the same blocks run over the same
sessions' tokens with preallocated contiguous caches, no RPC, no pool, no per-session cache handles. Measured in
another process (``bench server-step``) that limit runs on a warm, quiet interpreter, while the server's step runs
beside its connection handlers, DHT and pools: the ratio then mixes the runtime's overhead with the two processes'
different conditions. This probe measures the limit where the step runs: every ``every``-th decode batch (each
session one token), right after the batch, the runtime thread runs the span's own :class:`BatchedSpanStep` once
more over the same number of rows at the batch's mean context, on scratch caches of one contiguous tensor pair per
block, and the step log gets that time beside the step's (``bare_seconds``).

Arithmetic is the same as the step's (same blocks, same weights, same attention cost: attention is linear in the
context, so the mean context gives the batch's total attention work); what is missing is exactly what the issue
calls the runtime's overhead: resolving cache handles, per-session views and attention, cloning outputs, chunk
bookkeeping. The scratch caches are the probe's only memory: one pair per block for the most rows and the longest
context seen (rounded up to a power of two), kept for the server's lifetime; the option is off by default and meant
for benchmarks, where it is sized like ``c`` more sessions' caches.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from petals_chain.server.batched_step import BatchedMergedInferenceStep, SessionStep


def _ceil_pow2(n: int) -> int:
    """The smallest power of two ≥ n (n ≥ 1)."""
    return 1 << max(0, (n - 1).bit_length())


class BareProbe:
    """Times the bare forward after every ``every``-th decode batch of a server's merged pool (see the module)."""

    def __init__(self, batched_step: BatchedMergedInferenceStep, every: int) -> None:
        if every < 1:
            raise ValueError(f"the bare probe runs every N decode batches, N >= 1; got {every}")
        self.batched_step = batched_step
        self.every = every
        self._decodes = 0
        self._scratch: dict[tuple[str, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._shape: dict[tuple[str, ...], tuple[int, int]] = {}  # span → (rows, length) its scratch holds

    @staticmethod
    def decode_rows(batch: Sequence[Sequence[Any]]) -> tuple[tuple[str, ...], int, int] | None:
        """(the span's block uids, rows = hypotheses over all sessions, their mean context) when every task of
        ``batch`` is a decode step of one new token over the same span; None otherwise (prefill, verification,
        chunks, anything PETALS runs alone)."""
        uids: tuple[str, ...] | None = None
        rows = context = 0
        for args in batch:
            hidden, infos = args[0], args[2] if len(args) > 2 else None
            if not isinstance(hidden, torch.Tensor) or hidden.ndim != 3 or hidden.shape[1] != 1 or not infos:
                return None
            span = tuple(getattr(info, "uid", None) for info in infos)
            if None in span or (uids is not None and span != uids):
                return None
            uids = span
            rows += int(hidden.shape[0])
            context += int(hidden.shape[0]) * int(infos[0].prefix_length)
        if uids is None:
            return None
        return uids, rows, round(context / rows)

    def after(self, batch: Sequence[Sequence[Any]]) -> float | None:
        """Seconds of the bare forward mirroring ``batch`` when this batch is due for a probe, else None."""
        plan = self.decode_rows(batch)
        if plan is None:
            return None
        self._decodes += 1
        if self._decodes % self.every:
            return None
        uids, rows, context = plan
        step = self.batched_step._span_step(uids)
        caches = self._caches(uids, rows, context + 1)
        hidden = torch.randn(rows, 1, step.hidden_size, dtype=caches[0][0].dtype, device=caches[0][0].device)
        views = [(k[:rows], v[:rows]) for k, v in caches]
        with torch.inference_mode():
            if hidden.device.type == "cuda":
                torch.cuda.synchronize(hidden.device)
            started = time.perf_counter()
            step([SessionStep(hidden, views, context)])
            if hidden.device.type == "cuda":
                torch.cuda.synchronize(hidden.device)
            return time.perf_counter() - started

    def _caches(self, uids: tuple[str, ...], rows: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Scratch caches of the span for at least ``rows`` rows and ``length`` positions (grown, never shrunk)."""
        have_rows, have_length = self._shape.get(uids, (0, 0))
        if rows > have_rows or length > have_length:
            self._scratch.pop(uids, None)  # freed before the larger pair is made
            have_rows, have_length = max(have_rows, _ceil_pow2(rows)), max(have_length, _ceil_pow2(length))
            pairs = []
            for uid in uids:
                backend = self.batched_step.backends[uid]
                keys, values = (d.make_zeros() for d in backend.get_inference_cache_descriptors(have_rows,
                                                                                                have_length))
                pairs.append((keys, values))
            self._scratch[uids], self._shape[uids] = pairs, (have_rows, have_length)
        return self._scratch[uids]
