"""JSQ and speed-aware JSQ extended to chains with c_l parallel slots (docs/model.md, "Dispatch baselines")."""

from __future__ import annotations

from petals_chain.dispatch.per_chain import PerChainFCFS, pick


class JSQ(PerChainFCFS):
    """Join the chain minimising (Z_l - c_l + 1)⁺ / c_l; ties broken uniformly at random."""

    name = "JSQ"

    def _argmin_keys(self) -> list[int]:
        """Chains with the smallest normalised queue length (Z_l - c_l + 1)⁺ / c_l, in index order."""
        best = 0.0
        ties: list[int] = []
        for k, c in enumerate(self.capacities):
            key = max(self.number_at(k) - c + 1, 0) / c
            if not ties or key < best:
                best = key
                ties = [k]
            elif key == best:
                ties.append(k)
        return ties

    def choose(self, u: float) -> int:
        return pick(self._argmin_keys(), u)


class SAJSQ(JSQ):
    """Speed-aware JSQ: JSQ's key, ties to the fastest chain (random among equally fast ones)."""

    name = "SA-JSQ"

    def choose(self, u: float) -> int:
        ties = self._argmin_keys()
        fastest = max(self.rates[k] for k in ties)
        return pick([k for k in ties if self.rates[k] == fastest], u)
