"""CPU servers standing in for the paper's MIG slices: memory budgets and speed factors scaled to a small model.

The §4.2 testbed serves LLaMA-2-7B (L = 32 blocks of s_m = 0.405 GB, s_c = 0.0336 GB of cache per block per
job: 2048 tokens in fp16, both from petals_chain.model_shapes) on 3g.40gb (40 GB) and 2g.20gb (20 GB) slices.
What the placement and chain arithmetic sees is the *shape*: how many model copies a server's memory holds
(M_j / (L·s_m)), how heavy the cache is relative to a block (s_c / s_m), and how much slower a low-end server
is (τp ratio). Emulating on a small model keeps all three: a server's budget is ``M_j · (L'·s_m') / (L·s_m)``,
the cache per block per job is ``s_m' · s_c / s_m``, and the speed factor of a kind is ``τp(fastest kind) /
τp(kind)`` from :mod:`petals_chain.service_time`.
"""

from __future__ import annotations

from petals_chain.model import ModelSpec
from petals_chain.model_shapes import LlamaShape, llama_block_bytes, llama_cache_bytes_per_token
from petals_chain.service_time import PAPER_DEVICES, Workload, tau_p

__all__ = ["LlamaShape", "llama_block_bytes", "llama_cache_bytes_per_token", "scaled_memory_bytes",
           "scaled_cache_bytes", "speed_factors", "emulated_servers"]


def scaled_memory_bytes(paper_memory_bytes: float, paper: ModelSpec, model: ModelSpec) -> float:
    """A budget holding as many copies of ``model`` as ``paper_memory_bytes`` holds of the paper's model."""
    return paper_memory_bytes * (model.num_blocks * model.block_bytes) / (paper.num_blocks * paper.block_bytes)


def scaled_cache_bytes(paper: ModelSpec, block_bytes: float) -> float:
    """Cache per block per job for a model with ``block_bytes`` blocks, at the paper's s_c / s_m ratio."""
    return block_bytes * paper.cache_bytes / paper.block_bytes


def speed_factors(paper: ModelSpec, workload: Workload,
                  kinds: tuple[str, ...] = tuple(PAPER_DEVICES)) -> dict[str, float]:
    """Relative speed of each paper device kind, 1.0 for the fastest: τp(fastest) / τp(kind) on the paper's model."""
    taus = {k: tau_p(PAPER_DEVICES[k], paper.block_bytes, workload) for k in kinds}
    fastest = min(taus.values())
    return {k: fastest / t for k, t in taus.items()}


def emulated_servers(paper: ModelSpec, workload: Workload, model: ModelSpec,
                     counts: dict[str, int]) -> list[tuple[str, str, float, float]]:
    """CPU stand-ins for ``counts`` servers of each paper kind: (name, kind, memory_bytes, speed_factor).

    Names are s0, s1, ... in the order of ``counts``, as in the shipped cluster files.
    """
    speed = speed_factors(paper, workload, tuple(counts))
    out = []
    for kind, n in counts.items():
        budget = scaled_memory_bytes(PAPER_DEVICES[kind].memory_bytes, paper, model)
        base = len(out)
        out.extend((f"s{base + i}", kind, budget, speed[kind]) for i in range(n))
    return out
