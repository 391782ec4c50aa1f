"""How a request body is read: raw bytes to one of the wire models, or a BadRequestError that names the field.

JSON is read first (as the standard library reads it: :mod:`~petals_chain.protocol.json_codec`), so that a malformed
body is told apart from a well-formed one with a bad field; a body nested deeper than
:data:`~petals_chain.protocol.limits.MAX_DEPTH` is refused before pydantic sees it. Every problem pydantic finds is
told in one message, each naming its field (``serving.start``), so that ``NaN``, ``1e400`` or a 400-digit integer is
a 400 that names the field, never a 500. The registry checks what depends on its own settings (a memory budget
against the model, a claimed span against the model's blocks) and answers those with a 400 naming the field too.
"""

from __future__ import annotations

import typing
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from petals_chain.protocol import json_codec
from petals_chain.protocol.fields import Body
from petals_chain.protocol.limits import MAX_DEPTH

Model = TypeVar("Model", bound=Body)


class BadRequestError(ValueError):
    """The request body or a field in it is malformed; the message says which and why, ``fields`` names them."""

    def __init__(self, message: str, fields: list[str] | None = None) -> None:
        super().__init__(message)
        self.fields = fields or []


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
            hint = getattr(model, "MISSING_HINTS", {}).get(name)  # why a current caller always sends it
            parts.append(f"missing field '{name}'" + (f": {hint}" if hint else ""))
        else:
            message = err["msg"].removeprefix("Value error, ")
            message = message[:1].lower() + message[1:]
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

    An empty body is ``{}`` unless ``required``. JSON is read first (as the standard library reads it,
    :mod:`~petals_chain.protocol.json_codec`), so that a malformed body is told apart from a well-formed one with a
    bad field.
    """
    if not raw.strip():
        if required:
            raise BadRequestError("request body must be a JSON object")
        raw = b"{}"
    try:
        data = json_codec.loads(raw)
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
