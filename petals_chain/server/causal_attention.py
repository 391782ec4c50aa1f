"""Causal attention over a session's cache as one fused PyTorch call (``scaled_dot_product_attention``).

The kernel both kinds of emulated server use (server/fused_attention.py installs it in PETALS' LLaMA block and turns
it on in our batched step): queries at positions past … past + n − 1 attend to keys 0 … their own position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_allowed(queries: int, past: int, device: torch.device | None = None) -> torch.Tensor:
    """Boolean ``[queries, past + queries]``: query i (position past + i) may see keys 0 … past + i."""
    i = torch.arange(queries, device=device).unsqueeze(1)
    j = torch.arange(past + queries, device=device).unsqueeze(0)
    return j <= past + i


def fused_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past: int,
                 scale: float | None = None) -> torch.Tensor:
    """Causal attention of ``q [.., n, d]`` (positions past … past + n − 1) over ``k, v [.., past + n, d]``;
    ``scale`` on the logits (None: 1/√d; 1.0 for queries already scaled)."""
    n = q.shape[-2]
    if n == 1:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    if past == 0:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    # an additive float mask: PyTorch's CPU kernel takes it ~1.7x faster than the same mask as booleans
    bias = torch.zeros(n, past + n, dtype=q.dtype, device=q.device).masked_fill_(~causal_allowed(n, past, q.device),
                                                                                 float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=scale)
