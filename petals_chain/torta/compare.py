"""Every method on the same seeded scenarios of one topology: train the policies, run the episodes, keep rows.

docs/torta.md, "Methods". A policy is trained for the system it is evaluated on (the seed's regions, GPUs, prices
and warm-ups, as a deployment trains its own), under arrivals drawn from seeds outside the evaluation seeds (and the
predictor under others), so evaluation arrivals are never seen in training.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from petals_chain.torta.episode import METHODS, make_scenario, oracle_forecast, run_episode
from petals_chain.torta.params import TortaParams
from petals_chain.torta.ppo import BetaPolicy
from petals_chain.torta.predictor import DemandPredictor, noisy_oracle, train_predictor
from petals_chain.torta.train import train

TRAIN_SEED_OFFSET = 10_000
PREDICTOR_SEED_OFFSET = 20_000


@dataclass
class Setup:
    """What one system's evaluation needs: parameters, the two trained policies and the predictor."""

    topology: str
    params: TortaParams
    slots: int
    seed: int  # the system's seed (regions, GPUs, prices, warm-ups); evaluation uses its own arrivals
    policy: BetaPolicy
    policy_no_ot: BetaPolicy
    predictor: DemandPredictor
    curve: list[dict[str, float]]


def prepare(topology: str, params: TortaParams, slots: int, episodes: int, seed: int,
            checkpoint_dir: Path | None = None, progress: bool = True) -> Setup:
    """Train the predictor (offline series), the TORTA policy and the RL-without-OT policy for the system of
    ``seed`` on ``topology``, under arrivals of other seeds."""
    torch.set_num_threads(1)
    spd = params.slots_per_day
    scs = [make_scenario(topology, params, seed, slots, arrivals_seed=seed + PREDICTOR_SEED_OFFSET + k)
           for k in range(2)]
    series = [s.tasks.counts(slots, s.regions.n_regions) for s in scs]
    predictor = train_predictor(series, params.history_k, spd, seed)
    sc_train = make_scenario(topology, params, seed, slots, arrivals_seed=seed + TRAIN_SEED_OFFSET)

    def fc(counts: np.ndarray, t: int) -> np.ndarray:
        return predictor.predict(counts, t, spd)

    res = train([sc_train], fc, episodes, seed, use_ot=True, checkpoint_dir=checkpoint_dir, progress=progress)
    res_no = train([sc_train], fc, episodes, seed, use_ot=False, checkpoint_dir=None, progress=progress)
    return Setup(topology, params, slots, seed, res.policy, res_no.policy, predictor, res.curve)


def evaluate(setup: Setup, methods: tuple[str, ...] = METHODS,
             forecast_accuracy: float | None = None) -> list[dict[str, Any]]:
    """Run ``methods`` on the scenario of the setup's seed; one row of metrics per method (same arrivals for all)."""
    torch.set_num_threads(1)
    p, seed = setup.params, setup.seed
    sc = make_scenario(setup.topology, p, seed, setup.slots)
    spd = p.slots_per_day
    if forecast_accuracy is None:
        def fc(counts: np.ndarray, t: int) -> np.ndarray:
            return setup.predictor.predict(counts, t, spd)
    else:
        rng = np.random.default_rng(seed)

        def fc(counts: np.ndarray, t: int) -> np.ndarray:
            return noisy_oracle(oracle_forecast(counts, t), forecast_accuracy, rng)
    rows = []
    for m in methods:
        pol = {"TORTA": setup.policy, "RL-no-OT": setup.policy_no_ot}.get(m)
        res = run_episode(sc, m, fc, pol.act if pol is not None else None)
        rows.append({"topology": setup.topology, "seed": seed, "method": m, **res.metrics,
                     "arrivals_checksum": float(sc.tasks.arrival_s.sum())})
    return rows
