"""Size classes of Mell (docs/mell.md, "Size classes") and the KV-cache capacity of a GPU for a model."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

GIB = 1024**3


class SizeClass(IntEnum):
    """Class of a request or item by its current KV size s against the capacity C (larger value = larger class)."""

    X = -1  # tiny: s <= C/8, only ever inside a multi-item
    T = 0  # (C/8, C/4]
    S = 1  # (C/4, C/3]
    M = 2  # (C/3, C/2]
    L = 3  # (C/2, C]


def size_class(size_tokens: int, capacity_tokens: int) -> SizeClass:
    """The class of a KV size in exact integer arithmetic (boundaries belong to the smaller class)."""
    s, c = size_tokens, capacity_tokens
    if 2 * s > c:
        return SizeClass.L
    if 3 * s > c:
        return SizeClass.M
    if 4 * s > c:
        return SizeClass.S
    if 8 * s > c:
        return SizeClass.T
    return SizeClass.X


@dataclass(frozen=True)
class LlmSpec:
    """A decoder model's KV-cache geometry and weight size (fp16), from its published config."""

    name: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_params: float
    dtype_bytes: int = 2

    @property
    def kv_bytes_per_token(self) -> int:
        """Keys and values of one token over every layer: 2 · layers · kv_heads · head_dim · dtype."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.num_params * self.dtype_bytes


@dataclass(frozen=True)
class GpuSpec:
    """A GPU's memory (bytes) as sold."""

    name: str
    memory_bytes: float


# Published configs (Hugging Face meta-llama/Llama-2-*-hf): 32 layers x 32 heads x 128 and 40 x 40 x 128.
LLAMA2_7B = LlmSpec("llama-2-7b", num_layers=32, num_kv_heads=32, head_dim=128, num_params=6.738e9)
LLAMA2_13B = LlmSpec("llama-2-13b", num_layers=40, num_kv_heads=40, head_dim=128, num_params=13.016e9)
RTX_4090 = GpuSpec("rtx-4090-24gb", 24 * GIB)
A100_40GB = GpuSpec("a100-40gb", 40 * GIB)


def kv_capacity_tokens(model: LlmSpec, gpu: GpuSpec, *, memory_fraction: float = 1.0,
                       reserve_bytes: float = 0.0) -> int:
    """Tokens of KV cache one GPU holds next to the weights: ⌊(f·M − weights − reserve) / kv_bytes_per_token⌋.

    The defaults follow the paper's own arithmetic (whole memory minus weights: an A100-40GB with LLaMA-2-13B
    holds five 4096-token requests); vLLM would use ``memory_fraction=0.9`` and reserve room for activations.
    Raises ValueError (naming the field) if nothing is left for the cache.
    """
    if not 0 < memory_fraction <= 1:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
    if reserve_bytes < 0:
        raise ValueError(f"reserve_bytes must be >= 0, got {reserve_bytes!r}")
    free = memory_fraction * gpu.memory_bytes - model.weight_bytes - reserve_bytes
    tokens = math.floor(free / model.kv_bytes_per_token)
    if tokens < 8:
        raise ValueError(f"{model.name} on {gpu.name}: no room for a KV cache ({free / 1e9:.2f} GB left)")
    return tokens


SETTINGS = {"7b-4090": (LLAMA2_7B, RTX_4090), "13b-a100": (LLAMA2_13B, A100_40GB)}
