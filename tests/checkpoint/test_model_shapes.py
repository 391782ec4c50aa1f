"""s_m and s_c of the known model shapes: LLaMA-2-7B's testbed figures and SmolLM2's, from their configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from petals_chain.model import SpecError
from petals_chain.model_shapes import (KNOWN_SHAPES, LlamaShape, block_and_cache_bytes, known_shape,
                                       paper_testbed_sizes)


def test_llama2_7b_testbed_cache_is_2048_fp16_tokens() -> None:
    """s_c = 2 (K, V) · 4096 · 2048 tokens · 2 B = 33,554,432 B (0.0336 GB, not the 4096-token 0.0671 GB)."""
    s_m, s_c = paper_testbed_sizes()
    assert s_c == 2 * 4096 * 2048 * 2 == 33_554_432
    assert s_m == 2 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) == 404_766_720


def test_grouped_query_attention_shrinks_the_cache_and_dtype_scales_both() -> None:
    smol = known_shape("smollm2-135m")
    s_m32, s_c32 = block_and_cache_bytes(smol, "float32", 100)
    s_m16, s_c16 = block_and_cache_bytes(smol, "bfloat16", 100)
    assert s_c32 == 100 * 1536 and (s_m32, s_c32) == (2 * s_m16, 2 * s_c16)
    mha = LlamaShape(smol.hidden, smol.intermediate, smol.heads, smol.heads, smol.layers)
    assert block_and_cache_bytes(mha, "float32", 100)[1] == 3 * s_c32  # 9 KV heads instead of 3


def test_llama_shape_from_config_matches_the_table() -> None:
    cfg = {"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32}
    assert LlamaShape.from_config(cfg) == KNOWN_SHAPES["llama-2-7b"]  # no num_key_value_heads: one per head


@pytest.mark.parametrize("call, field", [
    (lambda: known_shape("gpt-5"), "unknown model 'gpt-5'"),
    (lambda: block_and_cache_bytes(KNOWN_SHAPES["llama-2-7b"], "int3", 2048), "dtype"),
    (lambda: block_and_cache_bytes(KNOWN_SHAPES["llama-2-7b"], "float16", 0), "cache_tokens"),
    (lambda: block_and_cache_bytes(KNOWN_SHAPES["llama-2-7b"], "float16", 2048.0), "cache_tokens"),
    (lambda: LlamaShape.from_config({"hidden_size": 1}), "intermediate_size"),
])
def test_bad_input_names_the_field(call, field) -> None:
    with pytest.raises(SpecError, match=field):
        call()


def test_the_gpu_device_file_uses_the_same_figures() -> None:
    """results/gpu/device_h100.json (written by experiments/gpu/fit_and_plot.py) holds s_m and s_c of model_shapes."""
    doc = json.loads((Path(__file__).resolve().parents[2] / "results" / "gpu" / "device_h100.json").read_text())
    s_m, s_c = paper_testbed_sizes()
    assert doc["model"]["block_gb"] == pytest.approx(s_m / 1e9, rel=1e-12)
    assert doc["model"]["cache_gb"] == pytest.approx(s_c / 1e9, rel=1e-12)
