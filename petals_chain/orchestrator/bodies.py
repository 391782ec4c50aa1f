"""The JSON bodies the orchestrator's HTTP API accepts, as pydantic models, and how a request's body is read.

Every model refuses keys it does not know (a misspelt ``memory_byte`` is an error, not a silently ignored field),
takes numbers only as JSON numbers (never strings or booleans) and range-checks them: finite and within bounds, so
``NaN``, ``1e400`` or a 400-digit integer is a 400 that names the field, never a 500. A body nested deeper
than :data:`MAX_DEPTH` is a 400 too, and one larger than :data:`MAX_BODY_BYTES` a 413 (aiohttp's limit, set by
the app). The registry checks what depends on its own settings (a memory budget against the model and
``--max-memory-bytes``, a claimed span against the model's blocks, the characters of a server name) and answers
those with a 400 naming the field too.
"""

from __future__ import annotations

import json
import typing
from typing import Annotated, Any, TypeVar

from aiohttp import web
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    model_validator,
)

from petals_chain import defaults
from petals_chain.moldable.width_range import MAX_WIDTH
from petals_chain.orchestrator.registry import MAX_TIME_S

DEFAULT_WAIT_S = defaults.LEASE_WAIT_S  # how long POST /lease waits for a chain when the body does not say
MAX_WAIT_S = 24 * 3600.0
MAX_TTL_S = 24 * 3600.0
MAX_LABEL_CHARS = 200  # free-text labels: a client's name, a server's reason for leaving
MAX_BLOCK_INDEX = 1_000_000  # no model has a million transformer blocks; the registry checks the real count
MAX_BODY_BYTES = 64 * 1024  # the largest real body (a registration) is a few hundred bytes; aiohttp answers 413 above
MAX_DEPTH = 8  # the deepest real body nests 2 levels ({"serving": {"start", "end"}}); deeper is refused before use

Model = TypeVar("Model", bound="Body")


class BadRequestError(ValueError):
    """The request body or a field in it is malformed; the message says which and why, ``fields`` names them."""

    def __init__(self, message: str, fields: list[str] | None = None) -> None:
        super().__init__(message)
        self.fields = fields or []


class Body(BaseModel):
    """Base of every request body: unknown keys refused, numbers finite, the parsed body immutable."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)


PositiveSeconds = Annotated[StrictFloat, Field(gt=0.0, le=MAX_TIME_S, allow_inf_nan=False)]
NonNegativeSeconds = Annotated[StrictFloat, Field(ge=0.0, le=MAX_TIME_S, allow_inf_nan=False)]
WaitSeconds = Annotated[  # null: DEFAULT_WAIT_S
    StrictFloat, BeforeValidator(lambda v: DEFAULT_WAIT_S if v is None else v),
    Field(gt=0.0, le=MAX_WAIT_S, allow_inf_nan=False),
]
TtlSeconds = Annotated[StrictFloat, Field(gt=0.0, le=MAX_TTL_S, allow_inf_nan=False)]
Label = Annotated[StrictStr, Field(max_length=MAX_LABEL_CHARS)]
ServerName = Annotated[StrictStr, Field(min_length=1, max_length=128)]
Handle = Annotated[StrictStr, Field(min_length=1, max_length=512)]
BlockIndex = Annotated[StrictInt, Field(ge=0, le=MAX_BLOCK_INDEX)]
Width = Annotated[StrictInt, Field(ge=1, le=MAX_WIDTH)]


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


def _short(value: Any, limit: int = 60) -> str:
    """repr() of a rejected value, cut to ``limit`` characters (a 400-digit number stays readable)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _submodel(model: type[Body], keys: list[str]) -> type[BaseModel]:
    """The model of the nested object at ``keys`` (``[]``: the body itself), for listing its allowed fields."""
    for key in keys:
        info = model.model_fields.get(key)
        inner = [a for a in typing.get_args(info.annotation) or (info.annotation,)
                 if isinstance(a, type) and issubclass(a, BaseModel)] if info else []
        if not inner:
            break
        model = inner[0]
    return model


def explain(exc: ValidationError, model: type[Body]) -> BadRequestError:
    """One message for every problem pydantic found, each naming its field; the fields listed apart too."""
    parts: list[str] = []
    fields: list[str] = []
    errors = sorted(exc.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden")  # a misspelling first
    for err in errors:
        keys = [str(x) for x in err["loc"] if isinstance(x, str)]
        name = ".".join(keys) or "body"  # the body's key, dotted into a nested object (serving.start)
        item = "".join(f" (item {x})" for x in err["loc"] if isinstance(x, int))  # an item of a list
        if name not in fields:
            fields.append(name)
        if err["type"] == "extra_forbidden":
            allowed = sorted(_submodel(model, keys[:-1]).model_fields)
            parts.append(f"unknown field '{name}' (allowed: {', '.join(allowed) or 'none'})")
        elif err["type"] == "missing":
            parts.append(f"missing field '{name}'")
        else:
            message = err["msg"][:1].lower() + err["msg"][1:]
            parts.append(f"field '{name}'{item}: {message}, got {_short(err.get('input'))}")
    return BadRequestError("; ".join(parts), fields)


def _depth(data: Any) -> int:
    """How deeply JSON containers nest in ``data`` (a scalar: 0), walked without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, (dict, list)):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in (value.values() if isinstance(value, dict) else value))
    return deepest


def parse(model: type[Model], raw: bytes, *, required: bool = True) -> Model:
    """A request body (raw bytes) as ``model``; BadRequestError on malformed JSON, a non-object or a bad field.

    An empty body is ``{}`` unless ``required``. JSON is read by the standard library first, so that a malformed
    body is told apart from a well-formed one with a bad field.
    """
    if not raw.strip():
        if required:
            raise BadRequestError("request body must be a JSON object")
        raw = b"{}"
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:  # ValueError also covers integers too long to convert
        raise BadRequestError(f"malformed JSON in request body: {exc}") from None
    except RecursionError:  # the standard library's parser gives up on nesting deeper than the interpreter's stack
        raise BadRequestError(f"request body nests JSON deeper than {MAX_DEPTH} levels") from None
    if _depth(data) > MAX_DEPTH:
        raise BadRequestError(f"request body nests JSON deeper than {MAX_DEPTH} levels")
    if not isinstance(data, dict):
        raise BadRequestError(f"request body must be a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise explain(exc, model) from None


async def read(request: web.Request, model: type[Model], *, required: bool = True) -> Model:
    """The body of an aiohttp request as ``model`` (see :func:`parse`)."""
    return parse(model, await request.read(), required=required)
