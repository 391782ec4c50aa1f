"""Job streams for the simulator: Poisson arrivals with Exp(1) sizes, and Azure LLM trace replay.

A job has a *size* in units of mean work: it takes ``size / μ_k`` seconds on
chain k (the paper's model). Token-level traces become sizes through a service
model, see :func:`token_sizes` and :class:`TokenServiceModel`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from petals_chain.data.azure import Trace
from petals_chain.kernels.poisson import poisson_jobs



@dataclass(frozen=True)
class Workload:
    """Arrival times (s, non-decreasing) and job sizes (mean-1 work units); optional per-chain service times.

    If ``service_s`` (shape n × K) is given it overrides ``size``: job i takes
    ``service_s[i, k]`` seconds on chain k (token-aware replay; not memoryless,
    so migration is refused).
    """

    arrival_s: np.ndarray
    size: np.ndarray
    service_s: np.ndarray | None = None

    def __post_init__(self) -> None:
        arrival = np.ascontiguousarray(self.arrival_s, dtype=np.float64)
        size = np.ascontiguousarray(self.size, dtype=np.float64)
        object.__setattr__(self, "arrival_s", arrival)
        object.__setattr__(self, "size", size)
        if arrival.ndim != 1 or size.shape != arrival.shape:
            raise ValueError(f"workload: arrival_s {arrival.shape} and size {size.shape} must be equal-length 1-D")
        if not np.all(np.isfinite(arrival)) or (arrival.size and arrival[0] < 0):
            raise ValueError("workload: arrival_s must be finite and >= 0")
        if np.any(np.diff(arrival) < 0):
            bad = int(np.argmax(np.diff(arrival) < 0)) + 1
            raise ValueError(f"workload: arrival_s not sorted at job {bad}")
        if not np.all(np.isfinite(size)) or np.any(size <= 0):
            raise ValueError("workload: size must be finite and > 0")
        if self.service_s is not None:
            svc = np.ascontiguousarray(self.service_s, dtype=np.float64)
            object.__setattr__(self, "service_s", svc)
            if svc.ndim != 2 or svc.shape[0] != arrival.size:
                raise ValueError(f"workload: service_s must have shape (n_jobs, K), got {svc.shape}")
            if not np.all(np.isfinite(svc)) or np.any(svc <= 0):
                raise ValueError("workload: service_s must be finite and > 0")

    @property
    def n_jobs(self) -> int:
        return int(self.arrival_s.size)

    @property
    def arrival_rate_per_s(self) -> float:
        """Observed rate: jobs after the first per second of span."""
        span = float(self.arrival_s[-1] - self.arrival_s[0]) if self.n_jobs > 1 else 0.0
        return (self.n_jobs - 1) / span if span > 0 else float("nan")


def poisson_workload(arrival_rate_per_s: float, n_jobs: int, rng: np.random.Generator) -> Workload:
    """Poisson arrivals of rate λ from time 0 with i.i.d. Exp(1) sizes (inter-arrivals drawn first, then sizes)."""
    if not arrival_rate_per_s > 0:
        raise ValueError(f"poisson_workload: arrival_rate_per_s must be > 0, got {arrival_rate_per_s!r}")
    if n_jobs < 1:
        raise ValueError(f"poisson_workload: n_jobs must be >= 1, got {n_jobs!r}")
    return Workload(*poisson_jobs(arrival_rate_per_s, n_jobs, rng))


def per_block_time_s(input_tokens: np.ndarray | float, output_tokens: np.ndarray | float, *, t_o_s: float,
                     t_in_s: float, t_out_s: float) -> np.ndarray:
    """The paper's per-block time τp = t_o + t_in·l_in + t_out·(l_out - 1) for given token counts (vectorised)."""
    l_out = np.maximum(np.asarray(output_tokens, dtype=np.float64), 1.0)
    return t_o_s + t_in_s * np.asarray(input_tokens, dtype=np.float64) + t_out_s * (l_out - 1.0)


def token_sizes(trace: Trace, *, t_o_s: float = 1e-3, t_in_s: float = 5e9 / 120e12,
                t_out_s: float = 1.32e9 / 1.02e12) -> np.ndarray:
    """Chain-independent sizes: a job's τp(l_in, l_out) divided by the trace mean, so sizes have mean 1.

    This keeps the paper's model (time = size / μ_k, μ_k built for the mean job)
    and scales each job by how much prefill/decode work it carries relative to
    the average; the default t_* are the high GPU kind's (docs/model.md, "Paper settings"). Use
    :class:`TokenServiceModel` when chains differ in their prefill/decode mix.
    """
    work = per_block_time_s(trace.input_tokens, trace.output_tokens, t_o_s=t_o_s, t_in_s=t_in_s, t_out_s=t_out_s)
    return work / work.mean()


@dataclass(frozen=True)
class TokenServiceModel:
    """Per-chain linear service time T_k(l_in, l_out) = fixed_k + per_input_k·l_in + per_output_k·(l_out - 1).

    For a chain whose hops j process m_j blocks with RTT r_j to the orchestrator
    and an overhead o per round trip: fixed_k = Σ_j (r_j + o + m_j t_o),
    per_input_k = Σ_j m_j t_in_j, per_output_k = Σ_j (r_j + o + m_j t_out_j): one
    round trip for the prefill and one per decode step (docs/model.md, "Service time"). Built by
    :func:`petals_chain.sim.network.chain_token_model`.
    """

    fixed_s: np.ndarray
    per_input_token_s: np.ndarray
    per_output_token_s: np.ndarray

    def service_times_s(self, trace: Trace) -> np.ndarray:
        """Service time of every job of ``trace`` on every chain, shape (n_jobs, K)."""
        l_in = trace.input_tokens.astype(np.float64)[:, None]
        l_out = np.maximum(trace.output_tokens.astype(np.float64), 1.0)[:, None]
        return (np.asarray(self.fixed_s)[None, :] + np.asarray(self.per_input_token_s)[None, :] * l_in
                + np.asarray(self.per_output_token_s)[None, :] * (l_out - 1.0))

    @property
    def num_chains(self) -> int:
        return int(np.asarray(self.fixed_s).size)


def trace_workload(trace: Trace, sizes: np.ndarray | None = None,
                   service_model: TokenServiceModel | None = None) -> Workload:
    """A workload from a trace: with ``service_model`` per-chain token-aware times, else ``sizes`` (default 1)."""
    n = trace.n_jobs
    size = np.ones(n) if sizes is None else np.asarray(sizes, dtype=np.float64)
    svc = service_model.service_times_s(trace) if service_model is not None else None
    return Workload(trace.arrival_s, size, svc)
