"""Strict reading of our YAML/JSON files (cluster files, testbed files) with pydantic models.

Each file format is a tree of :class:`FileModel` classes: unknown keys are refused, so a misspelt
``target_laod`` is an error rather than a silently ignored line. Numbers, sizes and durations go
through :mod:`petals_chain.units` (``1e-3``, ``40 GB``, ``23.5 ms``). :func:`validate_document`
turns pydantic's errors into one line naming the file and the path of each bad field::

    cluster.yaml: load.target_laod: unknown key (known: arrival_rate, target_load)
    cluster.yaml: servers[3] (s3).rtt: unknown time unit 'parsecs' in '5 parsecs' (use ns, us, ms, s, min, h, d)
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, StrictStr, ValidationError

from petals_chain.model import SpecError
from petals_chain.units import UnitError, parse_duration, parse_number, parse_rate, parse_size

M = TypeVar("M", bound=BaseModel)
MAX_REPORTED_ERRORS = 3  # one line stays readable; the rest are counted


class FieldError(ValueError):
    """Raised inside a validator to report a problem at ``at``, a path below the value being validated."""

    def __init__(self, message: str, *at: str | int) -> None:
        super().__init__(message)
        self.at = at


class FileModel(BaseModel):
    """One mapping of a file: every key must be a field (``extra="forbid"``); validated values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def parse_integer(value: Any) -> int:
    """An integral number (``32``, ``2e3``, ``"2048"``); bools and fractions are refused."""
    try:
        number = parse_number(value)
    except UnitError:
        raise UnitError(f"expected an integer, got {value!r}") from None
    if not number.is_integer():
        raise UnitError(f"expected an integer, got {value!r}")
    return int(number)


Text = Annotated[StrictStr, Field(min_length=1)]
NonNegativeNumber = Annotated[float, BeforeValidator(parse_number), Field(ge=0)]
PositiveNumber = Annotated[float, BeforeValidator(parse_number), Field(gt=0)]
Fraction = Annotated[float, BeforeValidator(parse_number), Field(gt=0, lt=1)]
UnitInterval = Annotated[float, BeforeValidator(parse_number), Field(ge=0, le=1)]
PositiveInteger = Annotated[int, BeforeValidator(parse_integer), Field(ge=1)]
Size = Annotated[float, BeforeValidator(parse_size), Field(gt=0)]
Rate = Annotated[float, BeforeValidator(parse_rate), Field(gt=0)]
Duration = Annotated[float, BeforeValidator(parse_duration), Field(ge=0)]
PositiveDuration = Annotated[float, BeforeValidator(parse_duration), Field(gt=0)]


def one_or_per_key(parse: Callable[[Any], float]) -> PlainValidator:
    """A validator for a value given once for all (``20 ms``) or per name (``{s0: 20 ms, s1: 60 ms}``)."""

    def validate(value: Any) -> float | dict[str, float]:
        """A float, or a dict of floats whose errors name the key."""
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                try:
                    out[str(key)] = parse(item)
                except UnitError as exc:
                    raise FieldError(str(exc), str(key)) from None
            return out
        return parse(value)

    return PlainValidator(validate)


def exactly_one(model: BaseModel, *names: str, required: bool = True) -> str | None:
    """The one field of ``names`` that ``model`` sets (None when none is set and not ``required``).

    Used where a figure has two spellings (``memory: 40 GB`` or the older ``memory_gb: 40``).
    """
    given = [n for n in names if getattr(model, n) is not None]
    choices = ", ".join(f"'{n}'" for n in names)
    if len(given) > 1:
        raise FieldError(f"give only one of {choices}")
    if not given and required:
        raise FieldError(f"missing field: give one of {choices}")
    return given[0] if given else None


# ---- error messages ---------------------------------------------------------------------------


def _short(value: Any, limit: int = 60) -> str:
    """repr(value), cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bound(value: Any) -> str:
    """A constraint bound as people write it (``0``, not ``0.0``)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _strip(tp: Any) -> Any:
    """``tp`` without Annotated metadata and without ``None`` in a union (the model inside ``X | None``)."""
    while True:
        origin = get_origin(tp)
        if origin is Annotated:
            tp = get_args(tp)[0]
        elif origin in (Union, types.UnionType):
            members = [a for a in get_args(tp) if a is not type(None)]
            models = [a for a in members if isinstance(a, type) and issubclass(a, BaseModel)]
            tp = models[0] if models else members[0]
        else:
            return tp


def _model_at(model: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The FileModel class that validates the mapping at ``loc`` below ``model`` (None if not a model)."""
    tp: Any = model
    for seg in loc:
        tp = _strip(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if not isinstance(seg, str) or seg not in tp.model_fields:
                return None
            tp = tp.model_fields[seg].annotation
        elif get_origin(tp) in (list, tuple):
            tp = get_args(tp)[0]
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        else:
            return None
    tp = _strip(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _path(loc: Sequence[str | int], raw: Any) -> str:
    """``servers[3] (s3).rtt``: keys joined by dots, list indices in brackets, with the item's name if it has one."""
    out, node = "", raw
    for seg in loc:
        if isinstance(seg, int):
            out += f"[{seg}]"
            node = node[seg] if isinstance(node, list) and 0 <= seg < len(node) else None
            if isinstance(node, Mapping) and isinstance(node.get("name"), str):
                out += f" ({node['name']})"
        else:
            out += f".{seg}" if out else str(seg)
            node = node.get(seg) if isinstance(node, Mapping) else None
    return out


_MESSAGES: dict[str, Callable[[dict[str, Any]], str]] = {
    "greater_than": lambda e: f"must be > {_bound(e['ctx']['gt'])}, got {_short(e['input'])}",
    "greater_than_equal": lambda e: f"must be >= {_bound(e['ctx']['ge'])}, got {_short(e['input'])}",
    "less_than": lambda e: f"must be < {_bound(e['ctx']['lt'])}, got {_short(e['input'])}",
    "less_than_equal": lambda e: f"must be <= {_bound(e['ctx']['le'])}, got {_short(e['input'])}",
    "string_type": lambda e: f"expected a string, got {_short(e['input'])}",
    "string_too_short": lambda e: f"expected a non-empty string, got {_short(e['input'])}",
    "model_type": lambda e: f"expected a mapping, got {type(e['input']).__name__} {_short(e['input'])}",
    "model_attributes_type": lambda e: f"expected a mapping, got {type(e['input']).__name__} {_short(e['input'])}",
    "dict_type": lambda e: f"expected a mapping, got {type(e['input']).__name__} {_short(e['input'])}",
    "list_type": lambda e: f"expected a list, got {_short(e['input'])}",
    "too_short": lambda e: f"expected a non-empty list, got {_short(e['input'])}",
    "literal_error": lambda e: f"expected one of {e['ctx']['expected']}, got {_short(e['input'])}",
}


def describe(exc: ValidationError, model: type[BaseModel], raw: Any) -> str:
    """pydantic's errors as ``path: message`` parts joined by ``; ``: unknown keys first (a misspelt key is the likely
    cause of a "missing" one), then the rest in file order, missing fields grouped per mapping."""
    unknown: list[tuple[tuple[str | int, ...], str]] = []
    other: list[tuple[tuple[str | int, ...], str]] = []
    missing: dict[tuple[str | int, ...], list[str]] = {}
    for e in exc.errors(include_url=False):
        loc = tuple(e["loc"])
        kind = e["type"]
        if kind == "missing":
            if loc[:-1] not in missing:
                missing[loc[:-1]] = []
                other.append((loc[:-1], ""))  # filled in below, once every missing field of it is known
            missing[loc[:-1]].append(str(loc[-1]))
        elif kind == "extra_forbidden":
            known = _model_at(model, loc[:-1])
            unknown.append((loc, f"unknown key (known: {', '.join(sorted(known.model_fields)) if known else '?'})"))
        elif kind == "value_error":
            error = e["ctx"]["error"]
            other.append((loc + getattr(error, "at", ()), str(error)))
        elif kind in _MESSAGES:
            other.append((loc, _MESSAGES[kind](e)))
        else:
            other.append((loc, f"{e['msg'][:1].lower()}{e['msg'][1:]}, got {_short(e['input'])}"))
    lines = []
    for loc, message in unknown + other:
        message = message or f"missing field(s) {', '.join(missing[loc])}"
        path = _path(loc, raw)
        lines.append(f"{path}: {message}" if path else message)
    more = len(lines) - MAX_REPORTED_ERRORS
    return "; ".join(lines[:MAX_REPORTED_ERRORS]) + (f"; and {more} more" if more > 0 else "")


def validate_document(model: type[M], raw: Any, where: str, *, error: type[SpecError] = SpecError,
                      context: dict[str, Any] | None = None) -> M:
    """``raw`` (decoded YAML/JSON) validated as ``model``; ``error`` naming ``where`` and the fields otherwise."""
    try:
        return model.model_validate(raw, context=context)
    except ValidationError as exc:
        raise error(f"{where}: {describe(exc, model, raw)}") from None
