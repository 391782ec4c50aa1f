"""PPO for the macro layer: Beta policy per element (row-normalised), the constrained loss (5), Algorithm 2.

docs/torta.md, "Macro layer: PPO". The policy's mean is anchored (its logits add to logit(anchor)) on
(1 − η)·A_{t−1} + η·Prob_t, a smoothed OT plan (⚑ ``anchor_mix`` η); RL-no-OT drops the anchor, the OT reward
term and L_ε.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from petals_chain.torta.params import TortaParams


MEAN_FLOOR = 0.02  # ⚑ the Beta means are kept in [0.02, 0.98] while sampling; the deterministic action is not


def _mlp(inp: int, out: int, hidden: tuple[int, ...]) -> nn.Sequential:
    """A ReLU trunk (the paper's is 256-512-256) with a linear head."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(inp, h), nn.ReLU()]
        inp = h
    return nn.Sequential(*layers, nn.Linear(inp, out))


class BetaPolicy(nn.Module):
    """π_θ(A | s): independent Beta(m·k, (1 − m)·k) per element of A, then row-normalised."""

    def __init__(self, obs_dim: int, regions: int, anchored: bool = True,
                 hidden: tuple[int, ...] = (256, 512, 256)) -> None:
        super().__init__()
        self.regions, self.anchored, self.hidden = regions, anchored, tuple(hidden)
        self.net = _mlp(obs_dim, 2 * regions * regions, self.hidden)
        with torch.no_grad():
            self.net[-1].weight.mul_(0.01)
            self.net[-1].bias.zero_()
            self.net[-1].bias[regions * regions:] = 3.0  # initial concentration ≈ 2 + softplus(3) ≈ 5

    def dist(self, obs: torch.Tensor, anchor: torch.Tensor) -> tuple[torch.distributions.Beta, torch.Tensor]:
        """The Beta distribution per element and its mean, for a batch of states and anchor allocations."""
        n2 = self.regions * self.regions
        out = self.net(obs)
        z = out[..., :n2]
        if self.anchored:
            p = anchor.reshape(z.shape).clamp(1e-4, 1 - 1e-4)
            z = z + torch.log(p) - torch.log1p(-p)
        m = torch.sigmoid(z)
        ms = m.clamp(MEAN_FLOOR, 1 - MEAN_FLOOR)  # sampling only: Beta means near 0 make log-probs explode
        k = 2.0 + nn.functional.softplus(out[..., n2:])
        return torch.distributions.Beta(ms * k, (1 - ms) * k), m

    def mean_action(self, m: torch.Tensor) -> torch.Tensor:
        """Deterministic A_t: the row-normalised mean."""
        a = m.reshape(*m.shape[:-1], self.regions, self.regions)
        return a / a.sum(-1, keepdim=True)

    def act(self, obs: np.ndarray, anchor: np.ndarray) -> np.ndarray:
        """The deterministic allocation for one state (evaluation)."""
        with torch.no_grad():
            _, m = self.dist(torch.as_tensor(obs)[None], torch.as_tensor(anchor, dtype=torch.float32)[None])
            return self.mean_action(m)[0].numpy().astype(float)


class ValueNet(nn.Module):
    """V(s): same trunk shape as the policy, separate weights."""

    def __init__(self, obs_dim: int, hidden: tuple[int, ...] = (256, 512, 256)) -> None:
        super().__init__()
        self.net = _mlp(obs_dim, 1, tuple(hidden))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """State values, shape (batch,)."""
        return self.net(obs).squeeze(-1)


def anchor_of(a_prev: np.ndarray, prob: np.ndarray, p: TortaParams) -> np.ndarray:
    """The policy's anchor: (1 − η)·A_{t−1} + η·Prob_t."""
    return (1 - p.anchor_mix) * a_prev + p.anchor_mix * prob


def within_trust(a: np.ndarray, anchor: np.ndarray, p: TortaParams) -> np.ndarray:
    """A pulled back towards its anchor along the segment until ‖A − anchor‖_F ≤ ``policy_trust`` (rows stay
    distributions: a convex combination of two)."""
    d = float(np.linalg.norm(a - anchor))
    return a if d <= p.policy_trust else anchor + (a - anchor) * (p.policy_trust / d)


def gae(rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimates and returns of one episode (terminal at its end)."""
    adv = np.zeros_like(rewards)
    last = 0.0
    for t in range(rewards.size - 1, -1, -1):
        nxt = values[t + 1] if t + 1 < values.size else 0.0
        delta = rewards[t] + gamma * nxt - values[t]
        last = delta + gamma * lam * last
        adv[t] = last
    return adv, adv + values


def schedule(gamma_t: float, delta_t: float, ot_gap: float, s_current: float, lr_ok: bool,
             p: TortaParams) -> tuple[float, float]:
    """Algorithm 2's multipliers: exponential in the constraint gaps, ×1.5 when the bound condition fails."""
    g = p.gamma0 * float(np.exp(p.a_gamma * max(0.0, ot_gap - p.eps_target)))
    d = p.delta0 * float(np.exp(p.a_delta * max(0.0, p.s_target - s_current)))
    if not lr_ok:
        g, d = max(g, gamma_t) * 1.5, max(d, delta_t) * 1.5
    return min(g, 1e3), min(d, 1e3)


def _grad_norms(*modules: nn.Module) -> list[tuple[list[nn.Parameter], torch.Tensor]]:
    """Per module, its parameters and the total 2-norm of their gradients: what ``clip_grad_norm_`` computes
    first. It is finite exactly when every gradient is, so one number per module is the finiteness check (a check
    per tensor took 9.6 % of py-spy's samples of a full-setting Abilene seed), and the clip reuses it."""
    out = []
    for m in modules:
        params = list(m.parameters())
        out.append((params, nn.utils.get_total_norm([q.grad for q in params if q.grad is not None])))
    return out


def ppo_update(policy: BetaPolicy, value: ValueNet, opt: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
               p: TortaParams, gamma_t: float, delta_t: float, s_current: float, use_ot: bool,
               gen: torch.Generator) -> dict[str, float]:
    """K epochs of clipped PPO (4) plus L_ε (5) (and the gradient-free δ_t·L_s term) over one batch.

    A minibatch whose loss or gradients are not finite is skipped (counted in ``stats["skipped"]``): the policy's
    log-probability is a sum over all R² elements (1369 on Cost266), so once the policy has moved in an epoch the
    ratio to the behaviour policy can overflow float32 (e^89), and one such step would make every weight NaN. A run
    in which every step is finite takes exactly the steps it took without this check."""
    n = batch["obs"].shape[0]
    stats = {"loss": 0.0, "l_eps": 0.0, "skipped": 0}
    l_s = max(0.0, (p.s_target - s_current) / p.s0)
    for _ in range(p.epochs):
        perm = torch.randperm(n, generator=gen)
        for lo in range(0, n, p.minibatch):
            idx = perm[lo:lo + p.minibatch]
            d, m = policy.dist(batch["obs"][idx], batch["anchor"][idx])
            logp = d.log_prob(batch["x"][idx]).sum(-1)
            ratio = torch.exp(logp - batch["logp"][idx])
            adv = batch["adv"][idx]
            l_ppo = -torch.min(ratio * adv, ratio.clamp(1 - p.clip, 1 + p.clip) * adv).mean()
            l_v = (value(batch["obs"][idx]) - batch["ret"][idx]).pow(2).mean()
            loss = l_ppo + 0.5 * l_v - p.entropy_coef * d.entropy().sum(-1).mean()
            if use_ot:
                a = policy.mean_action(m)
                gap = (a.flatten(-2) - batch["prob"][idx]).pow(2).sum(-1).sqrt()
                l_eps = torch.clamp((gap - p.eps_target) / p.eps0, min=0.0).mean()
                loss = loss + gamma_t * l_eps
                stats["l_eps"] = float(l_eps.detach())
            loss = loss + delta_t * l_s  # L_s carries no gradient (⚑): it only drives δ_t
            opt.zero_grad()
            loss.backward()
            norms = _grad_norms(policy, value)
            if not (bool(torch.isfinite(loss)) and all(bool(torch.isfinite(norm)) for _, norm in norms)):
                opt.zero_grad()
                stats["skipped"] += 1
                continue
            for params, norm in norms:  # clip_grad_norm_(params, 1.0), reusing the norm just computed
                nn.utils.clip_grads_with_norm_(params, 1.0, norm)
            opt.step()
            stats["loss"] = float(loss.detach())
    return stats
