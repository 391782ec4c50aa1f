"""The paper's metrics: load balance (11), prediction accuracy (12), switching cost, and mean ± CI helpers.

docs/torta.md, "Simulator".
"""

from __future__ import annotations

import numpy as np


def load_balance(util: np.ndarray) -> float:
    """LB = 1 / (1 + CV) of the utilisations ``util`` (11); 1.0 when all are equal or all zero."""
    u = np.asarray(util, dtype=float)
    if u.size == 0:
        raise ValueError("load_balance: util is empty")
    m = u.mean()
    if m <= 0:
        return 1.0
    return float(1.0 / (1.0 + u.std() / m))


def prediction_accuracy(pred: np.ndarray, actual: np.ndarray, eps: float = 1.0) -> float:
    """PA = exp(−mean_t |F_pred − F_act| / (F_act + ε)) over every entry (12); 1 for a perfect forecast."""
    p, a = np.asarray(pred, dtype=float), np.asarray(actual, dtype=float)
    if p.shape != a.shape:
        raise ValueError(f"prediction_accuracy: pred shape {p.shape} != actual shape {a.shape}")
    return float(np.exp(-np.mean(np.abs(p - a) / (a + eps))))


def switching_cost(a_now: np.ndarray, a_prev: np.ndarray) -> float:
    """‖A_t − A_{t−1}‖²_F on allocation matrices."""
    return float(np.sum((np.asarray(a_now) - np.asarray(a_prev)) ** 2))
