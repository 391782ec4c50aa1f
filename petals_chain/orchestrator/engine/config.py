"""The orchestrator's settings, declared once and validated once (the shape of vLLM's ``SchedulerConfig``).

An :class:`OrchestratorConfig` is built from the command line (:func:`petals_chain.orchestrator.cli.engine_config`),
from a mapping (a JSON or YAML file: :meth:`OrchestratorConfig.from_file`) or in code, and handed to
:class:`~petals_chain.orchestrator.engine.core.Orchestrator` at construction; nothing is set on the orchestrator
afterwards.
A bad value is refused with one line naming the field.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, ClassVar

from pydantic import Field, StrictBool, StrictFloat, StrictInt, field_validator

from petals_chain import defaults
from petals_chain.declared import Declared, one_of, real
from petals_chain.model import ServerSpec, SpecError
from petals_chain.orchestrator.engine.compose_runner import COMPOSE_IN
from petals_chain.orchestrator.leasing.policies import LEASE_POLICIES


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A read-only copy of ``mapping`` (a frozen config must not change under its holder)."""
    return None if mapping is None else MappingProxyType(dict(mapping))


class OrchestratorConfig(Declared):
    """Everything that shapes the engine's behaviour, fixed for the orchestrator's lifetime."""

    OWNER: ClassVar[str] = "orchestrator config"

    lease_ttl_s: Annotated[StrictFloat, Field(gt=0.0)] = defaults.LEASE_TTL_S
    """A lease not renewed for this long expires (the lease manager's default_ttl_s)."""
    heartbeat_timeout_s: Annotated[StrictFloat, Field(gt=0.0)] | None = defaults.HEARTBEAT_TIMEOUT_S
    """A registered server silent this long is marked dead; None: never."""
    max_waiting: Annotated[StrictInt, Field(ge=0)] = defaults.MAX_WAITING
    """Most lease requests allowed to wait in the central queue at once."""
    offer_when_serving: StrictBool = False
    """Offer a chain only once every server on it reports (by heartbeat) that it serves its span."""
    migration: str = "none"
    """How JFFC leases move running sessions between chains (the registry's ``migration`` role:
    :data:`~petals_chain.orchestrator.leasing.policies.LEASE_POLICIES`)."""
    repair: StrictBool = True
    """Repair the installed composition at once when servers leave or join (compose/repair.py), before the full
    recomposition lands."""
    compose_in: str = "auto"
    """Where a full recomposition runs: ``thread``, ``process`` or ``auto`` (a worker process for a large swarm)."""
    pinned: Any = Field(default_factory=dict, validate_default=True)
    """Servers whose tau_p/tau_c (and serial fraction) stay as planned whatever they report, by name."""
    model_source: Any = None
    """With --model: what GET /swarm tells clients about the checkpoint (source, dtype, quantisation, length)."""
    dht_info: Any = None
    """With a DHT: its initial peers and the model's prefix, as GET /health and GET /swarm report them."""

    @field_validator("lease_ttl_s", mode="before")
    @classmethod
    def _ttl(cls, value: Any) -> float:
        return real(value, ok=lambda v: 0 < v < float("inf"), want="a finite number > 0 (the leases' default_ttl_s)")

    @field_validator("migration")
    @classmethod
    def _migration(cls, value: str) -> str:
        return one_of(value, LEASE_POLICIES.names("migration"))

    @field_validator("compose_in")
    @classmethod
    def _compose_in(cls, value: str) -> str:
        return one_of(value, COMPOSE_IN)

    @field_validator("pinned")
    @classmethod
    def _pinned(cls, value: Any) -> Mapping[str, ServerSpec]:
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, ServerSpec)
                                                     for k, v in value.items()):
            raise ValueError("must be a mapping of server names to ServerSpec")
        return MappingProxyType(dict(value))

    @field_validator("model_source", "dht_info")
    @classmethod
    def _mapping(cls, value: Any) -> Mapping[str, Any] | None:
        if value is not None and not isinstance(value, Mapping):
            raise ValueError("must be a mapping or None")
        return _frozen(value)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, where: str = "orchestrator config") -> OrchestratorConfig:
        """A config from plain values (a parsed file); an unknown key is refused by name. ``pinned`` is not read
        from a file (it comes with a cluster file's servers)."""
        known = set(cls.model_fields) - {"pinned"}
        unknown = sorted(set(values) - known)
        if unknown:
            raise SpecError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})")
        return cls(**dict(values))

    @classmethod
    def from_file(cls, path: str | Path) -> OrchestratorConfig:
        """A config from a JSON or YAML file holding one mapping of field names to values."""
        text = Path(path).read_text()
        if str(path).endswith((".yaml", ".yml")):
            import yaml

            values = yaml.safe_load(text)
        else:
            values = json.loads(text)
        if not isinstance(values, Mapping):
            raise SpecError(f"{path}: an orchestrator config is one mapping of field names to values")
        return cls.from_mapping(values, where=str(path))
