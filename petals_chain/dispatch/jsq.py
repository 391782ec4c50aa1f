"""JSQ and speed-aware JSQ extended to chains with c_l parallel slots (docs/model.md, "Dispatch baselines")."""

from __future__ import annotations

from petals_chain.dispatch.per_chain import PerChainFCFS
from petals_chain.kernels.dispatch_rules import JSQ_CODE, SA_JSQ_CODE


class JSQ(PerChainFCFS):
    """Join the chain minimising (Z_l - c_l + 1)⁺ / c_l; ties broken uniformly at random."""

    name = "JSQ"
    code = JSQ_CODE


class SAJSQ(JSQ):
    """Speed-aware JSQ: JSQ's key, ties to the fastest chain (random among equally fast ones)."""

    name = "SA-JSQ"
    code = SA_JSQ_CODE
