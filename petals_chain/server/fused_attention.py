"""Fused attention for servers that emulate a device: the same result, a fraction of the CPU time.

An emulated server (server/device_clock.py) must finish each step's real compute before the device's time for it.
A 2048-token prompt costs PETALS' LLaMA block ~60 ms on a CPU core however narrow the model, nearly all of it in
attention written as matmul, an explicit n×n float mask and softmax; PyTorch's fused
``scaled_dot_product_attention`` does the same causal attention in ~6 ms without materialising the mask. In an
emulated server's process only, :func:`install` makes both kinds of server use it: PETALS' LLaMA attention (and its
block no longer builds the mask it would ignore) and our batched step's per-session attention
(``BatchedSpanStep.fused_attention``). Outputs agree with the unfused arithmetic to float rounding
(tests/server/test_fused_attention.py); what the swarm measures is the device's time, not this one.
"""

from __future__ import annotations

from typing import Any

import torch

from petals_chain.server.causal_attention import fused_causal



def llama_attention_forward(self: Any, hidden_states: torch.Tensor, attention_mask: Any = None,
                            position_ids: Any = None, past_key_value: tuple[torch.Tensor, torch.Tensor] | None = None,
                            output_attentions: bool = False, use_cache: bool = False, **_: Any) -> tuple[Any, ...]:
    """PETALS' LLaMA attention (``OptimizedLlamaAttention``) with a causal fused attention; the mask argument is
    ignored (the step is causal over the session's cache, which is all PETALS' block ever asks for)."""
    from petals.models.llama.block import apply_rotary_pos_emb, repeat_kv

    if getattr(self.config, "pretraining_tp", 1) > 1:
        raise NotImplementedError("fused attention for emulated servers: pretraining_tp > 1 is not supported")
    bsz, n, _ = hidden_states.shape
    q = self.q_proj(hidden_states).view(bsz, n, self.num_heads, self.head_dim).transpose(1, 2)
    k = self.k_proj(hidden_states).view(bsz, n, self.num_key_value_heads, self.head_dim).transpose(1, 2)
    v = self.v_proj(hidden_states).view(bsz, n, self.num_key_value_heads, self.head_dim).transpose(1, 2)
    past = 0 if past_key_value is None else int(past_key_value[0].shape[-2])
    cos, sin = self.rotary_emb(v, seq_len=past + n)
    q, k = apply_rotary_pos_emb(q, k, cos[:, :, past:], sin[:, :, past:])
    if past_key_value is not None:
        k = torch.cat([past_key_value[0], k], dim=2)
        v = torch.cat([past_key_value[1], v], dim=2)
    present = (k, v) if use_cache else None
    groups = self.num_heads // self.num_key_value_heads
    out = fused_causal(q, repeat_kv(k, groups), repeat_kv(v, groups), past)
    out = self.o_proj(out.transpose(1, 2).reshape(bsz, n, self.hidden_size))
    return out, None, present


_ORIGINALS: dict[str, Any] = {}


def install() -> bool:
    """Use the fused attention in this process (PETALS' LLaMA blocks and our batched step); False if already on."""
    if _ORIGINALS:
        return False
    from petals.models.llama import block
    from transformers.models.llama.modeling_llama import LlamaModel

    from petals_chain.server.batched_step import BatchedSpanStep

    original = LlamaModel._prepare_decoder_attention_mask

    def no_mask(model: Any, *args: Any, **kwargs: Any) -> Any:
        """PETALS' block asks for a float n×n mask the fused attention does not read: none is built."""
        return None if model is None else original(model, *args, **kwargs)

    _ORIGINALS.update(attention=block.OptimizedLlamaAttention.forward, mask=original)
    block.OptimizedLlamaAttention.forward = llama_attention_forward
    LlamaModel._prepare_decoder_attention_mask = no_mask
    BatchedSpanStep.fused_attention = True
    return True


def uninstall() -> bool:
    """Back to the unfused arithmetic (tests compare both in one process); False if it was not on."""
    if not _ORIGINALS:
        return False
    from petals.models.llama import block
    from transformers.models.llama.modeling_llama import LlamaModel

    from petals_chain.server.batched_step import BatchedSpanStep

    block.OptimizedLlamaAttention.forward = _ORIGINALS.pop("attention")
    LlamaModel._prepare_decoder_attention_mask = _ORIGINALS.pop("mask")
    BatchedSpanStep.fused_attention = False
    return True
