"""s_m under PETALS' --quant_type (int8, nf4), checked against figures worked out by hand for LLaMA-2-7B and BLOOM-176B
blocks, and the plain-dtype figure against the parameter bytes of a real SmolLM2 block on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from petals_chain.checkpoint.quant import BlockParams, block_param_bytes, count_block_params, linear_weight_bytes
from petals_chain.model import SpecError
from petals_chain.model_shapes import KNOWN_SHAPES, llama_block_bytes, llama_block_params

REPO = Path(__file__).resolve().parents[2]
SMOL = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"

# LLaMA-2-7B block: Q, K, V, O are 4096×4096 (16,777,216 weights each); gate, up 11008×4096 and down 4096×11008
# (45,088,768 each); two RMSNorms of 4096. No biases.
LLAMA_FP16 = (4 * 16_777_216 + 3 * 45_088_768 + 2 * 4096) * 2  # 404,766,720
# int8: one byte a weight + a float32 scale per output row (Q, K, V, O, down: 4096 rows; gate, up: 11008 rows);
# norms stay fp16.
LLAMA_INT8 = (4 * 16_777_216 + 3 * 45_088_768) + 4 * (5 * 4096 + 2 * 11008) + 2 * 4096 * 2  # 202,561,536
# nf4, per weight tensor: n/2 packed bytes + n/64 uint8 absmax + 4·⌈n/64/256⌉ float32 second-level absmax
# + 4 (offset) + 64 (16-value code). 4096×4096: 8,388,608 + 262,144 + 4,096 + 68 = 8,654,916;
# 11008×4096: 22,544,384 + 704,512 + 11,008 + 68 = 23,259,972.
LLAMA_NF4 = 4 * 8_654_916 + 3 * 23_259_972 + 2 * 4096 * 2  # 104,415,964

# BLOOM-176B block (hidden 14336): query_key_value 43008×14336, dense 14336×14336, dense_h_to_4h 57344×14336,
# dense_4h_to_h 14336×57344, all with biases (43008 + 14336 + 57344 + 14336 = 129,024), two LayerNorms with
# weight and bias (4 × 14336 = 57,344): 186,368 parameters that stay bf16.
BLOOM_BF16 = (616_562_688 + 205_520_896 + 2 * 822_083_584 + 186_368) * 2  # 4,932,874,240
# nf4: qkv 308,281,344 + 9,633,792 + 150,528 + 68; dense 102,760,448 + 3,211,264 + 50,176 + 68;
# each MLP linear 411,041,792 + 12,845,056 + 200,704 + 68.
BLOOM_NF4 = (318_065_732 + 106_021_956 + 2 * 424_087_620) + 186_368 * 2  # 1,272,635,664


def test_linear_layouts_by_hand() -> None:
    """One 4096×4096 linear in each layout; a shape that does not divide by 64 rounds the absmax count up."""
    assert linear_weight_bytes(4096, 4096, "none", 2) == 33_554_432
    assert linear_weight_bytes(4096, 4096, "int8", 2) == 16_777_216 + 4096 * 4
    assert linear_weight_bytes(4096, 4096, "nf4", 2) == 8_654_916
    # 3×7 = 21 weights: 11 packed bytes, 1 absmax, 1 second-level float32, offset, code.
    assert linear_weight_bytes(3, 7, "nf4", 2) == 11 + 1 + 4 + 4 + 64
    assert linear_weight_bytes(3, 7, "int8", 4) == 21 + 3 * 4


def test_llama2_7b_block_bytes_in_each_layout() -> None:
    """The LLaMA shape table and the hand figures agree; nf4 is 25.8 % of fp16 (4.13 bits a weight, not 4)."""
    shape = KNOWN_SHAPES["llama-2-7b"]
    assert llama_block_bytes(shape, 2) == LLAMA_FP16 == 404_766_720
    assert llama_block_bytes(shape, 2, "int8") == LLAMA_INT8 == 202_561_536
    assert llama_block_bytes(shape, 2, "nf4") == LLAMA_NF4 == 104_415_964


def _empty_block(config) -> BlockParams:
    """BlockParams of PETALS' own block class for a config, built on empty weights."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=True):
        return count_block_params(config.block_class(config))


def test_petals_llama_block_counts_the_same_linears_as_the_shape_table() -> None:
    """PETALS' LLaMA block, counted module by module, gives the figures of the table for every layout."""
    from petals.models.llama import DistributedLlamaConfig

    cfg = DistributedLlamaConfig(hidden_size=4096, intermediate_size=11008, num_attention_heads=32,
                                 num_key_value_heads=32, num_hidden_layers=32)
    params = _empty_block(cfg)
    assert sorted(params.linear_shapes) == sorted(llama_block_params(KNOWN_SHAPES["llama-2-7b"]).linear_shapes)
    for quant, want in (("none", LLAMA_FP16), ("int8", LLAMA_INT8), ("nf4", LLAMA_NF4)):
        assert block_param_bytes(params, 2, quant) == want


def test_bloom_176b_block_in_bf16_and_nf4() -> None:
    """PETALS' BLOOM block: 4.93 GB in bf16, 1.27 GB in NF4 (biases and LayerNorms stay bf16). The paper's 1.32 GB
    is PETALS' rough 4.25 bits a weight plus 1 %; the layout itself gives 1.27 GB."""
    from petals.models.bloom import DistributedBloomConfig

    params = _empty_block(DistributedBloomConfig(hidden_size=14336, n_head=112, n_layer=70))
    assert params.other_params == 186_368 and len(params.linear_shapes) == 4
    assert block_param_bytes(params, 2) == BLOOM_BF16 == 4_932_874_240
    assert block_param_bytes(params, 2, "nf4") == BLOOM_NF4 == 1_272_635_664
    assert abs(params.num_params * 4.25 / 8 * 1.01 / 1.32e9 - 1) < 0.005  # the paper's figure, from PETALS' estimate


@pytest.mark.skipif(not (SMOL / "model.safetensors").is_file(), reason="needs scripts/prepare_model.sh's SmolLM2")
def test_smollm2_float32_and_bfloat16_figures_are_the_real_block_parameters() -> None:
    """s_m in float32 and bfloat16 equals the element count of block 0's tensors in the checkpoint times 4 and 2."""
    from safetensors import safe_open

    from petals_chain.checkpoint.sizing import block_sizes

    n = 0
    with safe_open(str(SMOL / "model.safetensors"), framework="pt") as f:
        for key in f.keys():
            if key.startswith("model.layers.0."):
                count = 1
                for dim in f.get_slice(key).get_shape():
                    count *= dim
                n += count
    assert n == 3_540_096
    assert block_sizes(SMOL, "float32", 64).block_bytes == 4 * n
    assert block_sizes(SMOL, "bfloat16", 64).block_bytes == 2 * n
    assert block_sizes(SMOL, "auto", 64).dtype == "bfloat16"  # a float32 checkpoint: PETALS' 'auto' is bfloat16
    assert block_sizes(SMOL, "float32", 64, "nf4").block_bytes < block_sizes(SMOL, "float32", 64, "int8").block_bytes


@pytest.mark.parametrize("call, words", [
    (lambda: linear_weight_bytes(8, 8, "fp4", 2), "--quant_type must be one of none, int8, nf4, got 'fp4'"),
    (lambda: llama_block_bytes(KNOWN_SHAPES["llama-2-7b"], 2, "int4"), "'int4'"),
])
def test_unknown_quantisation_is_refused_naming_it(call, words: str) -> None:
    with pytest.raises(SpecError, match=words):
        call()
