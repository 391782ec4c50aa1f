"""The paper's simulation settings (docs/model.md, "Paper settings") and the shared way experiments draw a cluster."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from petals_chain.model import ModelSpec, ServerSpec
from petals_chain.service_time import bloom_176b


@dataclass(frozen=True)
class PaperSetting:
    """Defaults of §4.1: J servers, a fraction eta of them high-end, Poisson λ, target load ρ̄, unit-test c."""

    J: int = 20
    eta: float = 0.2
    arrival_rate: float = 0.2
    target_load: float = 0.7
    c: int = 7


DEFAULT = PaperSetting()


def model() -> ModelSpec:
    """BLOOM-176B as simulated in the paper."""
    return bloom_176b()


def draw_cluster(J: int, eta: float, rng: np.random.Generator) -> list[ServerSpec]:
    """J servers at random RIPE Atlas anchors (orchestrator drawn too), kinds and τ per the paper."""
    from petals_chain.sim.network import draw_paper_servers

    return draw_paper_servers(J, eta, rng)


def run_seeds(seed: int, runs: int) -> list[np.random.Generator]:
    """Independent generators for Monte Carlo runs (SeedSequence spawning)."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(runs)]
