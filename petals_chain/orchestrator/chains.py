"""The chains of a composition as the orchestrator hands them out: named PETALS spans, capacity c_k, time T_k.

Kept apart from the registry because the lease managers and the metrics use them without the registry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from petals_chain.model import Composition


@dataclass(frozen=True)
class SpanInfo:
    """One hop of a chain as PETALS sees it: server name and blocks start:end (0-indexed, end exclusive)."""

    server: str
    start: int
    end: int


@dataclass(frozen=True)
class ChainInfo:
    """A chain of the current composition: its hops, capacity c_k and service time T_k."""

    spans: tuple[SpanInfo, ...]
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


def chain_infos(composition: Composition, version: int) -> list[ChainInfo]:
    """The composition's chains in its own order (= JFFC chain indices) as named PETALS spans."""
    out = []
    for k, ch in enumerate(composition.chains):
        spans = tuple(SpanInfo(composition.servers[j].name, a, b) for j, a, b in ch.petals_spans())
        out.append(ChainInfo(spans, ch.capacity, ch.service_time_s, f"v{version}.{k}"))
    return out
