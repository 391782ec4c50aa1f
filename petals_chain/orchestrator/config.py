"""The orchestrator's settings, declared once and validated once (the shape of vLLM's ``SchedulerConfig``).

An :class:`OrchestratorConfig` is built from the command line (:func:`petals_chain.orchestrator.cli.engine_config`),
from a mapping (a JSON or YAML file: :meth:`OrchestratorConfig.from_file`) or in code, and handed to
:class:`~petals_chain.orchestrator.core.Orchestrator` at construction; nothing is set on the orchestrator afterwards.
A bad value is refused with one line naming the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from petals_chain import defaults
from petals_chain.model import ServerSpec, SpecError
from petals_chain.orchestrator.compose_runner import COMPOSE_IN
from petals_chain.orchestrator.migration import MIGRATION_POLICIES


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """A read-only copy of ``mapping`` (a frozen config must not change under its holder)."""
    return None if mapping is None else MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class OrchestratorConfig:
    """Everything that shapes the engine's behaviour, fixed for the orchestrator's lifetime."""

    lease_ttl_s: float = defaults.LEASE_TTL_S
    """A lease not renewed for this long expires (the lease manager's default_ttl_s)."""
    heartbeat_timeout_s: float | None = defaults.HEARTBEAT_TIMEOUT_S
    """A registered server silent this long is marked dead; None: never."""
    max_waiting: int = defaults.MAX_WAITING
    """Most lease requests allowed to wait in the central queue at once."""
    offer_when_serving: bool = False
    """Offer a chain only once every server on it reports (by heartbeat) that it serves its span."""
    migration: str = "none"
    """How JFFC leases move running sessions between chains (:data:`MIGRATION_POLICIES`)."""
    repair: bool = True
    """Repair the installed composition at once when servers leave or join (compose/repair.py), before the full
    recomposition lands."""
    compose_in: str = "auto"
    """Where a full recomposition runs: ``thread``, ``process`` or ``auto`` (a worker process for a large swarm)."""
    pinned: Mapping[str, ServerSpec] = field(default_factory=dict)
    """Servers whose tau_p/tau_c (and serial fraction) stay as planned whatever they report, by name."""
    model_source: Mapping[str, Any] | None = None
    """With --model: what GET /swarm tells clients about the checkpoint (source, dtype, quantisation, length)."""
    dht_info: Mapping[str, Any] | None = None
    """With a DHT: its initial peers and the model's prefix, as GET /health and GET /swarm report them."""

    def __post_init__(self) -> None:
        def bad(name: str, want: str) -> SpecError:
            return SpecError(f"orchestrator config: field '{name}' must be {want}, got {getattr(self, name)!r}")

        ttl = self.lease_ttl_s
        if not (isinstance(ttl, (int, float)) and not isinstance(ttl, bool) and math.isfinite(ttl) and ttl > 0):
            raise bad("lease_ttl_s", "a finite number > 0 (the leases' default_ttl_s)")
        hb = self.heartbeat_timeout_s
        if hb is not None and not (isinstance(hb, (int, float)) and not isinstance(hb, bool) and math.isfinite(hb)
                                   and hb > 0):
            raise bad("heartbeat_timeout_s", "a finite number > 0 or None (off)")
        if isinstance(self.max_waiting, bool) or not isinstance(self.max_waiting, int) or self.max_waiting < 0:
            raise bad("max_waiting", "an integer >= 0")
        if not isinstance(self.offer_when_serving, bool):
            raise bad("offer_when_serving", "true or false")
        if not isinstance(self.repair, bool):
            raise bad("repair", "true or false")
        if self.compose_in not in COMPOSE_IN:
            raise bad("compose_in", f"one of {', '.join(COMPOSE_IN)}")
        if self.migration not in MIGRATION_POLICIES:
            raise bad("migration", f"one of {', '.join(MIGRATION_POLICIES)}")
        if not all(isinstance(k, str) and isinstance(v, ServerSpec) for k, v in dict(self.pinned).items()):
            raise bad("pinned", "a mapping of server names to ServerSpec")
        object.__setattr__(self, "pinned", MappingProxyType(dict(self.pinned)))
        object.__setattr__(self, "model_source", _frozen(self.model_source))
        object.__setattr__(self, "dht_info", _frozen(self.dht_info))

    def replace(self, **changes: Any) -> OrchestratorConfig:
        """A copy with ``changes`` (validated again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any], *, where: str = "orchestrator config") -> OrchestratorConfig:
        """A config from plain values (a parsed file); an unknown key is refused by name. ``pinned`` is not read
        from a file (it comes with a cluster file's servers)."""
        known = {f.name for f in dataclasses.fields(cls)} - {"pinned"}
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
