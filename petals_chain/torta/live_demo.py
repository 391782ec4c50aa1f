"""The live demo's topology and workload in one place: three regions, two client origins, a burst from r0; and the
same workload as a seeded :class:`Scenario`, on which the PPO policy for the live swarm is trained.

docs/torta.md, "On the swarm: regions". ``torta-live`` replays :func:`arrivals` on real servers; the trainer
(``python -m petals_chain.experiments.torta_train --topology live3``) runs the fluid model of the same regions,
slot length, server slots and arrivals (other seeds), with the live macro layer's moving-average forecast.
"""

from __future__ import annotations

import numpy as np

from petals_chain.torta.cluster_sim import Scenario
from petals_chain.torta.params import QUICK_TRAINING, TortaParams
from petals_chain.torta.regional import FORECAST_SLOTS, LIVE_PARAMS, moving_average
from petals_chain.torta.topology import Regions
from petals_chain.torta.workload import Tasks

TOPOLOGY = "live3"
REGIONS = ("r0", "r1", "r2")
ORIGINS = ("r0", "r1")
# one-way latency (ms): r0 and r2 are near each other, r1 is far from r0
LATENCY_MS = np.array([[5.0, 60.0, 25.0], [60.0, 5.0, 40.0], [25.0, 40.0, 5.0]])
SLOT_S = 1.0  # the macro layer's slot: shorter than the burst (3 s), so the plan follows it within it
SLOTS_PER_SERVER = 2  # cache slots of each region's one server: a region serves two requests at once
RATE_PER_ORIGIN = 0.25  # steady Poisson arrivals per origin, requests/s
BURST_SPREAD_S = 3.0  # the burst's requests arrive within this long
# one request's service on this shared 2-core machine (8 tokens of SmolLM2-135M, previous live runs: 6–35 s)
SERVICE_RANGE_S = (6.0, 20.0)
TAIL_S = 20.0  # trained episodes run on after the last arrival, so that queues drain into the reward
TRAIN_SEED_OFFSET = 1000  # training scenarios use seeds seed + 1000 + k: never the replayed arrivals' own seed
TRAIN_SCENARIOS = 8


def horizon_s(quick: bool) -> float:
    """How long the arrivals run."""
    return 20.0 if quick else 40.0


def arrivals(rng: np.random.Generator, quick: bool) -> dict[str, list[float]]:
    """Seeded arrival times per origin: both at a steady Poisson rate, plus a burst from r0 that overloads it."""
    horizon = horizon_s(quick)
    out = {}
    for o in ORIGINS:
        n = rng.poisson(RATE_PER_ORIGIN * horizon)
        out[o] = sorted(rng.uniform(0.0, horizon, n).tolist())
    burst_at, burst_n = horizon / 4, (8 if quick else 12)
    out["r0"] = sorted(out["r0"] + (burst_at + rng.uniform(0.0, BURST_SPREAD_S, burst_n)).tolist())
    return out


def live_params(base: TortaParams = QUICK_TRAINING) -> TortaParams:
    """The trainer's parameters for the live regions: the live slot, server slots, service time and ν rule."""
    return base.with_(slot_s=SLOT_S, server_slots=SLOTS_PER_SERVER, proc_min_s=SERVICE_RANGE_S[0],
                      proc_max_s=SERVICE_RANGE_S[1], nu_total=LIVE_PARAMS.nu_total, n_models=1)


def live_scenario(seed: int, quick: bool = False, params: TortaParams | None = None) -> Scenario:
    """The live demo's regions (one A100-speed server each, no price) and one seeded draw of its arrivals."""
    p = params or live_params()
    rng = np.random.default_rng(seed)
    times = arrivals(rng, quick)
    n = len(REGIONS)
    regions = Regions(TOPOLOGY, REGIONS, LATENCY_MS * 1e-3, np.array([0.5, 0.5, 0.0]), np.zeros(n), np.zeros(n),
                      np.arange(n), np.zeros(n, dtype=int))
    at = np.array([t for o in ORIGINS for t in times[o]])
    origin = np.array([REGIONS.index(o) for o in ORIGINS for _ in times[o]])
    order = np.argsort(at, kind="stable")
    at, origin = at[order], origin[order]
    work = rng.uniform(p.proc_min_s, p.proc_max_s, size=at.size)
    zeros = np.zeros(at.size, dtype=int)
    tasks = Tasks(at, (at // p.slot_s).astype(int), origin, zeros, zeros, work, at + p.deadline_factor * work)
    slots = int(np.ceil((horizon_s(quick) + BURST_SPREAD_S + TAIL_S) / p.slot_s))
    warm = np.zeros(n)
    return Scenario(regions, tasks, warm, p, slots)


def training_scenarios(seed: int, quick: bool = False, count: int = TRAIN_SCENARIOS) -> list[Scenario]:
    """``count`` live scenarios from seeds other than any replayed one (seed + 1000 + k)."""
    return [live_scenario(seed + TRAIN_SEED_OFFSET + k, quick) for k in range(count)]


def live_forecast(counts: np.ndarray, t: int) -> np.ndarray:
    """F_t as the live macro layer forecasts it: the mean arrivals per origin of the last slots before t."""
    return moving_average(counts[max(0, t - FORECAST_SLOTS):t], counts.shape[1])
