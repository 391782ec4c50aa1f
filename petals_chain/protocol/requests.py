"""The request bodies of the orchestrator's HTTP API, one pydantic model per route.

Each model is what the orchestrator validates a request with (:func:`petals_chain.protocol.parsing.parse`) and
what a caller's body must match; the bounds come from :mod:`petals_chain.protocol.limits`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from petals_chain.device_profile import device_name
from petals_chain.mell.hybrid import Mode
from petals_chain.model import SpecError, check_batch_slowdown
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
from petals_chain.protocol.limits import DEFAULT_WAIT_S, DRAIN_TIMEOUT_S, MAX_BATCH_SESSIONS

MOVE_MODES = (Mode.KV.value, Mode.TOKEN.value)  # how a lease holder moved its session, as it reports it


class RegisterBody(Body):
    """POST /servers/register: a server's name, memory budget (bytes), measured τp, τc (seconds), and what it
    enforces: the most sessions it batches in one step and, where it knows them, its step time with b sessions
    relative to one alone, g(b) for b = 1..max_batch_sessions (an emulated device's, or a profiled one), and the
    device it emulates. The composition sizes the server's chains with these, so server and orchestrator are never
    configured separately for the same fact."""

    name: ServerName
    memory_bytes: Annotated[StrictFloat, Field(gt=0.0, allow_inf_nan=False)]  # upper bound: the registry's setting
    tau_p_s: PositiveSeconds
    tau_c_s: NonNegativeSeconds
    peer_id: Handle | None = None
    address: Handle | None = None
    max_batch_sessions: Annotated[StrictInt, Field(ge=1, le=MAX_BATCH_SESSIONS)]
    batch_slowdown: tuple[Annotated[StrictFloat, Field(ge=1.0, le=MAX_BATCH_SESSIONS, allow_inf_nan=False)], ...] \
        | None = None
    device: Annotated[StrictStr, Field(min_length=1, max_length=64)] | None = None

    # a registration without it comes from a server older than this orchestrator: said so, never composed for
    # limits it did not state
    MISSING_HINTS: ClassVar[dict[str, str]] = {
        "max_batch_sessions": "the server runs an older petals_chain that does not tell the orchestrator how many "
                              "sessions it batches; upgrade petals_chain on it"}

    @field_validator("batch_slowdown")
    @classmethod
    def _table_fits(cls, table: tuple[float, ...] | None, info: ValidationInfo) -> tuple[float, ...] | None:
        """g(b) for b = 1..max_batch_sessions exactly, starting at g(1) = 1 and never falling."""
        limit = info.data.get("max_batch_sessions")
        if table is not None and limit is not None:
            if len(table) != limit:
                raise ValueError(f"must give g(b) for b = 1..max_batch_sessions ({limit} numbers), got {len(table)}")
            try:
                check_batch_slowdown("registration", table)
            except SpecError as exc:
                raise ValueError(str(exc).removeprefix("registration: ")) from None
        return table

    @field_validator("device")
    @classmethod
    def _known_device(cls, name: str | None) -> str | None:
        """A device the emulation knows (device_profile.py)."""
        if name is not None:
            try:
                device_name(name)
            except SpecError as exc:
                raise ValueError(str(exc)) from None
        return name


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
    """POST /migrations: the migration policy to use from now on (a name the orchestrator's registry of live
    policies accepts, ``GET /policies``; it answers 400 naming the choices for any other)."""

    policy: Annotated[StrictStr, Field(min_length=1, max_length=32)]


class MigratedBody(Body):
    """POST /lease/{id}/migrated: how the holder moved and how long the move held its session (both optional)."""

    mode: Literal[MOVE_MODES] | None = None
    seconds: NonNegativeSeconds | None = None


class MigrationFailedBody(Body):
    """POST /lease/{id}/migration-failed: the mode of the move that failed (optional)."""

    mode: Literal[MOVE_MODES] | None = None
