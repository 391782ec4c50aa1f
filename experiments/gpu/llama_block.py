"""A LLaMA-2-7B-shaped decoder block in plain PyTorch, with a static KV cache (no petals, no transformers).

One block is what a PETALS server holds per model layer: RMSNorm → q/k/v projections → rotary
embedding → causal attention over the cached keys/values → output projection → RMSNorm →
SwiGLU MLP (gate, up, down), with the two residual adds. Weights are random (timing and memory
do not depend on their values). Shapes default to LLaMA-2-7B: hidden 4096, MLP 11008, 32 heads
of 128, 32 KV heads, so one block has 4·4096² + 3·4096·11008 + 2·4096 = 202,383,360 parameters
(404.8 MB in bf16/fp16).

The KV cache is static: per block, keys and values of shape [sessions, heads, max_tokens, head_dim],
allocated once; s_c of one block and one session is 2·hidden·max_tokens·dtype-bytes
(2·4096·2048·2 B = 32 MiB for 2048 tokens in fp16/bf16).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Shape:
    """Block dimensions (LLaMA-2-7B by default)."""

    hidden: int = 4096
    inter: int = 11008
    heads: int = 32
    kv_heads: int = 32
    eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden // self.heads

    @property
    def params_per_block(self) -> int:
        """Weights of one block: q, o (d²), k, v (d·d_kv), gate, up, down (d·inter), two RMSNorm scales."""
        kv = self.kv_heads * self.head_dim
        return 2 * self.hidden ** 2 + 2 * self.hidden * kv + 3 * self.hidden * self.inter + 2 * self.hidden

    @property
    def matmul_flops_per_token(self) -> int:
        """F: FLOPs of one token through one block's weight matrices (2 per multiply-add), attention excluded."""
        return 2 * (self.params_per_block - 2 * self.hidden)

    def attention_flops_per_token(self, context: int) -> int:
        """QKᵀ and AV of one token against ``context`` cached tokens (2 per multiply-add)."""
        return 4 * context * self.heads * self.head_dim

    def cache_bytes(self, tokens: int, dtype_bytes: int) -> int:
        """s_c of one block and one session: keys + values for ``tokens`` tokens."""
        return 2 * self.kv_heads * self.head_dim * tokens * dtype_bytes


LLAMA2_7B = Shape()
TINY = Shape(hidden=256, inter=688, heads=4, kv_heads=4)  # for --quick runs on a CPU


class Block:
    """One decoder block's weights and its forward pass (inference only, no autograd)."""

    def __init__(self, shape: Shape, dtype: torch.dtype, device: torch.device | str, seed: int) -> None:
        """Random weights (normal, std 0.02; RMSNorm scales 1) on ``device``."""
        g = torch.Generator(device=device).manual_seed(seed)
        d, kv, i = shape.hidden, shape.kv_heads * shape.head_dim, shape.inter
        self.shape = shape

        def w(rows: int, cols: int) -> torch.Tensor:
            return (torch.randn(rows, cols, generator=g, device=device, dtype=torch.float32) * 0.02).to(dtype)

        self.wq, self.wk, self.wv, self.wo = w(d, d), w(kv, d), w(kv, d), w(d, d)
        self.wg, self.wu, self.wd = w(i, d), w(i, d), w(d, i)
        self.n1 = torch.ones(d, device=device, dtype=dtype)
        self.n2 = torch.ones(d, device=device, dtype=dtype)

    def tensors(self) -> list[torch.Tensor]:
        """All weight tensors."""
        return [self.wq, self.wk, self.wv, self.wo, self.wg, self.wu, self.wd, self.n1, self.n2]

    @property
    def nbytes(self) -> int:
        """s_m: bytes of this block's weights."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def __call__(self, x: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, pos: int,
                 cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [sessions, tokens, hidden] at positions pos.. of each session; writes K/V into kc/vc there.

        Prefill is pos == 0 with any number of tokens (causal); decode is one token at pos > 0.
        """
        s = self.shape
        c, n, d = x.shape
        if n > 1 and pos != 0:
            raise ValueError("only prefill from position 0 or single-token decode steps are supported")
        h = F.rms_norm(x, (d,), self.n1, s.eps)
        q = F.linear(h, self.wq).view(c, n, s.heads, s.head_dim).transpose(1, 2)
        k = F.linear(h, self.wk).view(c, n, s.kv_heads, s.head_dim).transpose(1, 2)
        v = F.linear(h, self.wv).view(c, n, s.kv_heads, s.head_dim).transpose(1, 2)
        cs, sn = cos[pos:pos + n], sin[pos:pos + n]
        q = q * cs + _rotate_half(q) * sn
        k = k * cs + _rotate_half(k) * sn
        kc[:, :, pos:pos + n].copy_(k)
        vc[:, :, pos:pos + n].copy_(v)
        a = F.scaled_dot_product_attention(q, kc[:, :, :pos + n], vc[:, :, :pos + n], is_causal=n > 1,
                                           enable_gqa=s.kv_heads != s.heads)
        x = x + F.linear(a.transpose(1, 2).reshape(c, n, d), self.wo)
        h = F.rms_norm(x, (d,), self.n2, s.eps)
        return x + F.linear(F.silu(F.linear(h, self.wg)) * F.linear(h, self.wu), self.wd)


def _rotate_half(t: torch.Tensor) -> torch.Tensor:
    """LLaMA's rotary helper: (a, b) → (−b, a) on the two halves of the last dimension."""
    a, b = t.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def rope_tables(shape: Shape, max_tokens: int, dtype: torch.dtype,
                device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary embedding, [max_tokens, head_dim], base 10000 (LLaMA-2)."""
    inv = 1.0 / (10000 ** (torch.arange(0, shape.head_dim, 2, device=device, dtype=torch.float32) / shape.head_dim))
    ang = torch.outer(torch.arange(max_tokens, device=device, dtype=torch.float32), inv)
    ang = torch.cat((ang, ang), dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def kv_cache(shape: Shape, sessions: int, max_tokens: int, dtype: torch.dtype,
             device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """One block's static K and V cache for ``sessions`` sessions of ``max_tokens`` tokens (zeros)."""
    dims = (sessions, shape.kv_heads, max_tokens, shape.head_dim)
    return torch.zeros(dims, device=device, dtype=dtype), torch.zeros(dims, device=device, dtype=dtype)


def run_blocks(blocks: list[Block], caches: list[tuple[torch.Tensor, torch.Tensor]], x: torch.Tensor, pos: int,
               cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x through the blocks in order, each with its own cache (sliced to x's sessions)."""
    c = x.shape[0]
    for b, (kc, vc) in zip(blocks, caches):
        x = b(x, kc[:c], vc[:c], pos, cos, sin)
    return x


def dtype_of(name: str) -> torch.dtype:
    """bf16 / fp16 / fp32 → torch dtype."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]
