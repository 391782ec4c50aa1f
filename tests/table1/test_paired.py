"""Paired per-request comparison of a Table 1 replay: the interval, unanswered requests, bad files."""

from __future__ import annotations

import csv

import pytest
from scipy import stats

from petals_chain.experiments.table1_paired import main, paired, read_responses
from petals_chain.model import SpecError

FIELDS = ["method", "request", "response_s", "error", "censored"]


def _write(path, rows):
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow(dict(zip(FIELDS, r)))
    return path


def test_paired_differences_match_a_one_sample_t_interval(tmp_path, capsys):
    slow, fast = [5.0, 7.0, 6.5, 9.0], [4.0, 5.5, 6.8, 6.0]
    rows = [("a", i, s, "", "False") for i, s in enumerate(slow)]
    rows += [("proposed", i, f, "", "False") for i, f in enumerate(fast)]
    rows += [("proposed", 9, 1.0, "timeout", "False")]  # unanswered: never paired
    path = _write(tmp_path / "r.csv", rows)
    (row,) = paired(read_responses(path), "proposed")
    diffs = [s - f for s, f in zip(slow, fast)]
    lo, hi = stats.t.interval(0.95, len(diffs) - 1, loc=sum(diffs) / 4, scale=stats.sem(diffs))
    assert row.pairs == 4 and row.mean_s == pytest.approx(sum(diffs) / 4)
    assert (row.low_s, row.high_s) == (pytest.approx(lo), pytest.approx(hi))
    assert row.faster_share == 0.75  # request 2: proposed was slower
    assert main([str(path)]) == 0 and "a − proposed: +1.30 s" in capsys.readouterr().out


def test_bad_files_and_unknown_methods_are_refused(tmp_path):
    with pytest.raises(SpecError, match="no such file"):
        read_responses(tmp_path / "missing.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("method,request,response_s\nx,one,2\n")
    with pytest.raises(SpecError, match="row 1"):
        read_responses(bad)
    good = _write(tmp_path / "g.csv", [("a", 0, 1.0, "", "False")])
    with pytest.raises(SpecError, match="no requests of method 'proposed'"):
        paired(read_responses(good), "proposed")
    assert main([str(tmp_path / "missing.csv")]) == 2
