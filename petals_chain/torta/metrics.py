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


def slot_load_balance(util: np.ndarray, on: np.ndarray) -> float:
    """(11) per slot over the servers on for the whole slot, averaged over slots: ``util`` and ``on`` are
    (servers, slots) busy fractions and masks; slots with no server on are skipped (docs/torta.md, "Simulator")."""
    u, m = _util_on(util, on)
    lbs = [load_balance(u[m[:, t], t]) for t in range(u.shape[1]) if m[:, t].any()]
    if not lbs:
        raise ValueError("slot_load_balance: no server is on in any slot")
    return float(np.mean(lbs))


def horizon_load_balance(util: np.ndarray, on: np.ndarray) -> float:
    """(11) over each server's mean utilisation across the slots it was on, for every server on in some slot
    (a per-server reading of U_i over the whole horizon, reported beside the per-slot one)."""
    u, m = _util_on(util, on)
    ever = m.any(1)
    if not ever.any():
        raise ValueError("horizon_load_balance: no server is on in any slot")
    return load_balance((u * m).sum(1)[ever] / m.sum(1)[ever])


def _util_on(util: np.ndarray, on: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``util`` as floats and ``on`` as booleans of the same (servers, slots) shape."""
    u, m = np.asarray(util, dtype=float), np.asarray(on, dtype=bool)
    if u.ndim != 2 or u.shape != m.shape:
        raise ValueError(f"util/on: need two (servers, slots) arrays of one shape, got {u.shape} and {m.shape}")
    return u, m


def prediction_accuracy(pred: np.ndarray, actual: np.ndarray, eps: float = 1.0) -> float:
    """PA = exp(−mean_t |F_pred − F_act| / (F_act + ε)) over every entry (12); 1 for a perfect forecast."""
    p, a = np.asarray(pred, dtype=float), np.asarray(actual, dtype=float)
    if p.shape != a.shape:
        raise ValueError(f"prediction_accuracy: pred shape {p.shape} != actual shape {a.shape}")
    return float(np.exp(-np.mean(np.abs(p - a) / (a + eps))))


def switching_cost(a_now: np.ndarray, a_prev: np.ndarray) -> float:
    """‖A_t − A_{t−1}‖²_F on allocation matrices."""
    return float(np.sum((np.asarray(a_now) - np.asarray(a_prev)) ** 2))
