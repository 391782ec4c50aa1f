"""The emulated device's step-time model (petals_chain.device_profile): its shape, the MIG shares, the fit it embeds."""

from __future__ import annotations

import pytest

from petals_chain import device_profile as dp
from petals_chain.experiments import device_fit
from petals_chain.model import SpecError
from petals_chain.model_shapes import paper_testbed_sizes


def test_decode_is_host_bound_on_an_h100_and_memory_bound_on_a_slice() -> None:
    """One session's decode: the H100 waits for its kernel launches, a 2g slice for its quarter of an A100's memory."""
    h100, slice2 = dp.device("h100"), dp.device("a100-2g.20gb")
    assert h100.block_step_s([1], [128]) == pytest.approx(dp.H100_HOST_S)
    assert slice2.block_step_s([1], [128]) > slice2.host_s
    assert slice2.block_step_s([1], [128]) == pytest.approx(slice2.weights_s + slice2.kv_s * 129)


def test_prefill_is_compute_bound_and_linear_in_tokens() -> None:
    d = dp.device("a100-3g.40gb")
    assert d.block_step_s([2048], [0]) == pytest.approx(2 * d.block_step_s([1024], [0]))
    assert d.block_step_s([2048], [0]) == pytest.approx(d.t_in_s * 2048)


def test_mig_slices_take_their_shares_of_an_a100() -> None:
    """Compute by SMs (14 per slice of 108), bandwidth by memory slices (of 8); host terms stay the H100's."""
    h, s3, s2 = dp.h100(), dp.device("a100-3g.40gb"), dp.device("a100-2g.20gb")
    assert s3.t_in_s == pytest.approx(h.t_in_s * dp.H100_TFLOPS / (dp.A100_TFLOPS * 42 / 108))
    assert s2.t_in_s / s3.t_in_s == pytest.approx(3 / 2)
    assert s3.weights_s == pytest.approx(h.weights_s * dp.H100_TBPS / (dp.A100_TBPS * 4 / 8))
    assert s2.weights_s / s3.weights_s == pytest.approx(2.0)
    assert s3.host_s == h.host_s and s2.batch_host_s == h.batch_host_s
    assert (s3.memory_bytes, s2.memory_bytes) == (40e9, 20e9)


def test_a_batched_decode_costs_less_than_its_sessions_one_by_one() -> None:
    """Weights are read once per step: b sessions together cost far less than b steps (the GPU batches)."""
    d = dp.device("a100-3g.40gb")
    one = d.block_step_s([1], [1000])
    eight = d.block_step_s([1] * 8, [1000] * 8)
    assert one < eight < 2 * one
    g = d.batch_slowdown(1259, 28, 16)
    assert g[0] == 1.0 and all(b > a for a, b in zip(g, g[1:])) and g[15] < 16


def test_dilation_scales_every_duration() -> None:
    d = dp.device("a100-2g.20gb")
    k = d.dilated(3.0)
    for new, ctx in (([1], [10]), ([512], [0]), ([1] * 4, [2000] * 4)):
        assert k.block_step_s(new, ctx) == pytest.approx(3.0 * d.block_step_s(new, ctx))
    with pytest.raises(SpecError, match="dilation"):
        d.dilated(0)


def test_bad_input_is_one_clear_error() -> None:
    with pytest.raises(SpecError, match="unknown device 'a100-9g'.*known: a100-2g.20gb"):
        dp.device("a100-9g")
    with pytest.raises(SpecError, match="one \\(new tokens, context\\) pair per session"):
        dp.device("h100").block_step_s([1, 1], [0])
    with pytest.raises(SpecError, match="does not exist"):
        dp.a100_mig(8, 4, 40)


def test_emulated_sizes_are_llama_2_7b_in_fp16() -> None:
    assert dp.emulated_sizes(2048) == paper_testbed_sizes()


def test_embedded_constants_are_the_fit_of_the_committed_measurements() -> None:
    """device_fit refits h0, h1, t_in, w, kv from results/gpu and results/gpu-batched: the module's constants match."""
    fitted = device_fit.fit(device_fit.load_points())
    ref = dp.h100()
    for name, value in fitted.items():
        assert getattr(ref, name) == pytest.approx(value, rel=0.01), name
    rows = device_fit.compare(device_fit.load_points(), ref)
    decode = [abs(r["rel_err"]) for r in rows if r["set"].startswith("H100 decode")]
    prefill = [abs(r["rel_err"]) for r in rows if r["set"].startswith("H100 prefill")]
    assert max(prefill) < 0.15 and sorted(decode)[len(decode) // 2] < 0.1
