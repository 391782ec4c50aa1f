"""The "JFFC only" baseline: every server that fits the whole model is a one-server chain."""

from __future__ import annotations

from collections.abc import Sequence

from petals_chain.compose.capacity import floor_ratio
from petals_chain.model import Chain, Composition, InfeasibleError, ModelSpec, Placement, ServerSpec, validate_servers


def whole_model_composition(servers: Sequence[ServerSpec], model: ModelSpec) -> Composition:
    """Chains = servers holding all L blocks, c_j = ⌊(M_j - L s_m) / (L s_c)⌋; others stay idle."""
    servers = validate_servers(servers)
    L = model.num_blocks
    first, count, chains = [], [], []
    for j, s in enumerate(servers):
        cap = floor_ratio(s.memory_bytes - L * model.block_bytes, L * model.cache_bytes)
        if cap >= 1:
            first.append(1)
            count.append(L)
            chains.append(Chain((j,), (L,), cap, s.tau_c_s + s.tau_p_s * L))
        else:
            first.append(0)
            count.append(0)
    if not chains:
        raise InfeasibleError(
            f"no server can hold the whole model ({L} blocks of {model.block_bytes / 1e9:.3g} GB plus cache for one "
            "job): the 'JFFC only' baseline needs at least one"
        )
    return Composition(servers, model, Placement(tuple(first), tuple(count)), tuple(chains), c=0)
