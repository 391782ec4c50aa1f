"""Cluster files: unknown keys, YAML's string-typed numbers, sizes and durations with units, the older spellings."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from petals_chain.compose.cluster_file import load_cluster, parse_cluster
from petals_chain.model import SpecError

ROOT = Path(__file__).resolve().parents[2]

WITH_UNITS = """
model: {name: m, blocks: 4, block_size: 1.5 GB, cache_size: 100 MB}
load: {arrival_rate: 0.5, target_load: 0.6}
devices:
  my-gpu: {memory: 24 GB, tflops: 80, bandwidth: 900 GB/s}
servers:
  - {name: a, memory: 10 GB, tau_c: 0.1 s, tau_p: 50 ms}
  - {name: b, device: a100-2g.20gb, rtt: 20 ms}
  - {name: c, device: my-gpu, rtt: 0.02 s, memory: 12GiB}
"""

OLD_SPELLINGS = """
model: {name: m, blocks: 4, block_gb: 1.5, cache_gb: 0.1}
load: {arrival_rate: 0.5, target_load: 0.6}
devices:
  my-gpu: {memory_gb: 24, tflops: 80, bandwidth_gb_per_s: 900}
servers:
  - {name: a, memory_gb: 10, tau_c_s: 0.1, tau_p_s: 0.05}
  - {name: b, device: a100-2g.20gb, rtt_ms: 20}
  - {name: c, device: my-gpu, rtt_ms: 20, memory_gb: 12.884901888}
"""


def write(tmp_path: Path, text: str, name: str = "cluster.yaml") -> Path:
    """Write a cluster file and return its path."""
    path = tmp_path / name
    path.write_text(text)
    return path


def test_units_and_older_spellings_give_the_same_cluster(tmp_path: Path) -> None:
    new = load_cluster(write(tmp_path, WITH_UNITS))
    old = load_cluster(write(tmp_path, OLD_SPELLINGS, "old.yaml"))
    assert new.model.block_bytes == 1.5e9 and new.model.cache_bytes == 100e6  # GB and MB are decimal
    assert new.servers[0].memory_bytes == 10e9 and new.servers[0].tau_p_s == pytest.approx(0.05)
    assert new.servers[2].memory_bytes == 12 * 2**30  # GiB is binary
    assert new.load.target_load == 0.6
    for a, b in zip(new.servers, old.servers):
        assert a.name == b.name and a.memory_bytes == pytest.approx(b.memory_bytes)
        assert a.tau_c_s == pytest.approx(b.tau_c_s) and a.tau_p_s == pytest.approx(b.tau_p_s)
    assert new.model == old.model


def test_misspelt_key_is_named_with_file_path_and_known_keys(tmp_path: Path) -> None:
    path = write(tmp_path, WITH_UNITS.replace("target_load", "target_laod"))
    with pytest.raises(SpecError) as err:
        load_cluster(path)
    assert str(err.value) == f"{path}: load.target_laod: unknown key (known: arrival_rate, target_load)"
    known = "servers[1] (b).rt: unknown key (known: batch_slowdown, device, memory, "
    with pytest.raises(SpecError, match=re.escape(known)):
        load_cluster(write(tmp_path, WITH_UNITS.replace("rtt: 20 ms", "rt: 20 ms")))
    with pytest.raises(SpecError, match=r"devices\.my-gpu\.tflop: unknown key"):
        load_cluster(write(tmp_path, WITH_UNITS.replace("tflops", "tflop")))
    with pytest.raises(SpecError, match=r"cluster\.yaml: .*servrs: unknown key \(known: devices, load, model, "):
        load_cluster(write(tmp_path, WITH_UNITS.replace("servers:", "servrs:")))


def test_yaml_exponent_numbers_are_numbers(tmp_path: Path) -> None:
    """PyYAML reads ``1e-3`` (no dot) as the string '1e-3'; the file format takes it as the number."""
    text = WITH_UNITS.replace("arrival_rate: 0.5", "arrival_rate: 1e-3").replace("tau_p: 50 ms", "tau_p: 5e-2")
    assert yaml.safe_load(text)["load"]["arrival_rate"] == "1e-3"
    cluster = load_cluster(write(tmp_path, text))
    assert cluster.load.arrival_rate == 1e-3 and cluster.servers[0].tau_p_s == 0.05
    old = OLD_SPELLINGS.replace("tau_p_s: 0.05", "tau_p_s: 5e-2").replace("blocks: 4", "blocks: 4e0")
    cluster = load_cluster(write(tmp_path, old))
    assert cluster.servers[0].tau_p_s == 0.05 and cluster.model.num_blocks == 4


@pytest.mark.parametrize(("old", "new", "message"), [
    ("rtt: 20 ms", "rtt: 20 parsecs", r"servers\[1\] \(b\)\.rtt: unknown time unit 'parsecs'"),
    ("memory: 10 GB", "memory: 10 GQ", r"servers\[0\] \(a\)\.memory: unknown size unit 'GQ'"),
    ("memory: 10 GB", "memory: -10 GB", r"servers\[0\] \(a\)\.memory: must be >= 0, got '-10 GB'"),
    ("memory: 10 GB", "memory: 0 GB", r"servers\[0\] \(a\)\.memory: must be > 0"),
    ("memory: 10 GB", "memory: .nan", r"servers\[0\] \(a\)\.memory: must be a finite number"),
    ("tau_p: 50 ms", "tau_p: nan ms", r"servers\[0\] \(a\)\.tau_p: expected a duration"),
    ("rtt: 20 ms", "rtt: -1 ms", r"servers\[1\] \(b\)\.rtt: must be >= 0"),
    ("bandwidth: 900 GB/s", "bandwidth: 900 GB", r"devices\.my-gpu\.bandwidth: unknown rate unit 'GB'"),
    ("block_size: 1.5 GB", "block_size: 1.5 GB, block_gb: 1.5", r"model: give only one of 'block_size', 'block_gb'"),
    ("memory: 10 GB", "memory: 10 GB, memory_gb: 10", r"servers\[0\] \(a\): give only one of 'memory', 'memory_gb'"),
    ("target_load: 0.6", "target_load: 1.5", r"load\.target_load: must be < 1, got 1\.5"),
    ("blocks: 4", "blocks: 4.5", r"model\.blocks: expected an integer, got 4\.5"),
])
def test_bad_sizes_and_durations_are_refused_naming_the_field(tmp_path: Path, old: str, new: str,
                                                               message: str) -> None:
    assert old in WITH_UNITS
    with pytest.raises(SpecError, match=message) as err:
        load_cluster(write(tmp_path, WITH_UNITS.replace(old, new)))
    assert str(err.value).startswith(str(tmp_path / "cluster.yaml") + ": ") and "\n" not in str(err.value)


def test_several_errors_are_reported_on_one_line() -> None:
    doc = yaml.safe_load(WITH_UNITS)
    doc["load"] = {"arrival_rat": 1}
    doc["servers"][0]["memory"] = "lots"
    with pytest.raises(SpecError) as err:
        parse_cluster(doc, "c.yaml")
    text = str(err.value)
    assert text.startswith("c.yaml: ") and "\n" not in text
    assert "load: missing field(s) arrival_rate" in text and "load.arrival_rat: unknown key" in text
    assert "servers[0] (a).memory: expected a size" in text


def test_readme_example_is_a_valid_cluster_file() -> None:
    """The cluster file shown in README.md, "Composing a cluster", loads as shown."""
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("A cluster file (YAML or JSON"):]
    example = section[section.index("```yaml") + len("```yaml"):section.index("```\n", section.index("```yaml") + 7)]
    cluster = parse_cluster(yaml.safe_load(example), "README.md")
    assert [s.name for s in cluster.servers] == ["s0", "s1"]
    assert cluster.servers[0].memory_bytes == 40e9 and cluster.servers[0].tau_p_s == pytest.approx(0.109)
    assert cluster.model.block_bytes == pytest.approx(1.32e9)
