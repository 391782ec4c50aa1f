"""JIQ (join the idle queue) extended to chains with c_l parallel slots (docs/model.md, "Dispatch baselines")."""

from __future__ import annotations

from petals_chain.dispatch.per_chain import PerChainFCFS, pick


class JIQ(PerChainFCFS):
    """Join a uniformly random chain with a free slot; if none, a uniformly random chain."""

    name = "JIQ"

    def choose(self, u: float) -> int:
        idle = [k for k, c in enumerate(self.capacities) if self._busy[k] < c]
        if idle:
            return pick(idle, u)
        return pick(range(len(self.capacities)), u)
