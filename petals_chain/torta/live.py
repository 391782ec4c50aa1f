"""TORTA's live lease policy: how a region's orchestrator picks the chain for each waiting request (``--micro``).

The greedy score (7)–(10) of :mod:`petals_chain.torta.chain_score` as a lease policy
(``petals_chain.orchestrator.leasing.policy.LeasePolicy``, satisfied structurally: this library imports nothing of the
orchestrator). The macro layer's live decisions (which region serves each origin) are
:class:`~petals_chain.torta.regional.RegionalMacro`'s; the regional HTTP front that applies them stays in
``orchestrator/regions/`` (it needs the engine's types). The live demo's topology is
:mod:`petals_chain.torta.live_demo`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from petals_chain.torta.chain_score import GreedyScoreChains
from petals_chain.torta.params import DEFAULT, TortaParams


@dataclass(frozen=True)
class GreedyScorePolicy:
    """The live lease policy of a region's orchestrator (``orchestrator.lease_policy.LeasePolicy``, satisfied
    structurally): the free chain of highest greedy score takes each waiting request."""

    name: str = "greedy"
    """How ``--micro`` calls it."""
    params: TortaParams = DEFAULT
    """The score's weights and decay."""

    def dispatcher(self, rates: Sequence[float], capacities: Sequence[int]) -> GreedyScoreChains:
        """The greedy rule over chains with these rates and capacities."""
        return GreedyScoreChains(rates, capacities, self.params)
