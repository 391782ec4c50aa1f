"""How the orchestrator composes its live servers: the method's composer and the load it sizes the chains for.

A :class:`CompositionPolicy` is built once (from ``--method``, ``--arrival-rate``, ``--target-load``, ``--c`` and
``--tune``, or a cluster file's load: :func:`petals_chain.orchestrator.cli.registry_and_policy`) and handed to
:class:`~petals_chain.orchestrator.engine.core.Orchestrator` at construction. It bundles λ, ρ̄, c and the tuning
criterion
so that they travel as one frozen value; the registry (:mod:`petals_chain.orchestrator.state.registry`) stays a table of
servers and only installs what this policy computed. Its defaults are the command line's: the ``proposed`` method,
λ = ``defaults.ARRIVAL_RATE``, ρ̄ = ``defaults.TARGET_LOAD``, c tuned by the Theorem 3.7 lower bound.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar

from pydantic import Field, StrictInt, field_validator

from petals_chain import defaults
from petals_chain.compose.method_table import Composer, proposed_composition
from petals_chain.declared import Declared, one_of, real
from petals_chain.model import Composition, ModelSpec, ServerSpec, SpecError

MAX_ARRIVAL_RATE = 1e9  # requests/s; more is a typo


class CompositionPolicy(Declared):
    """The composer of the serving method and the settings it is called with, fixed for the orchestrator's life."""

    OWNER: ClassVar[str] = "composition policy"

    composer: Any = proposed_composition
    """(servers, model, λ, ρ̄, c, tune) -> Composition: the method's (``METHODS[name].compose``); default proposed."""
    arrival_rate: Annotated[float, Field(gt=0.0, le=MAX_ARRIVAL_RATE, strict=False)] = defaults.ARRIVAL_RATE
    """λ, requests per second the composition is sized for."""
    target_load: Annotated[float, Field(gt=0.0, le=1.0)] = defaults.TARGET_LOAD
    """ρ̄, the utilisation the composition aims at, in (0, 1]."""
    c: Annotated[StrictInt, Field(ge=1)] | None = None
    """A fixed reserved concurrency; None: tuned by ``tune`` (only methods that tune c read it)."""
    tune: str = "lower"
    """How c is tuned: one of :data:`petals_chain.compose.tuning.CRITERIA`."""

    @field_validator("composer")
    @classmethod
    def _composer(cls, value: Any) -> Composer:
        if not callable(value):
            raise ValueError("must be a composer (servers, model, arrival_rate, target_load, c, tune) -> Composition")
        return value

    @field_validator("arrival_rate", "target_load", mode="before")
    @classmethod
    def _real(cls, value: Any) -> Any:
        return real(value)

    @field_validator("tune")
    @classmethod
    def _tune(cls, value: str) -> str:
        from petals_chain.compose.tuning import CRITERIA

        return one_of(value, CRITERIA)

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

