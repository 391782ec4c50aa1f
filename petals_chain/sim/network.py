"""Network and server draws for the paper's simulations (§4.1.1): RIPE Atlas RTTs → τc_j, GPU kinds → τp_j.

The RIPE Atlas file lists measurements per anchor, not pairs; the pairwise RTT
follows the rule of docs/model.md, "Network", ``RTT(i,j) = 0.3·median_i + 0.3·median_j +
0.01 ms/km · haversine(i,j)`` with ``median_i`` the median of all of anchor i's
latency_m1..m4 values, and RTT(i,i) = 0 (a node talking to itself). τp and τc
come from :mod:`petals_chain.service_time` so composition and simulation agree:
τp = 108.9 ms (3g.40gb) and 175.2 ms (2g.20gb) for l_in = 2000, l_out = 20, as
the paper's ≈109 / ≈175 ms. τc follows service_time.tau_c, l_out · (RTT + 18 ms): the
18 ms is charged per round trip (prefill + l_out - 1 decode steps; docs/model.md, "Service time");
charged once per job instead, τc would be smaller by 19 × 18 ms = 0.34 s per hop; pass
``overhead_s`` to change it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from petals_chain.model import Chain, ServerSpec, SpecError
from petals_chain.service_time import (
    PAPER_DEVICES,
    PER_TOKEN_OVERHEAD_S,
    STEP_OVERHEAD_S,
    DeviceKind,
    bloom_176b,
    tau_c,
    tau_p,
)
from petals_chain.service_time import Workload as TokenWorkload
from petals_chain.data.ripe import Anchors, Topology, draw_topology
from petals_chain.sim.workloads import TokenServiceModel

PAPER_BLOCK_BYTES = bloom_176b().block_bytes  # BLOOM-176B block under NF4 (docs/model.md, "Paper settings")


def paper_server_kinds() -> tuple[DeviceKind, DeviceKind]:
    """The paper's (high, low) GPU kinds: A100 3g.40gb (40 GB, 120 TFLOPS, 1.02 GB/ms) and 2g.20gb (20 GB, 80, 0.51)."""
    return PAPER_DEVICES["a100-3g.40gb"], PAPER_DEVICES["a100-2g.20gb"]


def draw_paper_cluster(num_servers: int, eta: float, rng: np.random.Generator, *, anchors: Anchors | None = None,
                       workload: TokenWorkload | None = None, block_bytes: float = PAPER_BLOCK_BYTES,
                       overhead_s: float = PER_TOKEN_OVERHEAD_S,
                       ) -> tuple[list[ServerSpec], Topology, list[DeviceKind]]:
    """The paper's cluster (§4.1.1): J servers named s0.., round(ηJ) of them (drawn at random) high-end.

    Returns the servers, the topology and each server's GPU kind. Draw order
    from ``rng``: the topology first, then which servers are high-end. τp_j
    from the kind's FLOP/s and bandwidth, τc_j from RTT(orchestrator, j).
    """
    if not 0.0 <= eta <= 1.0:
        raise SpecError(f"network: eta (fraction of high-end servers) must be in [0, 1], got {eta!r}")
    workload = workload if workload is not None else TokenWorkload()
    topo = draw_topology(num_servers, rng, anchors)
    high_kind, low_kind = paper_server_kinds()
    n_high = round(eta * num_servers)
    high = set(rng.choice(num_servers, size=n_high, replace=False).tolist())
    kinds = [high_kind if j in high else low_kind for j in range(num_servers)]
    servers = [
        ServerSpec(f"s{j}", kind.memory_bytes, tau_c(float(topo.server_rtt_s[j]), workload, overhead_s),
                   tau_p(kind, block_bytes, workload))
        for j, kind in enumerate(kinds)
    ]
    return servers, topo, kinds


def draw_paper_servers(num_servers: int, eta: float, rng: np.random.Generator, **kwargs: object) -> list[ServerSpec]:
    """Just the servers of :func:`draw_paper_cluster` (same draws, same keyword options)."""
    return draw_paper_cluster(num_servers, eta, rng, **kwargs)[0]  # type: ignore[arg-type]


def chain_token_model(chains: Sequence[Chain], server_rtt_s: Sequence[float], server_kinds: Sequence[DeviceKind], *,
                      block_bytes: float = PAPER_BLOCK_BYTES, flops_per_block_token: float = 5e9,
                      overhead_s: float = PER_TOKEN_OVERHEAD_S) -> TokenServiceModel:
    """Per-chain token-aware service times T_k(l_in, l_out) for trace replay, consistent with profile's τ.

    Hop j of chain k processing m blocks costs l_out·(RTT_j + overhead) +
    m·(t_o + t_in_j·l_in + t_out_j·(l_out - 1)), so T_k(2000, 20) equals the
    chain's ``service_time_s`` when its servers came from :func:`draw_paper_cluster`.
    """
    fixed = np.zeros(len(chains))
    per_in = np.zeros(len(chains))
    per_out = np.zeros(len(chains))
    for k, ch in enumerate(chains):
        for j, m in zip(ch.servers, ch.blocks):
            kind = server_kinds[j]
            comm = float(server_rtt_s[j]) + overhead_s
            fixed[k] += comm + m * STEP_OVERHEAD_S
            per_in[k] += m * flops_per_block_token / kind.flops_per_s
            per_out[k] += comm + m * block_bytes / kind.bandwidth_bytes_per_s
    return TokenServiceModel(fixed, per_in, per_out)
