"""Service-time model of an LLM server (docs/model.md, "Service time"): τp from device figures, τc from RTTs.

τp_j = t_o + t_in_j · l_in + t_out_j · (l_out - 1), with t_in_j = F / f_j (prefill is
compute-bound) and t_out_j = s_m / b_j (decode is memory-bound). Every generated
token costs one round trip between the orchestrator and each server of the chain,
so τc_j = l_out · (RTT_j + overhead), the overhead (~18 ms) covering serialisation.
"""

from __future__ import annotations

from dataclasses import dataclass

from petals_chain.model import SpecError

PER_TOKEN_OVERHEAD_S = 0.018
STEP_OVERHEAD_S = 0.001  # t_o


@dataclass(frozen=True)
class DeviceKind:
    """A GPU (or GPU slice) kind: memory, dense FLOP/s and memory bandwidth."""

    name: str
    memory_bytes: float
    flops_per_s: float
    bandwidth_bytes_per_s: float


@dataclass(frozen=True)
class Workload:
    """Per-request token counts and per-block prefill cost that τp depends on."""

    input_tokens: int = 2000
    output_tokens: int = 20
    flops_per_block_token: float = 5e9


# The paper's two kinds (§4.1.1; docs/model.md, "Paper settings"): MIG slices of an A100-80GB.
PAPER_DEVICES: dict[str, DeviceKind] = {
    "a100-3g.40gb": DeviceKind("a100-3g.40gb", 40e9, 120e12, 1.02e12),
    "a100-2g.20gb": DeviceKind("a100-2g.20gb", 20e9, 80e12, 0.51e12),
}


def tau_p(device: DeviceKind, block_bytes: float, workload: Workload = Workload()) -> float:
    """Per-block computation time of one job on this device (seconds)."""
    if workload.input_tokens < 1 or workload.output_tokens < 1:
        raise SpecError("workload: 'input_tokens' and 'output_tokens' must be >= 1")
    t_in = workload.flops_per_block_token / device.flops_per_s
    t_out = block_bytes / device.bandwidth_bytes_per_s
    return STEP_OVERHEAD_S + t_in * workload.input_tokens + t_out * (workload.output_tokens - 1)


def tau_c(rtt_s: float, workload: Workload = Workload(), overhead_s: float = PER_TOKEN_OVERHEAD_S) -> float:
    """Communication time of one job at a server whose round trip to the orchestrator is rtt_s."""
    if not rtt_s >= 0:
        raise SpecError(f"rtt must be >= 0 seconds, got {rtt_s!r}")
    return workload.output_tokens * (rtt_s + overhead_s)


def bloom_176b():
    """The paper's simulated model (§4.1.1): BLOOM-176B, 70 blocks, NF4 1.32 GB, 0.11 GB cache per 2048 tokens."""
    from petals_chain.model import GB, ModelSpec

    return ModelSpec(70, 1.32 * GB, 0.11 * GB, name="bloom-176b")
