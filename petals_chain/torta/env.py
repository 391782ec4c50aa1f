"""Gymnasium environments of the macro MDP: a fast region-level fluid model (for PPO) over a seeded scenario.

docs/torta.md, "Macro layer: PPO". Action: A_t (R×R, rows normalised inside); reward (3):
r_t = −‖A_t − Prob_t‖²_F − λ1‖A_t − A_{t−1}‖²_F − λ2‖Q_t‖₁/Q_max (the first term dropped for RL-no-OT).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from petals_chain.torta.cluster_sim import Scenario
from petals_chain.torta.episode import Forecast, macro_plan, observation
from petals_chain.torta.metrics import switching_cost
from petals_chain.torta.transport import cost_matrix, row_normalise
from petals_chain.torta.workload import system_capacity_per_slot


class FluidMacroEnv(gym.Env):
    """Regions as fluid queues: Q ← max(0, Q + inflow − capacity); the scenario's arrivals drive it."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, sc: Scenario, forecast: Forecast, use_ot_reward: bool = True) -> None:
        super().__init__()
        self.sc, self.forecast, self.use_ot_reward = sc, forecast, use_ot_reward
        reg, p = sc.regions, sc.params
        self.n_r = reg.n_regions
        self.counts = sc.tasks.counts(sc.slots, self.n_r).astype(float)
        share = np.bincount(reg.server_region, weights=np.ones(reg.n_servers), minlength=self.n_r)
        from petals_chain.torta.params import GPU_KINDS

        speed = np.array([GPU_KINDS[k].speed for k in reg.server_kind])
        self.capacity = np.bincount(reg.server_region, weights=speed, minlength=self.n_r) / speed.sum() * \
            system_capacity_per_slot(reg, p)
        self.q_max = float(share.sum() * p.server_slots)
        self.cost = cost_matrix(reg.latency_s, reg.price_per_kwh, p)
        dim = 3 * self.n_r + 3 + 2 * self.n_r ** 2
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(dim,), dtype=np.float32)
        self.action_space = gym.spaces.Box(0.0, 1.0, shape=(self.n_r, self.n_r), dtype=np.float64)

    def _observe(self) -> np.ndarray:
        """State vector at the current slot; also refreshes the forecast and Prob_t."""
        t, p = self.t, self.sc.params
        self.f = self.forecast(self.counts, t)
        self.prob = macro_plan(self.f, self.capacity, self.q, self.cost, p)
        return observation(self.u, self.q / self.capacity, self.f, self.f.sum() / self.capacity.sum(), t,
                           p.slots_per_day, self.prob, self.a_prev)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Start at slot 0 with empty queues and a uniform previous allocation."""
        super().reset(seed=seed)
        self.t = 0
        self.q = np.zeros(self.n_r)
        self.u = np.zeros(self.n_r)
        self.a_prev = np.full((self.n_r, self.n_r), 1.0 / self.n_r)
        return self._observe(), {"prob": self.prob.copy()}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Apply A_t to slot t's arrivals; reward (3); move to slot t+1."""
        p = self.sc.params
        a = row_normalise(np.asarray(action, dtype=float).reshape(self.n_r, self.n_r))
        inflow = self.counts[self.t] @ a
        self.u = np.minimum(1.0, (self.q + inflow) / self.capacity)
        self.q = np.maximum(0.0, self.q + inflow - self.capacity)
        dist = switching_cost(a, self.prob)
        switch = switching_cost(a, self.a_prev)
        reward = -p.lambda1 * switch - p.lambda2 * self.q.sum() / self.q_max
        if self.use_ot_reward:
            reward -= dist
        info = {"ot_distance": float(np.sqrt(dist)), "switching": switch, "prob": self.prob.copy(),
                "queue": float(self.q.sum())}
        self.a_prev = a
        self.t += 1
        done = self.t >= self.sc.slots
        obs = self._observe() if not done else np.zeros(self.observation_space.shape, dtype=np.float32)
        return obs, float(reward), done, False, info
