"""The chains of a composition as the orchestrator offers them: hops (:class:`~petals_chain.protocol.hop.Hop`),
capacity c_k, time T_k.

Kept apart from the registry because the lease managers and the metrics use them without the registry.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from petals_chain.model import Composition
from petals_chain.protocol.hop import Hop


@dataclass(frozen=True)
class ChainInfo:
    """A chain of the current composition: its hops, capacity c_k and service time T_k."""

    spans: tuple[Hop, ...]  # server and blocks; peer ids and addresses are filled in when a lease is written
    capacity: int
    service_time_s: float
    chain_id: str = ""
    key: tuple[tuple[str, int, int], ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", tuple((s.server, s.start, s.end) for s in self.spans))

    @property
    def rate_per_s(self) -> float:
        """μ_k = 1 / T_k."""
        return 1.0 / self.service_time_s


def total_rate_per_s(chains: Iterable[ChainInfo]) -> float:
    """ν = Σ_k c_k μ_k of these chains (``Composition.total_rate_per_s`` for the chains as offered)."""
    return sum(c.capacity * c.rate_per_s for c in chains)


def chain_infos(composition: Composition, version: int) -> list[ChainInfo]:
    """The composition's chains in its own order (= JFFC chain indices) as hops."""
    out = []
    for k, ch in enumerate(composition.chains):
        spans = tuple(Hop(composition.servers[j].name, a, b) for j, a, b in ch.petals_spans())
        out.append(ChainInfo(spans, ch.capacity, ch.service_time_s, f"v{version}.{k}"))
    return out
