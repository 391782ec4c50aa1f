"""`compose --json` is strict JSON in every case (null, never Infinity/NaN) and `--c` is range-checked at parse time."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from petals_chain.compose.report import load_summary, strict_json

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = """
model: {name: example, blocks: 3, block_gb: 1, cache_gb: 0.1}
load: {arrival_rate: RATE}
servers:
  - {name: j1, memory_gb: 2, tau_c_s: 1, tau_p_s: 0.001}
  - {name: j2, memory_gb: 3, tau_c_s: 2, tau_p_s: 0.002}
  - {name: j3, memory_gb: 2, tau_c_s: 1, tau_p_s: 0.003}
"""


def _refuse(constant: str) -> float:
    """parse_constant for json.loads: Infinity, -Infinity and NaN are not JSON, so a strict reader fails on them."""
    raise ValueError(f"not JSON: {constant}")


def compose(tmp_path: Path, rate: float, *args: str) -> subprocess.CompletedProcess:
    """Run `python -m petals_chain compose` on the three-server cluster at arrival rate ``rate``."""
    f = tmp_path / "cluster.yaml"
    f.write_text(CLUSTER.replace("RATE", str(rate)))
    return subprocess.run([sys.executable, "-m", "petals_chain", "compose", str(f), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)


def test_unstable_system_prints_null_bounds_and_says_why(tmp_path):
    proc = compose(tmp_path, 1000, "--c", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout, parse_constant=_refuse)
    assert out["bounds"]["lower_s"] is None and out["bounds"]["upper_s"] is None
    assert "unstable" in out["bounds"]["why_null"]
    assert out["stable"] is False and out["rate_target_met"] is False
    assert out["load"]["arrival_rate_per_s"] == 1000 and out["load"]["utilisation"] > 1


def test_stable_system_keeps_its_bounds(tmp_path):
    proc = compose(tmp_path, 0.2, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout, parse_constant=_refuse)
    assert out["stable"] is True and out["rate_target_met"] is True
    assert 0 < out["bounds"]["lower_s"] <= out["bounds"]["upper_s"] and "why_null" not in out["bounds"]
    assert "joint" in out  # the default chooses c and its chains together (no tuning curve of its own)
    paper = compose(tmp_path, 0.2, "--json", "--method", "paper")  # the paper's tuning of c has the curve
    assert paper.returncode == 0, paper.stderr
    curve = json.loads(paper.stdout, parse_constant=_refuse)["tuning"]["curve"]
    assert curve and all(p["stable"] for p in curve)


def test_table_says_unstable(tmp_path):
    proc = compose(tmp_path, 1000, "--c", "1")
    assert proc.returncode == 0, proc.stderr
    assert "unstable" in proc.stdout and "inf" not in proc.stdout


@pytest.mark.parametrize("value", ["0", "-3", "1.5", "nan"])
def test_c_out_of_range_is_one_line_exit_2(tmp_path, value):
    proc = compose(tmp_path, 0.2, f"--c={value}")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--c" in lines[0] and repr(value) in lines[0], proc.stderr
    assert proc.stdout == ""


def test_strict_json_replaces_every_non_finite_float():
    doc = {"a": math.inf, "b": [1.0, -math.inf, {"c": math.nan}], "d": (2, "x"), "e": None}
    assert strict_json(doc) == {"a": None, "b": [1.0, None, {"c": None}], "d": [2, "x"], "e": None}
    json.dumps(strict_json(doc), allow_nan=False)  # raises on any NaN/Infinity left


def test_load_summary_tells_stable_from_rate_target():
    # ν = 10/s: λ = 8 is stable but above ρ̄ = 0.7 (needs 11.4/s); λ = 5 meets it; λ = 10 is unstable (λ = ν).
    assert load_summary(10.0, 8.0, 0.7)["stable"] and not load_summary(10.0, 8.0, 0.7)["rate_target_met"]
    assert load_summary(10.0, 5.0, 0.7)["rate_target_met"]
    assert not load_summary(10.0, 10.0, 0.7)["stable"]
    assert load_summary(0.0, 1.0, 0.7)["utilisation"] is None
