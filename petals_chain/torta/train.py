"""Training of the macro policy with PPO on the fluid environment: seeded, with progress, checkpoints and a curve.

:func:`train` returns the policy and one learning-curve row per episode; :func:`load_policy` restores a
checkpoint. The command line that trains one topology and writes the curve's CSV and PNG is
:mod:`petals_chain.experiments.torta_train`. docs/torta.md, "Macro layer: PPO".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from petals_chain.torta.cluster_sim import Scenario
from petals_chain.torta.env import FluidMacroEnv
from petals_chain.torta.episode import Forecast
from petals_chain.torta.ppo import BetaPolicy, ValueNet, anchor_of, gae, ppo_update, schedule


@dataclass
class TrainResult:
    """The trained policy and one learning-curve row per episode."""

    policy: BetaPolicy
    curve: list[dict[str, float]]


def _rollout(env: FluidMacroEnv, policy: BetaPolicy, gen: torch.Generator) -> dict[str, np.ndarray]:
    """One stochastic episode: observations, OT plans, Beta samples, log-probs, rewards, distances, switches."""
    obs, info = env.reset()
    keys = ("obs", "prob", "anchor", "x", "logp", "reward", "dist", "switch", "prob_switch")
    rec: dict[str, list] = {k: [] for k in keys}
    prev_prob = info["prob"]
    done = False
    while not done:
        prob = env.prob
        anchor = anchor_of(env.a_prev, prob, env.sc.params)
        with torch.no_grad():
            d, _ = policy.dist(torch.as_tensor(obs)[None], torch.as_tensor(anchor, dtype=torch.float32)[None])
            x = d.sample()[0].clamp(1e-3, 1 - 1e-3)
            logp = d.log_prob(x[None]).sum(-1)[0]
        nxt, reward, done, _, info = env.step(x.numpy().reshape(env.n_r, env.n_r))
        for k, v in (("obs", obs), ("prob", prob.ravel()), ("anchor", anchor.ravel()), ("x", x.numpy()),
                     ("logp", float(logp)), ("reward", reward), ("dist", info["ot_distance"]),
                     ("switch", info["switching"]),
                     ("prob_switch", float(((prob - prev_prob) ** 2).sum()))):
            rec[k].append(v)
        prev_prob = prob
        obs = nxt
    return {k: np.asarray(v, dtype=np.float32) for k, v in rec.items()}


class ReturnScale:
    """Running standard deviation of the discounted return (Welford), by which rewards are divided before GAE so
    that the value net fits returns of order one whatever the reward's units (⚑ ``reward_norm``)."""

    def __init__(self, gamma: float) -> None:
        self.gamma, self.n, self.mean, self.m2 = gamma, 0, 0.0, 0.0

    def __call__(self, rewards: np.ndarray) -> np.ndarray:
        """Update with one episode's discounted returns, then return its rewards scaled."""
        ret = 0.0
        for r in rewards:
            ret = self.gamma * ret + float(r)
            self.n += 1
            d = ret - self.mean
            self.mean += d / self.n
            self.m2 += d * (ret - self.mean)
        std = np.sqrt(self.m2 / max(self.n - 1, 1))
        return rewards / max(float(std), 1e-8)


def deterministic_distance(env: FluidMacroEnv, policy: BetaPolicy) -> tuple[float, float, float]:
    """Mean ‖A − Prob‖_F, mean ‖A_t − A_{t−1}‖²_F and mean reward of the deterministic policy on ``env``."""
    obs, _ = env.reset()
    dist, sw, rew, done = [], [], [], False
    while not done:
        a = policy.act(obs, anchor_of(env.a_prev, env.prob, env.sc.params))
        obs, r, done, _, info = env.step(a)
        dist.append(info["ot_distance"])
        sw.append(info["switching"])
        rew.append(r)
    return float(np.mean(dist)), float(np.mean(sw[1:])), float(np.mean(rew))


def train(scenarios: list[Scenario], forecast: Forecast, episodes: int, seed: int, use_ot: bool = True,
          checkpoint_dir: Path | None = None, checkpoint_every: int = 50, progress: bool = True) -> TrainResult:
    """PPO over ``episodes`` episodes cycling through ``scenarios``; Algorithm 2 updates γ_t, δ_t."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    p = scenarios[0].params
    envs = [FluidMacroEnv(sc, forecast, use_ot_reward=use_ot) for sc in scenarios]
    n_r = envs[0].n_r
    policy = BetaPolicy(envs[0].observation_space.shape[0], n_r, anchored=use_ot, hidden=p.policy_hidden)
    value = ValueNet(envs[0].observation_space.shape[0], hidden=p.policy_hidden)
    opt = torch.optim.Adam(list(policy.parameters()) + list(value.parameters()), lr=p.lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=p.lr_decay_every, gamma=p.lr_decay)
    gamma_t, delta_t, s_current = p.gamma0, p.delta0, p.s_target
    k0_hist, rl_hist, curve = [], [], []
    scale = ReturnScale(p.gamma) if p.reward_norm else None
    per = p.rollouts_per_update
    bar = tqdm(total=episodes, desc=f"PPO {scenarios[0].regions.name}", unit="ep", disable=not progress)
    ep = 0
    while ep < episodes:
        # ``per`` episodes with the same policy, then one update over all their steps (on-policy PPO batch)
        rolls, parts = [], []
        for _ in range(min(per, episodes - ep)):
            env = envs[(ep + len(rolls)) % len(envs)]
            roll = _rollout(env, policy, gen)
            with torch.no_grad():
                values = value(torch.as_tensor(roll["obs"])).numpy()
            rewards = scale(roll["reward"]) if scale is not None else roll["reward"]
            adv, ret = gae(rewards, values, p.gamma, p.gae)
            rolls.append(roll)
            parts.append((adv, ret))
        adv = np.concatenate([a for a, _ in parts])
        ret = np.concatenate([r for _, r in parts])
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        batch = {k: torch.as_tensor(np.concatenate([r[k] for r in rolls])) for k in ("obs", "prob", "anchor", "x",
                                                                                  "logp")}
        batch |= {"adv": torch.as_tensor(adv, dtype=torch.float32), "ret": torch.as_tensor(ret, dtype=torch.float32)}
        stats = ppo_update(policy, value, opt, batch, p, gamma_t, delta_t, s_current, use_ot, gen)
        sched.step()
        for i, roll in enumerate(rolls):
            k0_hist.append(float(roll["prob_switch"][1:].mean()))
            rl_hist.append(float(roll["switch"][1:].mean()))
            if (ep + 1) % p.s_update_every == 0:
                k0 = float(np.mean(k0_hist[-p.s_update_every:]))
                s_current = k0 / max(float(np.mean(rl_hist[-p.s_update_every:])), 1e-9)
                gap = float(roll["dist"].mean())
                lr_ok = (1 - 1 / max(s_current, 1e-9)) / p.eps_target > 0  # L_R, L_P finite-difference bound (⚑)
                gamma_t, delta_t = schedule(gamma_t, delta_t, gap, s_current, lr_ok, p)
            curve.append({"episode": ep, "mean_reward": float(roll["reward"].mean()),
                          "ot_distance": float(roll["dist"].mean()), "switching": float(roll["switch"][1:].mean()),
                          "k0": k0_hist[-1], "s_current": s_current, "gamma_t": gamma_t, "delta_t": delta_t,
                          "loss": stats["loss"], "lr": float(sched.get_last_lr()[0]),
                          "skipped_minibatches": stats["skipped"] if i == 0 else 0})  # once per update
            ep += 1
            bar.update()
            if checkpoint_dir is not None and (ep % checkpoint_every == 0 or ep == episodes):
                checkpoint_dir.mkdir(parents=True, exist_ok=True)
                torch.save({"policy": policy.state_dict(), "value": value.state_dict(), "episode": ep,
                            "regions": n_r, "anchored": use_ot, "hidden": list(p.policy_hidden)},
                           checkpoint_dir / f"{scenarios[0].regions.name}-ep{ep}.pt")
    bar.close()
    return TrainResult(policy, curve)


def load_policy(path: Path, obs_dim: int) -> BetaPolicy:
    """A policy restored from a checkpoint written by :func:`train`."""
    state = torch.load(path, weights_only=True)
    policy = BetaPolicy(obs_dim, int(state["regions"]), anchored=bool(state["anchored"]),
                        hidden=tuple(state["hidden"]))
    policy.load_state_dict(state["policy"])
    return policy
