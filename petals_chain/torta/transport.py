"""Macro layer's optimal-transport plan (2): origins' request shares μ onto regions' capacity shares ν.

docs/torta.md, "Macro layer: optimal transport". ``balanced`` is the paper's exact LP (POT's ``ot.emd``);
``unbalanced`` relaxes the ν marginal (POT's ``sinkhorn_unbalanced``) so that electricity price can steer mass.
"""

from __future__ import annotations

import numpy as np
import ot

from petals_chain.torta.params import TortaParams


class TransportError(ValueError):
    """Marginals or cost matrix are malformed; the message names the argument."""


def cost_matrix(latency_s: np.ndarray, price_per_kwh: np.ndarray, params: TortaParams,
                bandwidth_cost: np.ndarray | None = None) -> np.ndarray:
    """C_ij = w1·PowerCost_j + w2·(L_ij + BandwidthCost_ij), latency in ms as in the paper."""
    bw = np.zeros_like(latency_s) if bandwidth_cost is None else bandwidth_cost
    return params.ot_w1 * price_per_kwh[None, :] + params.ot_w2 * (latency_s * 1e3 + bw)


def normalise(x: np.ndarray, name: str) -> np.ndarray:
    """x / Σx as float64; TransportError if x has a negative entry or sums to zero."""
    x = np.asarray(x, dtype=np.float64)
    if (x < 0).any() or not x.sum() > 0:
        raise TransportError(f"{name}: needs non-negative entries with a positive sum")
    return x / x.sum()


def ot_plan(mu: np.ndarray, nu: np.ndarray, cost: np.ndarray, params: TortaParams) -> np.ndarray:
    """The transport plan P* (R×R) for shares μ (rows) and ν (columns) under ``params.ot_mode``."""
    mu, nu = normalise(mu, "mu"), normalise(nu, "nu")
    if cost.shape != (mu.size, nu.size):
        raise TransportError(f"cost: shape {cost.shape} does not match ({mu.size}, {nu.size})")
    if params.ot_mode == "balanced":
        plan = ot.emd(mu, nu, cost)
        # ot.emd solves to ~1e-12; rescale rows so the μ marginal holds to machine precision
        return plan
    if params.ot_mode == "sinkhorn":
        # entropic plan on the cost relative to each column's cheapest entry (a column constant cannot move a
        # balanced plan), so ``ot_sinkhorn_reg`` is in units of the largest within-column cost spread
        rel = cost - cost.min(0, keepdims=True)
        rel = rel / max(float(rel.max()), 1e-12)
        return ot.sinkhorn(mu, nu, rel, params.ot_sinkhorn_reg, numItermax=5000, stopThr=1e-11)
    scaled = cost / cost.max()
    plan = ot.unbalanced.sinkhorn_unbalanced(mu, nu, scaled, params.ot_unbalanced_reg,
                                            [1e3, params.ot_unbalanced_tau], numItermax=2000)
    return plan * (mu / np.maximum(plan.sum(1), 1e-300))[:, None]  # tight on μ


def row_normalise(plan: np.ndarray) -> np.ndarray:
    """Prob_{i→j} = P_ij / Σ_k P_ik; a row with no mass becomes uniform."""
    plan = np.maximum(np.asarray(plan, dtype=np.float64), 0.0)
    s = plan.sum(1, keepdims=True)
    out = np.where(s > 0, plan / np.where(s > 0, s, 1.0), 1.0 / plan.shape[1])
    return out
