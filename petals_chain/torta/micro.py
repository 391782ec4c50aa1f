"""Micro layer (§V-C): pool sizing (6), the greedy score (7)–(10) and the activation order.

docs/torta.md, "Micro layer". Pure functions over numpy arrays; the simulator owns the state.
"""

from __future__ import annotations

import math

import numpy as np

from petals_chain.torta.params import TortaParams
from petals_chain.torta.workload import COMPUTE_NEED, MEMORY_NEED_BYTES


def pool_target(queue: float, forecast: float, servers: int, per_server_per_slot: float, params: TortaParams) -> int:
    """(6): N_target = min(S_r, ⌈(Q + F + σ√F) / C_avg⌉), at least ``min_active``."""
    if per_server_per_slot <= 0:
        raise ValueError(f"pool_target: per_server_per_slot must be > 0, got {per_server_per_slot}")
    need = (queue + forecast + params.sigma * math.sqrt(max(forecast, 0.0))) / per_server_per_slot
    return int(min(servers, max(params.min_active, math.ceil(need - 1e-9))))


def reactive_target(load: float, servers: int, per_server_per_slot: float, params: TortaParams) -> int:
    """Baselines' reactive autoscaling: ⌈Q / C_avg⌉ servers for the work seen, within [min_active, S_r]."""
    return int(min(servers, max(params.min_active, math.ceil(load / per_server_per_slot - 1e-9))))


def hw_fit(kind: int, speed: np.ndarray, memory_bytes: np.ndarray, suits: np.ndarray) -> np.ndarray:
    """(8) Comp_hw = min(1, compute/c_i)·min(1, mem/m_i)·Typematch (1.0 on a matching GPU, else 0.5)."""
    typematch = np.where(suits == kind, 1.0, 0.5)
    return (np.minimum(1.0, speed / COMPUTE_NEED[kind]) * np.minimum(1.0, memory_bytes / MEMORY_NEED_BYTES[kind])
            * typematch)


def load_score(load: np.ndarray, capacity: np.ndarray | float) -> np.ndarray:
    """(9) Comp_load = exp(−(Util + Queue) / Capacity), with ``load`` = Util + Queue counted in tasks."""
    return np.exp(-np.asarray(load, dtype=float) / capacity)


def locality_score(model: int, last_model: np.ndarray, last_ts: np.ndarray, now_s: float,
                   decay_per_s: float) -> np.ndarray:
    """(10) with Recent(s) = the last task served and Sim = 1[same model]: exp(−λ(t − ts)) on a match."""
    return np.where(last_model == model, np.exp(-decay_per_s * np.maximum(now_s - last_ts, 0.0)), 0.0)


def greedy_score(hw: np.ndarray, model: int, now_s: float, load: np.ndarray, capacity: np.ndarray | float,
                 last_model: np.ndarray, last_ts: np.ndarray, params: TortaParams) -> np.ndarray:
    """(7) Score = w1·Comp_hw + w2·Comp_load + w3·Comp_locality for each candidate (``hw`` = (8) per candidate,
    ``load``/``capacity`` = (9)'s Util + Queue and Capacity per candidate)."""
    return (params.w_hw * hw
            + params.w_load * load_score(load, capacity)
            + params.w_locality * locality_score(model, last_model, last_ts, now_s, params.locality_decay_per_s))


def activation_order(warmup_s: np.ndarray, speed: np.ndarray) -> np.ndarray:
    """Servers to switch on first: shortest warm-up, then fastest hardware."""
    return np.lexsort((-speed, warmup_s))


def deactivation_order(util: np.ndarray, idle_s: np.ndarray) -> np.ndarray:
    """Servers to switch off first: lowest utilisation, then longest idle."""
    return np.lexsort((-idle_s, util))
