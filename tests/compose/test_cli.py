"""`python -m petals_chain compose`: JSON shape, the table, and clean failures (exit code 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from petals_chain.cli import main

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "experiments" / "clusters"

EXAMPLE = """
model: {name: example, blocks: 3, block_gb: 1, cache_gb: 0.1}
load: {arrival_rate: 100}
servers:
  - {name: j1, memory_gb: 2, tau_c_s: 1, tau_p_s: 0.001}
  - {name: j2, memory_gb: 3, tau_c_s: 2, tau_p_s: 0.002}
  - {name: j3, memory_gb: 2, tau_c_s: 1, tau_p_s: 0.003}
  - {name: j4, memory_gb: 2, tau_c_s: 1, tau_p_s: 0.004}
  - {name: j5, memory_gb: 2, tau_c_s: 1, tau_p_s: 0.005}
"""


def check_spans(out: dict, num_blocks: int) -> None:
    """Every chain's spans tile blocks 0:L in order, lie inside the hop's placed span and match its block count."""
    for ch in out["chains"]:
        spans = ch["spans"]
        assert [h["server"] for h in spans] == ch["servers"]
        assert [h["end"] - h["start"] for h in spans] == ch["blocks"]
        assert spans[0]["start"] == 0 and spans[-1]["end"] == num_blocks
        assert all(x["end"] == y["start"] for x, y in zip(spans, spans[1:]))
        for h in spans:
            held = out["placement"][h["server"]]
            assert held["start"] <= h["start"] < h["end"] == held["end"]  # a hop processes a suffix of its blocks
    for span in out["placement"].values():
        assert set(span) == {"start", "end"} and 0 <= span["start"] < span["end"] <= num_blocks


def test_json_output_for_the_worked_example(tmp_path, capsys):
    f = tmp_path / "example.yaml"
    f.write_text(EXAMPLE)
    assert main(["compose", str(f), "--c", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["c"] == 1
    # PETALS spans, 0-indexed and end-exclusive: j2 holds the paper's blocks 2-3, i.e. 1:3.
    assert out["placement"] == {"j1": {"start": 0, "end": 1}, "j2": {"start": 1, "end": 3},
                                "j3": {"start": 0, "end": 1}, "j4": {"start": 1, "end": 2},
                                "j5": {"start": 2, "end": 3}}
    assert [ch["servers"] for ch in out["chains"]] == [["j1", "j2"], ["j1", "j4", "j5"], ["j3", "j4", "j5"]]
    assert [[(h["server"], h["start"], h["end"]) for h in ch["spans"]] for ch in out["chains"]] == [
        [("j1", 0, 1), ("j2", 1, 3)], [("j1", 0, 1), ("j4", 1, 2), ("j5", 2, 3)],
        [("j3", 0, 1), ("j4", 1, 2), ("j5", 2, 3)]]
    check_spans(out, num_blocks=3)
    assert [ch["capacity"] for ch in out["chains"]] == [5, 5, 5]
    assert out["total_rate_per_s"] == pytest.approx(sum(5 / ch["service_time_s"] for ch in out["chains"]))
    # λ = 100/s is far above what these chains serve (about 5/s): no bound exists, and the JSON says so with null.
    assert out["stable"] is False and out["rate_target_met"] is False
    assert out["bounds"]["lower_s"] is None and out["bounds"]["upper_s"] is None


def test_table_writes_petals_spans(tmp_path, capsys):
    f = tmp_path / "example.yaml"
    f.write_text(EXAMPLE)
    assert main(["compose", str(f), "--c", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    held = {ln.split()[0]: ln.split()[1] for ln in lines if ln.startswith("j")}
    assert held == {"j1": "0:1", "j2": "1:3", "j3": "0:1", "j4": "1:2", "j5": "2:3"}
    routes = [ln.split(None, 3)[3] for ln in lines if ln[:1].isdigit()]
    assert routes == ["j1[0:1] -> j2[1:3]", "j1[0:1] -> j4[1:2] -> j5[2:3]", "j3[0:1] -> j4[1:2] -> j5[2:3]"]


def test_tuned_json_has_the_curve(tmp_path, capsys):
    f = tmp_path / "example.yaml"
    f.write_text(EXAMPLE.replace("arrival_rate: 100", "arrival_rate: 0.5"))
    assert main(["compose", str(f), "--method", "paper", "--tune", "upper", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    curve = out["tuning"]["curve"]
    assert out["tuning"]["criterion"] == "upper"
    assert out["c"] == min(curve, key=lambda p: (p["upper_s"], p["c"]))["c"]
    assert set(out["tuning"]["c_by_criterion"]) == {"lower", "upper", "surrogate"}


def test_errors_are_one_line_and_exit_2(tmp_path, capsys):
    f = tmp_path / "bad.yaml"
    f.write_text(EXAMPLE.replace("memory_gb: 3", "memory_gb: -3"))
    assert main(["compose", str(f)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "memory_gb" in err and "j2" in err
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(EXAMPLE.replace("blocks: 3", "blocks: 30"))
    assert main(["compose", str(tiny)]) == 2
    assert "cannot hold" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["paper_default.yaml", "llama2_7b_testbed.yaml"])
def test_shipped_clusters_compose_from_the_command_line(name):
    proc = subprocess.run(
        [sys.executable, "-m", "petals_chain", "compose", str(CLUSTERS / name), "--json"],
        check=False, capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["c"] >= 1 and out["chains"]
    check_spans(out, num_blocks={"paper_default.yaml": 70, "llama2_7b_testbed.yaml": 32}[name])
    assert out["bounds"]["lower_s"] <= out["bounds"]["upper_s"]
    table = subprocess.run(
        [sys.executable, "-m", "petals_chain", "compose", str(CLUSTERS / name)],
        check=False, capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert "Theorem 3.7" in table.stdout and "capacity" in table.stdout
