"""SED (smallest expected delay) for chains with c_l parallel slots (docs/model.md, "Dispatch baselines")."""

from __future__ import annotations

from petals_chain.dispatch.per_chain import PerChainFCFS
from petals_chain.kernels.dispatch_rules import SED_CODE


class SED(PerChainFCFS):
    """Join the chain minimising 1/μ_l + (Z_l - c_l + 1)⁺ / (μ_l c_l); ties broken uniformly at random."""

    name = "SED"
    code = SED_CODE
