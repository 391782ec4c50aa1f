"""The API's JSON codec reads and writes what the standard library does, orjson only where the two agree."""

from __future__ import annotations

import json

import numpy as np
import pytest

from petals_chain.protocol import json_codec

AGREED = [b'{"request_id": "r-1", "timeout_s": 30, "max_length": 128}', b"[1, 2.5, null, true, \"\\u00e9\"]",
          '{"name": "caf\u00e9"}'.encode(), b'{"a": {"b": [1, {"c": -0.0}]}, "a": 2}']  # the last key repeats
EDGES = [b'{"timeout_s": NaN}', b'{"ttl_s": -Infinity}', b'{"n": 1' + b"0" * 400 + b"}", b"[" * 2000 + b"]" * 2000,
         b'{"s": "\\ud800"}']


@pytest.mark.parametrize("raw", AGREED + EDGES)
def test_reads_what_the_standard_library_reads(raw: bytes) -> None:
    try:
        want = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        with pytest.raises(type(exc)):
            json_codec.loads(raw)
        return
    got = json_codec.loads(raw)
    assert json.dumps(got) == json.dumps(want)  # NaN and nested lists compare by their text


@pytest.mark.parametrize("raw", [b"{", b'{"a": 1,}', b"\xff", b""])
def test_refuses_what_the_standard_library_refuses(raw: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(raw)
    with pytest.raises(ValueError):
        json_codec.loads(raw)


def test_writes_a_reply_the_standard_library_reads_back_and_falls_back_for_other_types() -> None:
    reply = {"lease_id": "L1-ab", "chain_id": "v2.0", "version": 3, "ttl_s": 30.0, "expires_in_s": 29.75,
             "replaces": None, "current": True, "spans": [{"server": "s\u00e9", "start": 0, "end": 16}]}
    assert json.loads(json_codec.dumps(reply)) == reply
    odd = {"x": np.float64(0.5), "k": {1: "int key"}}  # orjson refuses an int key: the standard library writes it
    assert json.loads(json_codec.dumps(odd)) == {"x": 0.5, "k": {"1": "int key"}}
