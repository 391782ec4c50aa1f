"""`python -m petals_chain.bench`: subcommand dispatch, and the SimPy model agreeing with our engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from petals_chain.bench import SUBCOMMANDS, load
from petals_chain.bench.__main__ import main
from petals_chain.sim.engine import simulate
from petals_chain.sim.workloads import poisson_workload


def test_every_subcommand_is_named_and_unknown_ones_fail_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    assert {"sim", "compose", "orchestrator"} <= set(SUBCOMMANDS)
    assert main(["nosuch"]) == 2
    assert "unknown benchmark 'nosuch'" in capsys.readouterr().err
    assert callable(load("sim"))


def test_simpy_model_gives_the_same_responses_as_the_engine() -> None:
    from petals_chain.bench.sim import simpy_jffc

    rates, caps = [1.5, 0.7, 0.3], [2, 3, 4]
    wl = poisson_workload(0.85 * float(np.dot(rates, caps)), 3000, np.random.default_rng(2))
    ours = simulate(rates, caps, wl, "JFFC")
    np.testing.assert_allclose(simpy_jffc(rates, caps, wl), ours.records["response_s"], rtol=1e-12, atol=1e-12)


def test_bench_sim_runs_small_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    code = main(["sim", "--chains", "4", "--jobs", "3000", "--slow-jobs", "1000", "--repeat", "1", "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "fast/SimPy" in text
    row = json.loads(out.read_text())["rows"][0]
    assert row["chains"] == 4 and row["fast_jobs_per_s"] > 0 and row["max_response_gap_s"] < 1e-9


def test_ab_refuses_a_missing_benchmark_or_an_unknown_revision(capsys: pytest.CaptureFixture[str]) -> None:
    """`bench ab` says in one line what is wrong and touches no worktree."""
    assert main(["ab", "--base", "HEAD"]) == 2
    assert "give the benchmark after '--'" in capsys.readouterr().err
    assert main(["ab", "--base", "no-such-revision-xyz", "--", "sim"]) == 2
    assert "is not a git revision" in capsys.readouterr().err


def test_ab_runs_both_sides_in_alternating_turns(capsys: pytest.CaptureFixture[str]) -> None:
    """Against HEAD itself, each side runs each turn, old first in odd turns and new first in even ones."""
    assert main(["ab", "--base", "HEAD", "--turns", "2", "--", "nosuch"]) == 1  # the benchmark fails on both sides
    out = capsys.readouterr().out
    headers = [line.split()[1:3] for line in out.splitlines() if line.startswith("## ") and "load" in line]
    assert headers == [["old", "1"], ["new", "1"], ["new", "2"], ["old", "2"]]
    assert out.count("unknown benchmark 'nosuch'") == 4 and "# load after" in out
