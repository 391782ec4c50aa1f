"""How the orchestrator composes its live servers: the method's composer and the load it sizes the chains for.

A :class:`CompositionPolicy` is built once (from ``--method``, ``--arrival-rate``, ``--target-load``, ``--c`` and
``--tune``, or a cluster file's load: :func:`petals_chain.orchestrator.cli.registry_and_policy`) and handed to
:class:`~petals_chain.orchestrator.core.Orchestrator` at construction. It bundles λ, ρ̄, c and the tuning criterion
so that they travel as one frozen value; the registry (:mod:`petals_chain.orchestrator.registry`) stays a table of
servers and only installs what this policy computed. Its defaults are the command line's: the ``proposed`` method,
λ = ``defaults.ARRIVAL_RATE``, ρ̄ = ``defaults.TARGET_LOAD``, c tuned by the Theorem 3.7 lower bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from petals_chain import defaults
from petals_chain.compose.method_table import Composer, proposed_composition
from petals_chain.model import Composition, ModelSpec, ServerSpec, SpecError

MAX_ARRIVAL_RATE = 1e9  # requests/s; more is a typo


@dataclass(frozen=True)
class CompositionPolicy:
    """The composer of the serving method and the settings it is called with, fixed for the orchestrator's life."""

    composer: Composer = proposed_composition
    """(servers, model, λ, ρ̄, c, tune) -> Composition: the method's (``METHODS[name].compose``); default proposed."""
    arrival_rate: float = defaults.ARRIVAL_RATE
    """λ, requests per second the composition is sized for."""
    target_load: float = defaults.TARGET_LOAD
    """ρ̄, the utilisation the composition aims at, in (0, 1]."""
    c: int | None = None
    """A fixed reserved concurrency; None: tuned by ``tune`` (only methods that tune c read it)."""
    tune: str = "lower"
    """How c is tuned: one of :data:`petals_chain.compose.tuning.CRITERIA`."""

    def __post_init__(self) -> None:
        from petals_chain.compose.tuning import CRITERIA

        def bad(name: str, want: str) -> SpecError:
            return SpecError(f"composition policy: field '{name}' must be {want}, got {getattr(self, name)!r}")

        if not callable(self.composer):
            raise bad("composer", "a composer (servers, model, arrival_rate, target_load, c, tune) -> Composition")
        if not _number_in(self.arrival_rate, 0.0, MAX_ARRIVAL_RATE):
            raise bad("arrival_rate", f"a finite number in (0, {MAX_ARRIVAL_RATE:g}] (requests per second)")
        if not _number_in(self.target_load, 0.0, 1.0):
            raise bad("target_load", "a finite number in (0, 1]")
        if self.c is not None and (isinstance(self.c, bool) or not isinstance(self.c, int) or self.c < 1):
            raise bad("c", "an integer >= 1 or None (tuned)")
        if self.tune not in CRITERIA:
            raise bad("tune", f"one of {', '.join(CRITERIA)}")
        object.__setattr__(self, "arrival_rate", float(self.arrival_rate))
        object.__setattr__(self, "target_load", float(self.target_load))

    def compose(self, servers: Sequence[ServerSpec], model: ModelSpec) -> Composition:
        """Run the composer on the given servers (pure; safe to call off the event loop)."""
        return self.composer(servers, model, self.arrival_rate, self.target_load, c=self.c, tune=self.tune)

    def try_compose(self, servers: Sequence[ServerSpec], model: ModelSpec) -> tuple[Composition | None, str | None]:
        """compose(), turning 'no servers' and infeasibility into (None, reason)."""
        if not servers:
            return None, "no live servers"
        try:
            return self.compose(servers, model), None
        except (SpecError, ValueError) as exc:  # InfeasibleError is a ValueError
            return None, f"{type(exc).__name__}: {exc}"


def _number_in(value: Any, low: float, high: float) -> bool:
    """A finite real number (not a bool) in (low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (not isinstance(value, float) or math.isfinite(value)) and low < value <= high
