"""The batched step's working memory: what one call allocates beyond weights and caches stays under
``BatchedSpanStep.working_bytes`` and grows with the step's tokens, not with the sessions' cached context.

Measured exactly, op by op: a torch dispatch mode sees every tensor the step's operations create and keeps the
bytes of those still alive (weak references), so the peak is that of the step's own allocations. Float32, tiny
random-weight LLaMA blocks (PETALS' blocks and backends).
"""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from petals_chain.server.batched_step import BatchedSpanStep, SessionStep
from petals_chain.server.random_span import TINY, llama_config, random_backends

MAX_LENGTH = 1100


class LiveBytes(TorchDispatchMode):
    """Peak bytes of the tensors created by torch operations while the mode is active and still referenced.

    Outputs that share memory with an input (views, in-place results) are not new memory; a storage is counted
    once, from its first new tensor until the last tensor seen on it is collected."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.now = self.peak = 0

    def _release(self, ptr: int) -> None:
        self.refs[ptr] -= 1
        if self.refs[ptr] == 0:
            del self.refs[ptr]
            self.now -= self.sizes.pop(ptr)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in pytree.tree_leaves((args, kwargs))
                  if isinstance(t, torch.Tensor)}
        for t in pytree.tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.untyped_storage().data_ptr() == 0:
                continue
            ptr = t.untyped_storage().data_ptr()
            if ptr not in self.refs:
                if ptr in inputs:
                    continue
                self.refs[ptr], self.sizes[ptr] = 0, t.untyped_storage().nbytes()
                self.now += self.sizes[ptr]
                self.peak = max(self.peak, self.now)
            self.refs[ptr] += 1
            weakref.finalize(t, self._release, ptr)
        return out


@pytest.fixture(scope="module")
def blocks():
    torch.set_num_threads(1)
    backends = random_backends(llama_config(TINY, max_positions=MAX_LENGTH + 8), 3, seed=0)
    descr = next(iter(backends.values())).get_inference_cache_descriptors
    return [b.module for b in backends.values()], descr


def _peak(step: BatchedSpanStep, steps: list[SessionStep]) -> int:
    with LiveBytes() as probe:
        outputs = step(steps)
    del outputs
    return probe.peak


def _sessions(descr, n_blocks: int, contexts: list[int], n_new: int = 1) -> list[SessionStep]:
    return [SessionStep(torch.randn(1, n_new, TINY.hidden), [tuple(d.make_zeros() for d in descr(1, MAX_LENGTH))
                                                              for _ in range(n_blocks)], ctx) for ctx in contexts]


@pytest.mark.parametrize("attention", ["per_session", "gathered"])
def test_decode_memory_is_bounded(blocks, attention: str) -> None:
    """8 sessions decoding: under the bound at short and long contexts; per session, the long context costs
    almost nothing more (only one session's logits row at a time)."""
    layers, descr = blocks
    step = BatchedSpanStep(layers, attention=attention)
    peaks, bounds = {}, {}
    for ctx in (16, 1000):
        steps = _sessions(descr, len(layers), [ctx - i for i in range(8)])
        peaks[ctx], bounds[ctx] = _peak(step, steps), step.working_bytes(steps)
        print(f"{attention} decode, 8 sessions, context {ctx}: peak {peaks[ctx]} B, bound {bounds[ctx]} B"
              f" ({peaks[ctx] / bounds[ctx]:.2f})")
        assert 0 < peaks[ctx] <= bounds[ctx]
    if attention == "per_session":
        assert peaks[1000] - peaks[16] <= 3 * TINY.heads * 1000 * 4  # one session's logits over the longer context


def test_prefill_memory_follows_the_logits_budget(blocks) -> None:
    """A 600-token prefill next to a decode: the attention's logits are cut to the budget, and the peak stays
    under the bound, which grows with the tokens."""
    layers, descr = blocks
    budget = 64 * 1024
    step = BatchedSpanStep(layers, max_logits_bytes=budget)
    small = _sessions(descr, len(layers), [0], n_new=60) + _sessions(descr, len(layers), [30])
    large = _sessions(descr, len(layers), [0], n_new=600) + _sessions(descr, len(layers), [30])
    p_small, p_large = _peak(step, small), _peak(step, large)
    b_small, b_large = step.working_bytes(small), step.working_bytes(large)
    unchunked = 3 * TINY.heads * 600 * 600 * 4
    print(f"prefill 60: peak {p_small} B (bound {b_small}); prefill 600: peak {p_large} B (bound {b_large});"
          f" unchunked logits alone would be {unchunked} B")
    assert p_small <= b_small and p_large <= b_large
    assert p_large < unchunked  # the chunking holds: less than the whole logits matrix
    assert p_small < p_large
