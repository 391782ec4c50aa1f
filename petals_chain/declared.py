"""The base of every declared configuration (the orchestrator's, the composition's, a server's batching, a client's
leasing): fields with types and bounds, defaults from :mod:`petals_chain.defaults`, validated once by pydantic at
construction, frozen afterwards.

An invalid value is refused with one line, ``<owner>: field 'name' must be ..., got <value>``, a :class:`SpecError`
(a ``ValueError``), whether it came from code, a config file or a command line; an unknown field is refused by name.
Fields may also be given in declaration order (the dataclasses these replace took them so). Command lines build
their configs from these classes, and tests check that every option's default is the field's
(tests/test_declared_configs.py), so a default lives in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

from petals_chain.model import SpecError


def _sentence(msg: str) -> str:
    """pydantic's wording made ours: "Input should be greater than 0" -> "must be greater than 0"."""
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    if msg.startswith("Input should be "):
        msg = "must be " + msg[len("Input should be "):]
    elif msg == "Extra inputs are not permitted":
        msg = "is not a known field"
    return msg


def _short(value: Any, limit: int = 80) -> str:
    """repr() of a rejected value, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class Declared(BaseModel):
    """A frozen, validated configuration; subclasses set :attr:`OWNER` (how errors name it) and declare fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True, validate_default=False,
                              allow_inf_nan=False)
    OWNER: ClassVar[str] = "config"

    def __init__(self, *args: Any, **values: Any) -> None:
        names = list(type(self).model_fields)
        if len(args) > len(names):
            raise SpecError(f"{self.OWNER}: takes at most {len(names)} values in order, got {len(args)}")
        for name, value in zip(names, args):
            if name in values:
                raise SpecError(f"{self.OWNER}: field '{name}' given twice")
            values[name] = value
        try:
            super().__init__(**values)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(part) for part in err["loc"]) or "?"
            got = f", got {_short(err['input'])}" if err["type"] != "missing" else ""
            raise SpecError(f"{self.OWNER}: field '{where}' {_sentence(err['msg'])}{got}") from None

    def fields(self) -> dict[str, Any]:
        """The field values as they are (nested objects kept, not dumped)."""
        return {name: getattr(self, name) for name in type(self).model_fields}

    def replace(self, **changes: Any) -> Any:
        """A copy with ``changes``, validated again."""
        return type(self)(**{**self.fields(), **changes})


def one_of(value: Any, choices: Sequence[str]) -> Any:
    """``value`` if it is one of ``choices``; else the ValueError a field validator raises (worded for the one-line
    error: "must be one of a, b, c")."""
    if value not in choices:
        raise ValueError(f"must be one of {', '.join(choices)}")
    return value


def real(value: Any, *, ok: Callable[[float], bool] = lambda v: True, want: str = "a finite number") -> float:
    """``value`` as a float if it is a real number (not a bool) for which ``ok`` holds; else ValueError("must be
    " + want)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or not ok(float(value)):
        raise ValueError(f"must be {want}")
    return float(value)
