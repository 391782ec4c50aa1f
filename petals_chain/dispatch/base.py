"""The dispatch-policy protocol shared by the simulator and the live orchestrator.

A policy sees only job ids, chain indices and a clock value; it never knows
whether the clock is simulated. Each event returns the jobs that *start* (or
move) because of it, so the caller decides what service means.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from petals_chain.model import SpecError


@dataclass(frozen=True)
class Start:
    """Job ``job`` begins service on chain ``chain`` (moved off ``migrated_from`` if set)."""

    job: int
    chain: int
    migrated_from: int | None = None


@runtime_checkable
class DispatchPolicy(Protocol):
    """What every dispatch policy implements (chains are indexed as given to the constructor)."""

    name: str

    def on_arrival(self, job: int, now: float) -> list[Start]:
        """A job arrives; return the starts it causes (empty if it waits)."""
        ...

    def on_departure(self, job: int, chain: int, now: float) -> list[Start]:
        """``job`` finished on ``chain``; return the starts this frees up."""
        ...

    def queue_length(self) -> int:
        """Jobs waiting (not in service) right now."""
        ...

    def occupancy(self) -> list[int]:
        """Jobs in service on each chain right now."""
        ...


def check_chains(rates: Sequence[float], capacities: Sequence[int]) -> tuple[list[float], list[int]]:
    """Validate per-chain service rates μ_k and capacities c_k; return them as lists."""
    rates = [float(r) for r in rates]
    capacities = [int(c) for c in capacities]
    if len(rates) != len(capacities):
        raise SpecError("dispatch: rates and capacities differ in length")
    if not rates:
        raise SpecError("dispatch: at least one chain is required")
    for k, (r, c) in enumerate(zip(rates, capacities)):
        if not (r > 0 and r < float("inf")):
            raise SpecError(f"dispatch: chain {k} has rate {r!r}; it must be finite and > 0")
        if c < 1:
            raise SpecError(f"dispatch: chain {k} has capacity {c}; it must be >= 1")
    return rates, capacities
