"""Shapes of the LLaMA-architecture models we size (layers, widths, KV heads) and their s_m and s_c in bytes.

Every figure of a block's weights (s_m) and of its KV cache per job (s_c) in the cluster and testbed
files is computed here from the model's config and the cache length, never typed in by hand
(docs/model.md, "Servers and model"). A real checkpoint on disk is sized by petals_chain.checkpoint.sizing; both
count bytes through petals_chain.checkpoint.quant (dtype widths, quantised linears).
"""

from __future__ import annotations

from dataclasses import dataclass

from petals_chain.checkpoint.quant import DTYPE_BYTES, BlockParams, block_param_bytes
from petals_chain.model import SpecError


@dataclass(frozen=True)
class LlamaShape:
    """The LLaMA-architecture sizes that fix a block's weight and KV-cache bytes (from a config.json)."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    layers: int

    @classmethod
    def from_config(cls, cfg: dict) -> LlamaShape:
        """Read hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, num_hidden_layers."""
        try:
            return cls(int(cfg["hidden_size"]), int(cfg["intermediate_size"]), int(cfg["num_attention_heads"]),
                       int(cfg.get("num_key_value_heads", cfg["num_attention_heads"])), int(cfg["num_hidden_layers"]))
        except KeyError as e:
            raise SpecError(f"model config: missing field {e.args[0]!r}") from None


# Known models, from their Hugging Face config.json.
KNOWN_SHAPES: dict[str, LlamaShape] = {
    "llama-2-7b": LlamaShape(hidden=4096, intermediate=11008, heads=32, kv_heads=32, layers=32),
    "smollm2-135m": LlamaShape(hidden=576, intermediate=1536, heads=9, kv_heads=3, layers=30),
}
# The cache length the paper's §4.2 testbed serves LLaMA-2-7B with (tokens per job).
PAPER_TESTBED_CACHE_TOKENS = 2048


def known_shape(name: str) -> LlamaShape:
    """The shape of a model in KNOWN_SHAPES; SpecError listing the known names otherwise."""
    try:
        return KNOWN_SHAPES[name]
    except KeyError:
        raise SpecError(f"model shape: unknown model {name!r} (known: {', '.join(sorted(KNOWN_SHAPES))})") from None


def dtype_bytes(dtype: str) -> int:
    """Bytes of one value in ``dtype``; SpecError naming the known dtypes otherwise."""
    if dtype not in DTYPE_BYTES:
        raise SpecError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    return DTYPE_BYTES[dtype]


def llama_block_params(shape: LlamaShape) -> BlockParams:
    """One decoder block's linears: Q, O (h×h), K, V (kv·h/heads × h), gate, up (ffn×h), down (h×ffn); two RMSNorms."""
    h, kv_dim, ffn = shape.hidden, shape.hidden * shape.kv_heads // shape.heads, shape.intermediate
    return BlockParams(((h, h), (kv_dim, h), (kv_dim, h), (h, h), (ffn, h), (ffn, h), (h, ffn)), 2 * h)


def llama_block_bytes(shape: LlamaShape, dtype_bytes: int = 4, quant_type: str = "none") -> int:
    """Weights of one decoder block in the compute dtype, or with its linears quantised (checkpoint.quant)."""
    return block_param_bytes(llama_block_params(shape), dtype_bytes, quant_type)


def llama_cache_bytes_per_token(shape: LlamaShape, dtype_bytes: int = 4) -> int:
    """KV cache of one block for one token: K and V of width hidden·kv_heads/heads (PETALS' per-block formula)."""
    return 2 * shape.hidden * shape.kv_heads // shape.heads * dtype_bytes


def block_and_cache_bytes(shape: LlamaShape, dtype: str, cache_tokens: int,
                          quant_type: str = "none") -> tuple[int, int]:
    """(s_m, s_c): one block's weights (linears stored as ``quant_type``) and its KV cache (in ``dtype``) for one job
    of ``cache_tokens`` tokens, in bytes."""
    if isinstance(cache_tokens, bool) or not isinstance(cache_tokens, int) or cache_tokens < 1:
        raise SpecError(f"cache_tokens must be a positive integer, got {cache_tokens!r}")
    width = dtype_bytes(dtype)
    return llama_block_bytes(shape, width, quant_type), llama_cache_bytes_per_token(shape, width) * cache_tokens


def paper_testbed_sizes() -> tuple[int, int]:
    """(s_m, s_c) of the paper's §4.2 testbed: LLaMA-2-7B in fp16, 2048 cached tokens per job."""
    return block_and_cache_bytes(KNOWN_SHAPES["llama-2-7b"], "float16", PAPER_TESTBED_CACHE_TOKENS)
