"""Memory feasibility (eqs. 1 and 3) of any placement + chains + capacities."""

from __future__ import annotations

from collections.abc import Sequence

from petals_chain.model import Chain, ModelSpec, Placement, ServerSpec, span_text

_TOLERANCE_BYTES = 1.0  # float slack, far below one block or cache slot


def memory_use(
    servers: Sequence[ServerSpec], model: ModelSpec, placement: Placement, chains: Sequence[Chain]
) -> list[float]:
    """Bytes each server needs: s_m m_j + s_c Σ_k m_kj c_k."""
    use = [model.block_bytes * m for m in placement.num_blocks]
    for ch in chains:
        for j, b in zip(ch.servers, ch.blocks):
            use[j] += model.cache_bytes * b * ch.capacity
    return use


def chain_matches_placement(ch: Chain, placement: Placement, num_blocks: int) -> str | None:
    """None if the chain is feasible under the placement (each hop starts inside the server's span), else why."""
    pos = 1
    for j, b in zip(ch.servers, ch.blocks):
        a, m = placement.first_block[j], placement.num_blocks[j]
        if m == 0 or not (a <= pos <= a + m - 1) or pos + b != a + m:
            held = span_text(*placement.span(j)) if m > 0 else "no blocks"
            return f"hop to server {j} runs blocks {pos - 1}:{pos - 1 + b}, not a tail of the span it holds, {held}"
        pos += b
    if pos != num_blocks + 1:
        return f"chain runs blocks 0:{pos - 1}, not 0:{num_blocks}"
    return None


def memory_violations(
    servers: Sequence[ServerSpec], model: ModelSpec, placement: Placement, chains: Sequence[Chain]
) -> list[str]:
    """Every way the composition breaks the model: bad hops, or servers over their memory M_j."""
    problems = [
        f"chain {k}: {why}"
        for k, ch in enumerate(chains)
        if (why := chain_matches_placement(ch, placement, model.num_blocks))
    ]
    for j, (s, used) in enumerate(zip(servers, memory_use(servers, model, placement, chains))):
        if used > s.memory_bytes + _TOLERANCE_BYTES:
            problems.append(f"server {s.name!r} needs {used / 1e9:.4g} GB but has {s.memory_bytes / 1e9:.4g} GB")
    return problems
