"""The request bodies of the orchestrator's HTTP API, one pydantic model per route.

Each model is what the orchestrator validates a request with (:func:`petals_chain.protocol.parsing.parse`) and
what a caller's body must match; the bounds come from :mod:`petals_chain.protocol.limits`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictStr, model_validator

from petals_chain.mell.hybrid import Mode
from petals_chain.protocol.fields import (
    BlockIndex,
    Body,
    Handle,
    Label,
    NonNegativeSeconds,
    PositiveSeconds,
    ServerName,
    TtlSeconds,
    WaitSeconds,
    Width,
)
from petals_chain.protocol.limits import DEFAULT_WAIT_S, DRAIN_TIMEOUT_S

MOVE_MODES = (Mode.KV.value, Mode.TOKEN.value)  # how a lease holder moved its session, as it reports it


class RegisterBody(Body):
    """POST /servers/register: a server's name, memory budget (bytes) and measured τp, τc (seconds)."""

    name: ServerName
    memory_bytes: Annotated[StrictFloat, Field(gt=0.0, allow_inf_nan=False)]  # upper bound: the registry's setting
    tau_p_s: PositiveSeconds
    tau_c_s: NonNegativeSeconds
    peer_id: Handle | None = None
    address: Handle | None = None


class SpanBody(Body):
    """A PETALS span as JSON: ``{"start": S, "end": E}``, blocks S..E-1 (0-indexed, end exclusive)."""

    start: BlockIndex
    end: BlockIndex

    @model_validator(mode="before")
    @classmethod
    def _shape(cls, value: Any) -> Any:
        """A list, a string or other keys: say the one accepted shape rather than pydantic's generic complaint."""
        if not (isinstance(value, dict) and set(value) == {"start", "end"}):
            raise ValueError('must be {"start": S, "end": E} (two integers)')
        return value


class HeartbeatBody(Body):
    """POST /servers/heartbeat: alive, serving a PETALS span ``{start, end}``, optionally fresh τp, τc."""

    name: ServerName
    serving: SpanBody | None = None
    tau_p_s: PositiveSeconds | None = None
    tau_c_s: NonNegativeSeconds | None = None


class LeaveBody(Body):
    """POST /servers/{name}/leave: why the server leaves (free text)."""

    reason: Label = "left"


class CordonBody(Body):
    """POST /servers/{name}/cordon (and /evict): why (free text); ``resume`` undoes it."""

    reason: Label = "cordoned by the operator"
    resume: StrictBool = False


class LeaseBody(Body):
    """POST /lease: how long to wait for a chain, the lease's TTL and a client label."""

    timeout_s: WaitSeconds = DEFAULT_WAIT_S
    ttl_s: TtlSeconds | None = None  # None: the orchestrator's lease TTL
    client: Label | None = None
    request_id: Label | None = None  # the client's handle, the same on its retries: finds its lease or place in line
    k_max: Width | None = None  # the client decodes speculatively, verifying up to k_max positions per step


class WidthBody(Body):
    """POST /width (operator): switch the width policy and measure afresh (optionally from this arrival rate)."""

    policy: Annotated[StrictStr, Field(min_length=1, max_length=32)]
    arrival_rate: Annotated[StrictFloat, Field(gt=0.0, le=1e6, allow_inf_nan=False)] | None = None


class RenewBody(Body):
    """POST /lease/{id}/renew: an optional new TTL."""

    ttl_s: TtlSeconds | None = None


class ReleaseBody(Body):
    """POST /lease/{id}/release: no fields."""


class ReportFailureBody(Body):
    """POST /lease/{id}/report-failure: the server that broke, then as POST /lease for the replacement."""

    server: ServerName
    timeout_s: WaitSeconds = DEFAULT_WAIT_S
    ttl_s: TtlSeconds | None = None


class DrainBody(Body):
    """POST /servers/{name}/drain: how long to wait for the drain to end (0: answer at once), and its bound."""

    wait_s: NonNegativeSeconds = 0.0
    timeout_s: PositiveSeconds = DRAIN_TIMEOUT_S


class MigrationPolicyBody(Body):
    """POST /migrations: the migration policy to use from now on."""

    policy: Literal["none", "jffc", "mell", "worst-fit"]


class MigratedBody(Body):
    """POST /lease/{id}/migrated: how the holder moved and how long the move held its session (both optional)."""

    mode: Literal[MOVE_MODES] | None = None
    seconds: NonNegativeSeconds | None = None


class MigrationFailedBody(Body):
    """POST /lease/{id}/migration-failed: the mode of the move that failed (optional)."""

    mode: Literal[MOVE_MODES] | None = None
