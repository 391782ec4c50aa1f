"""Emulated servers' fused attention (server/fused_attention.py) gives PETALS' unfused results.

A session's prefill, decode steps and a step of several tokens over a cache (a verification) run three ways: PETALS'
own step unfused (the reference), PETALS' step with the fused attention installed, and our batched step with it.
Outputs agree to float rounding; uninstalling restores the unfused arithmetic exactly.
"""

from __future__ import annotations

import pytest
import torch

from petals_chain.server import causal_attention, fused_attention
from petals_chain.server.batched_step import BatchedMergedInferenceStep, BatchedSpanStep
from petals_chain.server.random_span import TINY, allocate_session, inference_infos, llama_config, random_backends

TOL = 1e-4
MAX_LENGTH = 64
NO_HYPO = torch.empty(0, dtype=torch.int64)
STEPS = [(0, 17), (17, 1), (18, 1), (19, 5), (24, 1)]  # (prefix length, new tokens): prefill, decode, verify


@pytest.fixture(scope="module")
def backends():
    torch.set_num_threads(1)
    return random_backends(llama_config(TINY), 3, seed=3)


def _petals_step(backends, handles, hidden, prefix):
    from petals.server.backend import _MergedInferenceStep

    infos = inference_infos(backends, handles, prefix)
    return _MergedInferenceStep(backends)(hidden.clone(), NO_HYPO, infos, *([None] * len(infos)))[0]


def test_fused_attention_equals_petals_unfused(backends) -> None:
    """Same inputs, three paths (TINY has grouped-query attention: 4 heads over 2 KV heads)."""
    torch.manual_seed(0)
    ref, fused, ours = (allocate_session(backends, 1, MAX_LENGTH) for _ in range(3))
    batched = BatchedMergedInferenceStep(backends, attention="per_session")
    inputs = [torch.randn(1, n, TINY.hidden) for _, n in STEPS]
    expected = [_petals_step(backends, ref, x, p) for x, (p, _) in zip(inputs, STEPS)]
    assert fused_attention.install()
    try:
        assert BatchedSpanStep.fused_attention
        got_petals = [_petals_step(backends, fused, x, p) for x, (p, _) in zip(inputs, STEPS)]
        got_ours = [batched([(x.clone(), NO_HYPO, inference_infos(backends, ours, p))])[0]
                    for x, (p, _) in zip(inputs, STEPS)]
    finally:
        assert fused_attention.uninstall()
    worst = max((a - e).abs().max().item() for got in (got_petals, got_ours) for a, e in zip(got, expected))
    assert worst < TOL, worst
    assert not BatchedSpanStep.fused_attention
    again = _petals_step(backends, allocate_session(backends, 1, MAX_LENGTH), inputs[0], 0)
    assert torch.equal(again, expected[0])  # the unfused arithmetic is back, bit for bit


def test_causal_allowed_sees_the_past_and_itself() -> None:
    """Query i at position past + i sees exactly keys 0 … past + i."""
    mask = causal_attention.causal_allowed(3, 2)
    assert mask.tolist() == [[True, True, True, False, False], [True, True, True, True, False],
                             [True, True, True, True, True]]
