"""JSON on the orchestrator's HTTP path: orjson where it reads and writes the same as the standard library, the
standard library wherever they differ.

A lease and its release read two small request bodies and write two small replies; with the standard library that is
about 10 µs of the ~200 µs of CPU a round trip costs the orchestrator, with orjson about 1 µs (``python -m
petals_chain.bench orchestrator``; results/bench/orchestrator-json-ab.txt). The two differ at the edges, and there
the standard library decides, so that the API behaves as before:

- reading: orjson refuses ``NaN``/``Infinity``, integers beyond 64 bits and nesting deeper than 1024, which the
  standard library reads (the request's field check then names the field) or words its own error for; so whatever
  orjson refuses is read again by the standard library;
- writing: orjson writes a non-finite float as ``null`` and refuses types it does not know; :func:`dumps` is only for
  replies built from strings, integers, finite floats, lists and dicts (a lease, a release), and anything orjson
  refuses is written by the standard library.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["dumps", "loads"]


def loads(raw: bytes | str) -> Any:
    """A JSON document as Python objects, exactly as ``json.loads`` reads it (ValueError or RecursionError where it
    refuses)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def dumps(obj: Any) -> bytes:
    """A reply of strings, integers, finite floats, lists and dicts with string keys as UTF-8 JSON bytes (what
    ``json.dumps`` writes, without its spaces); any other value goes through ``json.dumps``."""
    try:
        return orjson.dumps(obj)
    except TypeError:
        return json.dumps(obj).encode()
