"""``python -m petals_chain.bench mell`` runs small and refuses bad arguments with exit code 2."""

from __future__ import annotations

from petals_chain.bench import load


def test_bench_mell_small(capsys):
    assert load("mell")(["--sizes", "50", "--ops", "9"]) == 0
    out = capsys.readouterr().out
    row = [line for line in out.splitlines() if line.strip().startswith("50 ")]
    assert row and float(row[0].split()[3]) > 0  # Mell decisions per second


def test_bench_mell_bad_input(capsys):
    assert load("mell")(["--sizes", "5"]) == 2
    assert "error" in capsys.readouterr().out


def test_bench_mell_batching_sweep_refuses_a_negative_size(capsys):
    assert load("mell")(["--batching-sweep", "-3"]) == 2
    assert "--batching-sweep must be >= 1" in capsys.readouterr().out
