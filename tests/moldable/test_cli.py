"""`python -m petals_chain moldable optimal|simulate`: output, JSON, bad input as one line and exit code 2."""

from __future__ import annotations

import json

import pytest

from petals_chain.cli import build_parser, main


def test_optimal_prints_the_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["moldable", "optimal", "--speedup", "1,1.8,2.5,3,3.4", "--load", "0.8"]) == 0
    out = capsys.readouterr().out
    assert "y* = (0, 0, 0.2, 0.1, 0)" in out and "D* = 0.375" in out and "p* = (0, 0, 0.625, 0.375, 0)" in out
    assert main(["moldable", "optimal", "--speedup", "linear:5", "--load", "0.8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["execution_time"] == pytest.approx(0.2) and doc["support"] == [5]


@pytest.mark.parametrize("argv, field", [
    (["moldable", "optimal", "--speedup", "1,1.8,2.5", "--load", "1.3"], "load"),
    (["moldable", "optimal", "--speedup", "1,2.5,3", "--load", "0.5"], "speedup"),
    (["moldable", "optimal", "--speedup", "linear:x", "--load", "0.5"], "speedup"),
    (["moldable", "simulate", "--n", "100", "--beta", "50", "--runs", "1", "--arrivals", "100"], "beta"),
    (["moldable", "simulate", "--n", "100", "--runs", "0"], "runs"),
    (["moldable", "simulate", "--n", "100", "--arrivals", "0.5"], "arrivals"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], field: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}")


def test_simulate_prints_intervals(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["moldable", "simulate", "--n", "200", "--alpha", "0", "--beta", "0.2", "--scheme", "greedy-p",
            "--arrivals", "20000", "--runs", "3", "--workers", "1", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["load"] == pytest.approx(0.8)
    assert doc["blocking"]["ci_low"] <= doc["blocking"]["mean"] <= doc["blocking"]["ci_high"]
    assert 0.3 < doc["exec_time_all"]["mean"] < 0.45
    assert main(argv[:-1]) == 0
    assert "95 % CI" in capsys.readouterr().out


def test_compose_subcommand_still_there() -> None:
    assert build_parser().parse_args(["compose", "x.yaml"]).command == "compose"


@pytest.mark.parametrize("argv", [["moldable", "--help"], ["moldable", "optimal", "--help"],
                                  ["moldable", "simulate", "--help"], ["--help"]])
def test_help_renders(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0 and "usage:" in capsys.readouterr().out
