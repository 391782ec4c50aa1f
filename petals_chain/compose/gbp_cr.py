"""GBP-CR (Algorithm 1): greedy block placement that reserves cache for c concurrent jobs per server."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from petals_chain import defaults
from petals_chain.compose.capacity import blocks_array
from petals_chain.model import InfeasibleError, ModelSpec, Placement, ServerSpec, SpecError


@dataclass(frozen=True)
class GbpCrResult:
    """The placement plus what GBP-CR learned building it (used by the c tuning)."""

    placement: Placement
    num_chains: int  # K(c): complete chains formed
    rate_estimate_per_s: float  # ν̃ = Σ 1 / T over the complete chains
    target_met: bool  # ν̃ ≥ λ / (ρ̄ c)


def gbp_cr_detail(
    servers: Sequence[ServerSpec],
    model: ModelSpec,
    c: int,
    arrival_rate: float,
    target_load: float = defaults.TARGET_LOAD,
    *,
    max_chains: bool = False,
) -> GbpCrResult:
    """Run Algorithm 1 and return the placement with K(c) and ν̃; O(J log J).

    As the paper writes it, placement stops once the chains formed meet the rate λ / (ρ̄ c); with
    ``max_chains`` it goes on until no server is left, forming every chain the servers allow."""
    if c < 1:
        raise SpecError(f"gbp_cr: field 'c' must be >= 1, got {c}")
    if not arrival_rate > 0:
        raise SpecError(f"gbp_cr: field 'arrival_rate' must be > 0, got {arrival_rate!r}")
    if not 0 < target_load < 1:
        raise SpecError(f"gbp_cr: field 'target_load' must be in (0, 1), got {target_load!r}")
    L = model.num_blocks
    m = blocks_array(servers, model, c)
    if int(m.sum()) < L:
        raise InfeasibleError(
            f"the servers cannot hold the model with cache for c={c} jobs: together they fit {int(m.sum())} of "
            f"{L} blocks (s_m={model.block_bytes / 1e9:.3g} GB, s_c={model.cache_bytes / 1e9:.3g} GB per job)"
        )
    tau_c = np.array([s.tau_c_s for s in servers])
    tau_p = np.array([s.tau_p_s for s in servers])
    t = tau_c + tau_p * m
    with np.errstate(divide="ignore", invalid="ignore"):
        amortised = np.where(m > 0, t / np.maximum(m, 1), np.inf)
    order = np.lexsort((np.arange(len(servers)), amortised))  # ties by index: deterministic
    first = [0] * len(servers)
    count = [0] * len(servers)
    need = arrival_rate / (target_load * c)
    a, chain_time, nu, chains = 1, 0.0, 0.0, 0
    m_list, t_list = m.tolist(), t.tolist()  # Python ints and floats: the same values, a fraction of the time
    for j in order.tolist():
        mj = m_list[j]
        if mj == 0:
            break  # sorted by amortised time: every later server has m = 0 too
        first[j] = min(a, L - mj + 1)
        count[j] = mj
        chain_time += t_list[j]
        a = min(a + mj - 1, L) + 1
        if a > L:
            nu += 1.0 / chain_time
            chains += 1
            if nu >= need and not max_chains:
                break
            a, chain_time = 1, 0.0
    if chains == 0:
        raise InfeasibleError(f"GBP-CR with c={c} could not complete a single chain")
    placement = Placement(first_block=tuple(first), num_blocks=tuple(count))
    return GbpCrResult(placement, chains, nu, nu >= need)


def gbp_cr(
    servers: Sequence[ServerSpec],
    model: ModelSpec,
    c: int,
    arrival_rate: float,
    target_load: float = defaults.TARGET_LOAD,
    *,
    max_chains: bool = False,
) -> Placement:
    """GBP-CR placement for concurrency c (the paper's Algorithm 1; docs/model.md, "GBP-CR")."""
    return gbp_cr_detail(servers, model, c, arrival_rate, target_load, max_chains=max_chains).placement
