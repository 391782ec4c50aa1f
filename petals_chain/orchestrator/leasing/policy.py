"""The lease manager's declared policy: which chain a waiting request gets, and what the manager can do besides.

The shape of Ray Serve's request routers: :class:`~petals_chain.orchestrator.leasing.leases.LeaseManager` owns the
queue,
the slots, the TTLs and the bookkeeping; a :class:`LeasePolicy` makes one decision, the chain each waiting request
starts on, through the :class:`ChainDispatcher` it builds over the chains offered now (JFFC by default, TORTA's
greedy score within a region, Mell's packers). A lease manager declares what it can do beyond leasing fixed chains in
its :class:`LeaseCapabilities`, and the engine (API, metrics, dashboard, drain, CLI) asks those instead of
recognising a manager by its class.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from petals_chain.dispatch.base import Start
from petals_chain.dispatch.jffc import JFFC


class ChainDispatcher(Protocol):
    """The decision over one set of chains (indices into it): satisfied structurally by the dispatch policies
    (:class:`~petals_chain.dispatch.jffc.JFFC`, TORTA's ``GreedyScoreChains``, Mell's ``PackingPolicy``)."""

    def on_arrival(self, job: int, now: float = 0.0) -> list[Start]:
        """A request arrives: the starts it causes (its own, if a chain is free)."""

    def on_resume(self, job: int, now: float = 0.0) -> list[Start]:
        """A request that held a slot before comes back ahead of every later one: the starts it causes."""

    def on_departure(self, job: int, chain: int, now: float = 0.0) -> list[Start]:
        """A request leaves ``chain``: the starts its freed slot causes."""

    def occupy(self, chain: int) -> bool:
        """Take a slot of ``chain`` for a lease carried over a recomposition; False if it is full."""

    def cancel(self, job: int) -> bool:
        """Take a waiting request out of line; False if it was not waiting."""

    def queue_length(self) -> int:
        """Requests waiting now."""

    def queued_jobs(self) -> list[int]:
        """The waiting requests, in line order."""

    def occupancy(self) -> list[int]:
        """Slots in use per chain."""


class LeasePolicy(Protocol):
    """Which chain a waiting request gets: a named factory of the dispatcher over the chains offered now."""

    name: str

    def dispatcher(self, rates: Sequence[float], capacities: Sequence[int]) -> ChainDispatcher:
        """The decision over chains with these service rates (1/s) and slot counts, in offer order."""


@dataclass(frozen=True)
class DispatchPolicy:
    """A :class:`LeasePolicy` that builds one dispatch class over the chains (``make(rates, capacities)``)."""

    name: str
    """How the CLI and the docs call it."""
    make: Callable[[Sequence[float], Sequence[int]], ChainDispatcher]
    """The dispatcher's constructor over the chains' rates and capacities."""

    def dispatcher(self, rates: Sequence[float], capacities: Sequence[int]) -> ChainDispatcher:
        """The dispatcher over these chains."""
        return self.make(rates, capacities)


JFFC_POLICY = DispatchPolicy("jffc", JFFC)  # the default: the fastest chain with a free slot, one FIFO queue


@dataclass(frozen=True)
class LeaseCapabilities:
    """What a lease manager does beyond granting slots of fixed chains (declared, never inferred from its class)."""

    routes_over_placement: bool = False
    """Routes each request over the placement (it is told each composition; no fixed chains offered): WS-RR."""
    moves_sessions: bool = False
    """Moves running sessions between chains (offers, commits, rolls back moves; drains servers)."""
    fixed_chains: bool = True
    """Leases slots of the composed chains (so leases survive a restart and a width rule can size them)."""
    packs: bool = False
    """Places sessions by a bin-packing scheduler rather than JFFC (a Mell packer: no drains)."""
