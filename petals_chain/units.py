"""Sizes and durations written with units (``40 GB``, ``23.5 ms``), and numbers YAML leaves as strings (``1e-3``).

One parser for every file and command line that takes a size or a duration. The units are
humanfriendly's tables, matched exactly (case-insensitive) rather than by humanfriendly's
forgiving prefix match, which reads ``1 parsec`` as a petabyte:

* sizes: ``B``; decimal ``KB MB GB TB PB`` (powers of 1000, like ``model.GB``), also the bare
  prefix ``K M G T P`` and the names (``gigabyte(s)``); binary only when asked for by name,
  ``KiB MiB GiB TiB PiB`` (powers of 1024). A bare number is bytes.
* durations: ``ns us ms s sec min m h d w`` and the names (``millisecond(s)``, ...). A bare number is seconds.
* rates (a size per second): a size followed by ``/s``, e.g. ``900 GB/s``.

The number may have an exponent (``1e-3 s``). NaN, infinities, negatives and unknown units are
refused with a :class:`UnitError` saying what was expected; callers add the field or flag name.
"""

from __future__ import annotations

import math
import re
from typing import Any

import humanfriendly

_NUMBER_AND_UNIT = re.compile(r"^\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z]*(?:/s)?)\s*$")


class UnitError(ValueError):
    """A value is not a number, size or duration as this module reads them; the message says what was expected."""


def _size_units() -> dict[str, int]:
    """Every spelling of a size unit (lower case) → bytes, from humanfriendly's table."""
    units = {"b": 1, "byte": 1, "bytes": 1}
    for combined in humanfriendly.disk_size_units:
        for unit in (combined.decimal, combined.binary):
            units[unit.symbol.lower()] = unit.divider
            units[unit.name.lower()] = units[unit.name.lower() + "s"] = unit.divider
        units[combined.decimal.symbol[0].lower()] = combined.decimal.divider  # bare prefix: decimal
    return units


def _duration_units() -> dict[str, float]:
    """Every spelling of a time unit (lower case) → seconds, from humanfriendly's table."""
    units: dict[str, float] = {}
    for unit in humanfriendly.time_units:
        for spelling in (unit["singular"], unit["plural"], *unit["abbreviations"]):
            units[spelling.lower()] = float(unit["divider"])
    return units


SIZE_UNITS: dict[str, int] = _size_units()
DURATION_UNITS: dict[str, float] = _duration_units()
SIZE_EXAMPLES = "e.g. 350MB, 40 GB, 1.5GiB, or a number of bytes"
DURATION_EXAMPLES = "e.g. 23.5 ms, 60s, 2 min, or a number of seconds"


def _finite(number: float, text: Any) -> float:
    """``number`` if it is finite and >= 0, else UnitError quoting the original ``text``."""
    if not math.isfinite(number):
        raise UnitError(f"must be a finite number, got {text!r}")
    if number < 0:
        raise UnitError(f"must be >= 0, got {text!r}")
    return number


def parse_number(value: Any) -> float:
    """A finite number from an int, a float or a numeric string (YAML 1.1 reads ``1e-3`` as a string)."""
    if isinstance(value, bool):
        raise UnitError(f"expected a number, got {value!r}")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise UnitError(f"expected a number, got {value!r}") from None
    else:
        raise UnitError(f"expected a number, got {value!r}")
    if not math.isfinite(number):
        raise UnitError(f"must be a finite number, got {value!r}")
    return number


def _split(value: Any, kind: str, examples: str) -> tuple[float, str]:
    """(number, unit as written or '') of a number or a ``"<number> <unit>"`` string."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise UnitError(f"expected a {kind} ({examples}), got {value!r}")
    if not isinstance(value, str):
        return _finite(float(value), value), ""
    match = _NUMBER_AND_UNIT.match(value)
    if match is not None:
        return _finite(float(match.group(1)), value), match.group(2)
    try:  # 'nan', 'inf': a number, but not a finite one
        number = float(value.strip())
    except ValueError:
        raise UnitError(f"expected a {kind} ({examples}), got {value!r}") from None
    return _finite(number, value), ""


def parse_size(value: Any) -> float:
    """Bytes from a size (``350MB``, ``40 GB``, ``1.5GiB``; a bare number is bytes); see the module docstring."""
    number, unit = _split(value, "size", SIZE_EXAMPLES)
    if unit and unit.lower() not in SIZE_UNITS:
        raise UnitError(f"unknown size unit {unit!r} in {value!r} (use B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")
    return number * SIZE_UNITS[unit.lower()] if unit else number


def parse_duration(value: Any) -> float:
    """Seconds from a duration (``23.5 ms``, ``60s``, ``2 min``; a bare number is seconds); see the module docstring."""
    number, unit = _split(value, "duration", DURATION_EXAMPLES)
    if unit and unit.lower() not in DURATION_UNITS:
        raise UnitError(f"unknown time unit {unit!r} in {value!r} (use ns, us, ms, s, min, h, d)")
    return number * DURATION_UNITS[unit.lower()] if unit else number


def parse_rate(value: Any) -> float:
    """Bytes per second from a rate (``900 GB/s``; a bare number is bytes per second)."""
    number, unit = _split(value, "rate", "e.g. 900 GB/s, or a number of bytes per second")
    per_second = unit.lower().removesuffix("/s")
    if unit and not (unit.lower().endswith("/s") and per_second in SIZE_UNITS):
        raise UnitError(f"unknown rate unit {unit!r} in {value!r} (a size unit per second, e.g. GB/s, MiB/s)")
    return number * SIZE_UNITS[per_second] if unit else number
