"""JIQ (join the idle queue) extended to chains with c_l parallel slots (docs/model.md, "Dispatch baselines")."""

from __future__ import annotations

from petals_chain.dispatch.per_chain import PerChainFCFS
from petals_chain.kernels.dispatch_rules import JIQ_CODE


class JIQ(PerChainFCFS):
    """Join a uniformly random chain with a free slot; if none, a uniformly random chain."""

    name = "JIQ"
    code = JIQ_CODE
