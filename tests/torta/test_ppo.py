"""PPO on a fixed seed: the fluid environment is a valid gymnasium env, and a tiny run learns."""

from __future__ import annotations

import numpy as np
import torch
from gymnasium.utils.env_checker import check_env

from petals_chain.torta.env import FluidMacroEnv
from petals_chain.torta.episode import make_scenario
from petals_chain.torta.params import DEFAULT
from petals_chain.torta.train import deterministic_distance, train

TINY = DEFAULT.with_(policy_hidden=(32, 32), epochs=4, surge_factor=1.0, anchor_mix=1.0, lr=3e-3)


def smooth_forecast(counts: np.ndarray, t: int) -> np.ndarray:
    """Mean of the last 9 slots' arrivals (a smooth stand-in for the predictor)."""
    return counts[max(0, t - 8):t + 1].mean(0)


def test_fluid_env_passes_gymnasium_checks():
    sc = make_scenario("abilene", TINY, 2, slots=6)
    env = FluidMacroEnv(sc, smooth_forecast)
    check_env(env, skip_render_check=True)
    obs, info = env.reset()
    _, r, done, _, info = env.step(np.eye(12))
    assert info["ot_distance"] > 0 and r < 0 and not done


def test_ppo_improves_and_stays_near_the_ot_plan():
    torch.set_num_threads(1)
    sc = make_scenario("abilene", TINY, 1, slots=24)
    res = train([sc], smooth_forecast, 40, seed=1, progress=False)
    rewards = np.array([r["mean_reward"] for r in res.curve])
    first, last = rewards[:4].mean(), rewards[-10:].mean()
    assert last > first  # less negative
    dist, _, _ = deterministic_distance(FluidMacroEnv(sc, smooth_forecast), res.policy)
    assert dist <= TINY.eps_target
