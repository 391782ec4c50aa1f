"""Testbed files: unknown keys, YAML's string-typed numbers, RTTs and sizes with units, the older rtt_ms."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from petals_chain.launch.testbed import TestbedError, load_testbed, parse_testbed

TESTBED = """
name: two
model: {name: tiny, blocks: 4, block_size: 1 MB, cache_size: 0.1 MB}
cpu_servers:
  - {name: a, memory_budget: 4 MB}
  - {name: b, memory_budget: 2MiB, speed_factor: 0.5}
latency: {rtt: {a: 20 ms, b: 0.06 s}, method: relay}
"""


def write(tmp_path: Path, text: str) -> Path:
    """Write a testbed file and return its path."""
    path = tmp_path / "tb.yaml"
    path.write_text(text)
    return path


def test_units_are_read_and_equal_the_older_spelling(tmp_path: Path) -> None:
    tb = load_testbed(write(tmp_path, TESTBED))
    assert [s.rtt_s for s in tb.servers] == pytest.approx([0.02, 0.06], rel=1e-15)
    assert [s.memory_bytes for s in tb.servers] == [4e6, 2 * 2**20]
    assert (tb.model.block_bytes, tb.model.cache_bytes) == (1e6, 0.1e6)
    old = load_testbed(write(tmp_path, TESTBED.replace("rtt: {a: 20 ms, b: 0.06 s}", "rtt_ms: {a: 20, b: 60}")))
    assert [s.rtt_s for s in old.servers] == pytest.approx([s.rtt_s for s in tb.servers], rel=1e-15)
    one = load_testbed(write(tmp_path, TESTBED.replace("rtt: {a: 20 ms, b: 0.06 s}", "rtt: 12.5ms")))
    assert [s.rtt_s for s in one.servers] == pytest.approx([0.0125, 0.0125], rel=1e-15)


def test_misspelt_key_is_named_with_file_and_path(tmp_path: Path) -> None:
    path = write(tmp_path, TESTBED.replace("{name: a, memory_budget: 4 MB}", "{name: a, memroy_budget: 4 MB}"))
    with pytest.raises(TestbedError) as err:
        load_testbed(path)
    text = str(err.value)
    assert text.startswith("tb.yaml: ") and "\n" not in text
    assert "cpu_servers[0] (a).memroy_budget: unknown key (known: device, memory_budget, name, speed_factor)" in text
    # the budget alone is not missing any more (an emulated device may stand for it): only the misspelling is named
    no_budget = write(tmp_path, TESTBED.replace("{name: a, memory_budget: 4 MB}", "{name: a}"))
    with pytest.raises(TestbedError, match=re.escape("cpu_servers[0] (a): give 'memory_budget'")):
        load_testbed(no_budget)
    known = "(known: method, ripe_atlas, rtt, rtt_ms)"
    with pytest.raises(TestbedError, match=re.escape(f"tb.yaml: latency.methd: unknown key {known}")):
        load_testbed(write(tmp_path, TESTBED.replace("method: relay", "methd: relay")))
    with pytest.raises(TestbedError, match=re.escape("tb.yaml: model.block_sise: unknown key (known: block_size, "
                                                     "blocks, cache_size, name, path); model: missing field(s) "
                                                     "block_size")):
        load_testbed(write(tmp_path, TESTBED.replace("block_size", "block_sise")))


def test_yaml_exponent_numbers_are_numbers(tmp_path: Path) -> None:
    """PyYAML reads ``5e-1`` (no dot) as a string; the testbed format takes it as the number."""
    text = TESTBED.replace("speed_factor: 0.5", "speed_factor: 5e-1").replace("blocks: 4", "blocks: 4e0")
    assert yaml.safe_load(text)["cpu_servers"][1]["speed_factor"] == "5e-1"
    tb = load_testbed(write(tmp_path, text))
    assert tb.servers[1].speed_factor == 0.5 and tb.model.num_blocks == 4
    tb = parse_testbed(yaml.safe_load(TESTBED.replace("rtt: {a: 20 ms, b: 0.06 s}", "rtt_ms: 2.5e1")))
    assert [s.rtt_s for s in tb.servers] == pytest.approx([0.025, 0.025])


@pytest.mark.parametrize(("old", "new", "message"), [
    ("a: 20 ms", "a: 20 parsecs", r"latency\.rtt\.a: unknown time unit 'parsecs'"),
    ("a: 20 ms", "a: -20 ms", r"latency\.rtt\.a: must be >= 0, got '-20 ms'"),
    ("a: 20 ms", "a: .nan", r"latency\.rtt\.a: must be a finite number"),
    ("b: 0.06 s", "c: 0.06 s", r"latency\.rtt: unknown server\(s\) c \(servers: a, b\)"),
    ("memory_budget: 4 MB", "memory_budget: 4 MQ", r"cpu_servers\[0\] \(a\)\.memory_budget: unknown size unit 'MQ'"),
    ("memory_budget: 4 MB", "memory_budget: nan MB", r"cpu_servers\[0\] \(a\)\.memory_budget: expected a size"),
    ("block_size: 1 MB", "block_size: -1 MB", r"model\.block_size: must be >= 0"),
    ("latency: {", "latency: {rtt_ms: 5, ", r"latency: give exactly one of 'rtt'"),
])
def test_bad_units_are_refused_naming_the_field(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert old in TESTBED
    with pytest.raises(TestbedError, match=message) as err:
        load_testbed(write(tmp_path, TESTBED.replace(old, new)))
    assert str(err.value).startswith("tb.yaml: ") and "\n" not in str(err.value)
