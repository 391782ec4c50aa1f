"""The replies of the orchestrator's HTTP API that clients and servers read: one declaration per reply.

Each reply is a frozen dataclass: the orchestrator fills one without validation (a lease reply is written on the hot
path of every request) and writes it with ``to_json``; a client reads it with ``from_json``, which validates the
JSON against the same declaration through pydantic (wrong types are an error, unknown keys are ignored, so a
regional front may add ``region`` and ``origin`` to a lease without breaking a reader).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter

from petals_chain.protocol.hop import Hop


@dataclass(frozen=True)
class LeaseInfo:
    """A granted lease: its id, chain, composition version, hops and timing (POST /lease, renew, report-failure)."""

    lease_id: str
    chain_id: str
    version: int
    spans: tuple[Hop, ...]
    ttl_s: float
    waited_s: float
    expires_in_s: float | None = None  # seconds left of the TTL when the reply was written
    current: bool | None = None  # whether its chain belongs to the current composition
    replaces: str | None = None  # the lease this one replaces (after a reported failure)
    migrate_to: LeaseInfo | None = None  # on a renew reply: the lease the orchestrator reserved for a move
    width: int | None = None  # the speculative width the orchestrator chose (a request with k_max), else absent

    def to_json(self) -> dict[str, Any]:
        """The reply as a JSON object; ``width`` and ``migrate_to`` only when set (as the API has always written)."""
        out = dict(self.__dict__)
        out["spans"] = [h._asdict() for h in self.spans]
        if self.width is None:
            del out["width"]
        if self.migrate_to is None:
            del out["migrate_to"]
        else:
            out["migrate_to"] = self.migrate_to.to_json()
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LeaseInfo:
        """A lease reply read and validated (pydantic.ValidationError when it does not match)."""
        return _LEASE.validate_python(data)


@dataclass(frozen=True)
class AssignmentInfo:
    """The blocks start:end the orchestrator wants server ``server`` to hold, and the composition version."""

    server: str
    start: int
    end: int
    version: int

    @classmethod
    def from_reply(cls, reply: dict[str, Any]) -> AssignmentInfo | None:
        """The ``assignment`` part of a server route's reply (None before the first composition)."""
        a = reply.get("assignment")
        return None if a is None else _ASSIGNMENT.validate_python(a)


_LEASE = TypeAdapter(LeaseInfo)
_ASSIGNMENT = TypeAdapter(AssignmentInfo)
