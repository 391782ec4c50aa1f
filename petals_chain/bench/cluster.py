"""The benchmarks' cluster: the paper's two kinds of A100 slice serving BLOOM-176B, J servers at a time, and an
orchestrator registry holding them (the composition, churn and swarm benchmarks and their tests share it)."""

from __future__ import annotations

import numpy as np

from petals_chain.model import ServerSpec
from petals_chain.orchestrator.state.registry import Registry
from petals_chain.service_time import PAPER_DEVICES, Workload, bloom_176b, tau_c, tau_p

BLOOM = bloom_176b()


def bench_servers(J: int, eta: float, rng: np.random.Generator) -> list[ServerSpec]:
    """J servers of the paper's two kinds (a fraction eta high-end), RTTs uniform in 5–60 ms."""
    high, low = PAPER_DEVICES["a100-3g.40gb"], PAPER_DEVICES["a100-2g.20gb"]
    wl = Workload()
    n_high = round(eta * J)
    out = []
    for j in range(J):
        dev = high if j < n_high else low
        rtt = float(rng.uniform(0.005, 0.060))
        out.append(ServerSpec(f"s{j}", dev.memory_bytes, tau_c(rtt, wl), tau_p(dev, BLOOM.block_bytes, wl)))
    return out


def bench_registry(servers: list[ServerSpec], now_s: float) -> Registry:
    """An orchestrator's registry with ``servers`` registered at ``now_s`` (the churn and swarm benchmarks' start)."""
    registry = Registry(BLOOM)
    for s in servers:
        registry.register(s.name, s.memory_bytes, s.tau_p_s, s.tau_c_s, now_s=now_s)
    return registry
