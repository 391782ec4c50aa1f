"""A bounded ring of the leases that ended most recently, with their waiting and holding times.

The histograms of :mod:`petals_chain.orchestrator.leasing.leases` keep the distribution of every lease ever granted; the
live page (:mod:`petals_chain.orchestrator.http.dashboard`) also shows the last requests one by one, so the lease
manager
keeps the newest few here. Memory stays bounded however long the orchestrator runs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from petals_chain.orchestrator.engine.chains import ChainInfo

RECENT_LEASES = 100  # finished leases kept for the live page
OUTCOMES = ("released", "failed", "expired")  # how a lease ended: by its client, by a reported failure, by its TTL


class EndedLease(Protocol):
    """What is kept of a lease that ended (a :class:`~petals_chain.orchestrator.leasing.leases.Lease` is one)."""

    lease_id: str
    chain: ChainInfo
    client: str | None
    waited_s: float
    granted_s: float

    @property
    def chain_id(self) -> str:
        """The chain's id."""


@dataclass(frozen=True)
class FinishedLease:
    """One lease that ended: who held which chain, how long it waited for it and how long it held it."""

    lease_id: str
    chain_id: str
    servers: tuple[str, ...]
    client: str | None
    waited_s: float
    held_s: float
    outcome: str
    ended_s: float  # on the orchestrator's clock

    def to_json(self, now_s: float) -> dict[str, Any]:
        """JSON form for the live page; ``ended_ago_s`` is measured from ``now_s``."""
        return {
            "lease_id": self.lease_id,
            "chain_id": self.chain_id,
            "servers": list(self.servers),
            "client": self.client,
            "waited_s": self.waited_s,
            "held_s": self.held_s,
            "response_s": self.waited_s + self.held_s,
            "outcome": self.outcome,
            "ended_ago_s": max(0.0, now_s - self.ended_s),
        }


class RecentLeases:
    """The newest ``maxlen`` finished leases (older ones drop out)."""

    def __init__(self, maxlen: int = RECENT_LEASES) -> None:
        if isinstance(maxlen, bool) or not isinstance(maxlen, int) or maxlen < 1:
            raise ValueError(f"recent leases: field 'maxlen' must be an integer >= 1, got {maxlen!r}")
        self._ring: deque[FinishedLease] = deque(maxlen=maxlen)

    def add(self, lease: EndedLease, now_s: float, outcome: str) -> None:
        """Record that ``lease`` ended at ``now_s`` (``outcome`` one of OUTCOMES)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"recent leases: field 'outcome' must be one of {OUTCOMES}, got {outcome!r}")
        self._ring.append(FinishedLease(
            lease_id=lease.lease_id,
            chain_id=lease.chain_id,
            servers=tuple(s.server for s in lease.chain.spans),
            client=lease.client,
            waited_s=lease.waited_s,
            held_s=max(0.0, now_s - lease.granted_s),
            outcome=outcome,
            ended_s=now_s,
        ))

    def newest_first(self) -> list[FinishedLease]:
        """The kept leases, the one that ended last first."""
        return list(reversed(self._ring))

    def __len__(self) -> int:
        return len(self._ring)
