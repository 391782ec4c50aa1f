"""SED (smallest expected delay) for chains with c_l parallel slots (docs/model.md, "Dispatch baselines")."""

from __future__ import annotations

from petals_chain.dispatch.per_chain import PerChainFCFS, pick


class SED(PerChainFCFS):
    """Join the chain minimising 1/μ_l + (Z_l - c_l + 1)⁺ / (μ_l c_l); ties broken uniformly at random."""

    name = "SED"

    def choose(self, u: float) -> int:
        best = 0.0
        ties: list[int] = []
        for k, (mu, c) in enumerate(zip(self.rates, self.capacities)):
            key = 1.0 / mu + max(self.number_at(k) - c + 1, 0) / (mu * c)
            if not ties or key < best:
                best = key
                ties = [k]
            elif key == best:
                ties.append(k)
        return pick(ties, u)
