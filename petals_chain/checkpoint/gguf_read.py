"""Reading a GGUF LLaMA checkpoint: open the file, typed metadata fields, the model's hyperparameters."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

GGUF_MAGIC = b"GGUF"


class GGUFConvertError(ValueError):
    """Raised when the GGUF input cannot be converted; the message names the file, key or tensor at fault."""


@dataclass(frozen=True)
class LlamaHyperparams:
    """LLaMA hyper-parameters read from GGUF metadata (the numbers a LlamaConfig needs)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool

    @property
    def head_dim(self) -> int:
        """Width of one attention head (hidden size / number of query heads)."""
        return self.hidden_size // self.num_attention_heads


def open_gguf(path: str | os.PathLike[str]) -> Any:
    """Open a GGUF file with gguf.GGUFReader after checking it exists and starts with the GGUF magic."""
    import gguf

    p = Path(path)
    if not p.exists():
        raise GGUFConvertError(f"GGUF file not found: {p}")
    if not p.is_file():
        raise GGUFConvertError(f"GGUF path is not a regular file: {p}")
    with p.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise GGUFConvertError(f"{p} is not a GGUF file: it starts with {magic!r}, expected {GGUF_MAGIC!r}")
    try:
        return gguf.GGUFReader(p, "r")
    except Exception as exc:  # the reader raises ValueError/IndexError/struct errors on damaged files
        raise GGUFConvertError(f"{p} is not a readable GGUF file ({type(exc).__name__}: {exc})") from exc


def field_value(reader: Any, key: str, kind: type, default: Any = None, required: bool = True) -> Any:
    """Return metadata `key` checked to be of Python type `kind`; raise naming the key when missing or mistyped."""
    field = reader.fields.get(key)
    if field is None:
        if required:
            raise GGUFConvertError(f"GGUF metadata key {key!r} is missing")
        return default
    value = field.contents()
    if isinstance(value, np.generic):
        value = value.item()
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise GGUFConvertError(f"GGUF metadata key {key!r} has value {value!r:.80}, expected type {kind}")
    return value


def _positive(key: str, value: int) -> int:
    """Check that an integer hyper-parameter is positive; raise naming the metadata key otherwise."""
    if value <= 0:
        raise GGUFConvertError(f"GGUF metadata key {key!r} must be positive, got {value}")
    return value


def read_hyperparams(reader: Any) -> LlamaHyperparams:
    """Read and check the LLaMA hyper-parameters from GGUF metadata (architecture must be 'llama')."""
    arch = field_value(reader, "general.architecture", str)
    if arch != "llama":
        raise GGUFConvertError(
            f"GGUF metadata 'general.architecture' is {arch!r}; only 'llama' checkpoints can be converted"
        )

    def need_int(name: str) -> int:
        """A required, positive integer `llama.<name>`."""
        return _positive(f"llama.{name}", field_value(reader, f"llama.{name}", int))

    hidden = need_int("embedding_length")
    heads = need_int("attention.head_count")
    kv_heads = _positive(
        "llama.attention.head_count_kv", field_value(reader, "llama.attention.head_count_kv", int, heads, False)
    )
    if hidden % heads:
        raise GGUFConvertError(
            f"llama.embedding_length={hidden} is not divisible by llama.attention.head_count={heads}"
        )
    if heads % kv_heads:
        raise GGUFConvertError(
            f"llama.attention.head_count={heads} is not divisible by llama.attention.head_count_kv={kv_heads}"
        )
    head_dim = hidden // heads
    if head_dim % 2:
        raise GGUFConvertError(f"head width {head_dim} (embedding_length/head_count) must be even for rotary embedding")
    rope_dims = field_value(reader, "llama.rope.dimension_count", int, head_dim, False)
    if rope_dims != head_dim:
        raise GGUFConvertError(
            f"llama.rope.dimension_count={rope_dims} differs from the head width {head_dim}; partial rotary "
            "embedding is not supported by transformers' LLaMA"
        )
    scaling = field_value(reader, "llama.rope.scaling.type", str, "none", False)
    if scaling != "none":
        raise GGUFConvertError(f"llama.rope.scaling.type={scaling!r} is not supported (only 'none')")
    if any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise GGUFConvertError("tensor 'rope_freqs.weight' (LLaMA-3 rope scaling) is not supported")

    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab_default = len(tokens.data) if tokens is not None else None
    vocab = field_value(reader, "llama.vocab_size", int, vocab_default, required=vocab_default is None)
    eps = field_value(reader, "llama.attention.layer_norm_rms_epsilon", float)
    if not eps > 0:
        raise GGUFConvertError(f"llama.attention.layer_norm_rms_epsilon must be positive, got {eps}")
    theta = field_value(reader, "llama.rope.freq_base", float, 10000.0, False)
    tensor_names = {t.name for t in reader.tensors}
    return LlamaHyperparams(
        vocab_size=_positive("llama.vocab_size", vocab),
        hidden_size=hidden,
        intermediate_size=need_int("feed_forward_length"),
        num_hidden_layers=need_int("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=need_int("context_length"),
        # GGUF stores float32: print the shortest float32 decimal (1e-05, not 9.999999747378752e-06).
        rms_norm_eps=float(str(np.float32(eps))),
        rope_theta=float(str(np.float32(theta))),
        tie_word_embeddings="output.weight" not in tensor_names,
    )
