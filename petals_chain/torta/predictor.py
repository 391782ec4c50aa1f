"""Demand predictor of the macro layer: an MLP from the last K slots' arrivals per origin to the next slot's.

docs/torta.md, "Demand predictor". Input: the last K slots of per-origin counts (scaled) and the target slot's
time of day; hidden 512, 256, ReLU; softplus output (counts, not shares ⚑); loss MSE + 1e-4‖θ‖²; trained offline.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class DemandPredictor(nn.Module):
    """MLP (K·R + 2) → 512 → 256 → R with a softplus output, in units of ``scale`` requests."""

    def __init__(self, regions: int, history_k: int, scale: float) -> None:
        super().__init__()
        self.regions, self.history_k, self.scale = regions, history_k, float(scale)
        self.net = nn.Sequential(nn.Linear(history_k * regions + 2, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(),
                                 nn.Linear(256, regions), nn.Softplus())

    def features(self, counts: np.ndarray, t: int, slots_per_day: float) -> np.ndarray:
        """Input row for predicting slot t from counts[t−K:t] (zero-padded before slot 0)."""
        k, r = self.history_k, self.regions
        hist = np.zeros((k, r))
        lo = max(0, t - k)
        if t > 0:
            hist[k - (t - lo):] = counts[lo:t]
        ang = 2 * np.pi * t / slots_per_day
        return np.concatenate([hist.ravel() / self.scale, [np.sin(ang), np.cos(ang)]])

    def predict(self, counts: np.ndarray, t: int, slots_per_day: float) -> np.ndarray:
        """F_t: predicted arrivals per origin in slot t, from the counts seen before it."""
        with torch.no_grad():
            x = torch.as_tensor(self.features(counts, t, slots_per_day), dtype=torch.float32)
            return self.net(x).numpy().astype(float) * self.scale


def train_predictor(series: list[np.ndarray], history_k: int, slots_per_day: float, seed: int,
                    steps: int = 400) -> DemandPredictor:
    """Fit a predictor on (slots, R) count series (offline, full-batch Adam with weight decay 1e-4)."""
    torch.manual_seed(seed)
    r = series[0].shape[1]
    scale = max(1.0, float(np.mean([s.mean() for s in series])))
    model = DemandPredictor(r, history_k, scale)
    xs = np.stack([model.features(s, t, slots_per_day) for s in series for t in range(1, s.shape[0])])
    ys = np.concatenate([s[1:] for s in series]) / scale
    x, y = torch.as_tensor(xs, dtype=torch.float32), torch.as_tensor(ys, dtype=torch.float32)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, weight_decay=1e-4)
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model.net(x), y)
        loss.backward()
        opt.step()
    return model


def noisy_oracle(actual: np.ndarray, accuracy: float, rng: np.random.Generator) -> np.ndarray:
    """A forecast of ``actual`` whose relative error is −ln(accuracy) per entry (random sign): PA ≈ accuracy."""
    if not 0 < accuracy <= 1:
        raise ValueError(f"accuracy: must be in (0, 1], got {accuracy}")
    err = -np.log(accuracy)
    sign = rng.choice([-1.0, 1.0], size=np.shape(actual))
    return np.maximum(0.0, np.asarray(actual, dtype=float) * (1 + sign * err))
