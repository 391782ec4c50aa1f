"""PPO on a fixed seed: the fluid environment is a valid gymnasium env, and a tiny run learns."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env

from petals_chain.torta.env import FluidMacroEnv
from petals_chain.torta.episode import make_scenario
from petals_chain.torta.episode import oracle_forecast
from petals_chain.torta.params import DEFAULT, QUICK_TRAINING
from petals_chain.torta.train import deterministic_distance, train

# the paper's ν (total capacity shares): with the default queue-aware ν the fluid queues move the plan too, and the
# same 60 episodes end 0.197 from it (docs/torta.md, "Macro layer: PPO")
TINY = DEFAULT.with_(policy_hidden=(32, 32), surge_factor=1.0, lr=3e-3, nu_total=True)


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
    """The issue's bar: mean reward of the last 10 episodes at least 20 % above (less negative than) the first 10 %,
    and the deterministic policy ends within ε = 0.15 of the OT plan (mean Frobenius distance).

    One seed's final distance is noisy: after 60 episodes it was 0.14-0.19 over seeds 1-6 (float-level differences
    between machines move it across ε), after 90 episodes 0.12-0.18 with 4 of 6 seeds within ε. So every one of three
    seeds must improve by 20 %, and their median distance after 90 episodes must be within ε."""
    torch.set_num_threads(1)
    sc = make_scenario("abilene", TINY, 1, slots=24)
    episodes = 90
    distances = []
    for seed in (1, 2, 3):
        res = train([sc], smooth_forecast, episodes, seed=seed, progress=False)
        rewards = np.array([r["mean_reward"] for r in res.curve])
        first, last = rewards[:episodes // 10].mean(), rewards[-10:].mean()
        assert (last - first) / abs(first) >= 0.20, (seed, first, last)
        distances.append(deterministic_distance(FluidMacroEnv(sc, smooth_forecast), res.policy)[0])
    assert float(np.median(distances)) <= TINY.eps_target, distances


def test_switching_target_contradicts_the_distance_target_on_this_scenario():
    """A finding, kept as a test: the issue also asks the final policy to switch at most K0/2.5, K0 the OT plan's own
    mean switching. A policy within ε of Prob_t at every slot switches at least (‖ΔProb_t‖ − 2ε)² (triangle
    inequality), and on this scenario the mean of that bound already exceeds K0/2.5: both cannot hold together."""
    sc = make_scenario("abilene", TINY, 1, slots=24)
    env = FluidMacroEnv(sc, smooth_forecast)
    env.reset()
    probs, done = [env.prob.copy()], False
    while not done:
        _, _, done, _, _ = env.step(env.prob)  # follow the plan exactly
        if not done:
            probs.append(env.prob.copy())
    jumps = np.array([np.linalg.norm(b - a) for a, b in zip(probs, probs[1:])])
    k0 = float(np.mean(jumps ** 2))
    least = float(np.mean(np.maximum(0.0, jumps - 2 * TINY.eps_target) ** 2))
    assert least > k0 / TINY.s_target, (least, k0)


def test_quick_training_improves_mean_reward_by_a_fifth():
    """The --quick settings on a fixed seed: the sampled mean reward of the last 3 episodes is at least 20 % above
    (less negative than) the first 3's; with the paper's 3e-4 on the same trunk it is not (+15 %)."""
    torch.set_num_threads(1)
    sc = make_scenario("abilene", QUICK_TRAINING, 1, slots=16)
    res = train([sc], oracle_forecast, 12, seed=1, progress=False)
    r = np.array([c["mean_reward"] for c in res.curve])
    first, last = r[:3].mean(), r[-3:].mean()
    assert (last - first) / abs(first) >= 0.20, (first, last)


def test_return_scale_divides_by_the_running_return_std():
    """reward_norm: rewards divided by the sample std of the discounted returns seen so far (γ = 0: the rewards)."""
    from petals_chain.torta.train import ReturnScale

    s = ReturnScale(0.0)
    assert np.allclose(s(np.array([1.0, 3.0, 5.0])), np.array([1.0, 3.0, 5.0]) / 2.0)
    assert np.allclose(s(np.array([3.0])), [3.0 / np.std([1.0, 3.0, 5.0, 3.0], ddof=1)])


def test_within_trust_bounds_the_move_from_the_anchor_and_keeps_rows_distributions():
    from petals_chain.torta.ppo import within_trust

    anchor = np.full((3, 3), 1 / 3)
    far = np.eye(3)
    a = within_trust(far, anchor, DEFAULT)
    assert np.linalg.norm(a - anchor) == pytest.approx(DEFAULT.policy_trust)
    np.testing.assert_allclose(a.sum(1), 1.0)
    assert (a >= 0).all()
    near = anchor + 0.01 * (far - anchor)
    np.testing.assert_array_equal(within_trust(near, anchor, DEFAULT), near)


def test_an_update_whose_ratio_overflows_is_skipped_not_applied():
    """A batch whose behaviour log-probabilities lie far below the policy's (as after a few epochs on Cost266's 1369
    elements): the ratio e^(logp − old) overflows float32, and the step would turn every weight into NaN. The update
    skips those minibatches and counts them; with ordinary log-probabilities nothing is skipped and the weights move."""
    from petals_chain.torta.ppo import BetaPolicy, ValueNet, ppo_update

    torch.manual_seed(0)
    regions, obs_dim, n = 3, 5, 8
    policy, value = BetaPolicy(obs_dim, regions, hidden=(8,)), ValueNet(obs_dim, hidden=(8,))
    opt = torch.optim.Adam(list(policy.parameters()) + list(value.parameters()), lr=1e-2)
    obs = torch.randn(n, obs_dim)
    anchor = torch.full((n, regions * regions), 1 / regions)
    with torch.no_grad():
        d, _ = policy.dist(obs, anchor)
        x = d.sample().clamp(1e-3, 1 - 1e-3)
        logp = d.log_prob(x).sum(-1)
    batch = {"obs": obs, "anchor": anchor, "x": x, "prob": anchor, "adv": -torch.ones(n), "ret": torch.zeros(n)}
    p = DEFAULT.with_(epochs=2, minibatch=4)
    before = [q.detach().clone() for q in policy.parameters()]
    gen = torch.Generator().manual_seed(0)
    stats = ppo_update(policy, value, opt, {**batch, "logp": logp - 200.0}, p, 0.0, 0.0, p.s_target, False, gen)
    assert stats["skipped"] == 4  # 2 epochs × 2 minibatches
    assert all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))
    stats = ppo_update(policy, value, opt, {**batch, "logp": logp}, p, 0.0, 0.0, p.s_target, False, gen)
    assert stats["skipped"] == 0
    assert all(torch.isfinite(q).all() for q in policy.parameters())
    assert not all(torch.equal(a, b) for a, b in zip(before, policy.parameters()))
