"""Little's law on a replay's records: a miss over 10 % is flagged, with its likely cause (synthetic records)."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.experiments.replay import ReplayResult, RequestRecord, check_littles_law
from petals_chain.model import SpecError


def _rec(i: int, arrival: float, start: float, end: float) -> RequestRecord:
    """A served request record with consistent waiting/service/response."""
    return RequestRecord("m", i, arrival, start, end, start - arrival, end - start, end - arrival, 8, 4, 4, 0, 0.0, "")


def _counts(recs: list[RequestRecord], t: np.ndarray) -> np.ndarray:
    """What an honest monitor sees at instants t: requests arrived and not yet ended."""
    return np.array([sum(1 for r in recs if r.arrival_s <= x < r.end_s) for x in t], float)


def test_littles_law_miss_over_ten_percent_is_flagged_with_its_cause() -> None:
    """A consistent replay passes; a starved monitor (sampling) and a monitor that lost requests (accounting) fail."""
    recs = [_rec(i, 2.0 * i, 2.0 * i + 0.5, 2.0 * i + 1.0 + (i % 5)) for i in range(40)]
    t = np.arange(0.0, 90.0, 0.05)
    good = check_littles_law(ReplayResult("m", recs, np.column_stack([t, _counts(recs, t)]), 90.0))
    assert good.ok and good.rel_gap < 0.02 and good.cause == "" and "WARNING" not in good.describe()
    # Sampling: the monitor looked only while few requests were in flight (and then went silent for seconds).
    # Its counts are right where it looked, so the records agree with it: the miss is the sampling's.
    n = _counts(recs, t)
    keep = n <= 1
    starved = check_littles_law(ReplayResult("m", recs, np.column_stack([t[keep], n[keep]]), 90.0))
    assert not starved.ok and starved.rel_gap > 0.10 and starved.cause == "sampling"
    assert starved.describe().startswith("WARNING: Little's law missed by more than 10 %")
    assert starved.max_sample_gap_s > 1.0
    # Accounting: sampled densely, but the monitor never counted one request in three.
    lost = _counts([r for r in recs if r.request % 3], t)
    wrong = check_littles_law(ReplayResult("m", recs, np.column_stack([t, lost]), 90.0))
    assert not wrong.ok and wrong.cause == "accounting" and wrong.records_l == pytest.approx(wrong.lambda_w, rel=0.02)
    doc = wrong.as_json()
    assert doc["ok"] is False and doc["cause"] == "accounting" and doc["rel_gap"] > 0.10
    # the 10 % line: a monitor 8 % low passes, 12 % low fails
    assert check_littles_law(ReplayResult("m", recs, np.column_stack([t, 0.92 * n]), 90.0)).ok
    assert not check_littles_law(ReplayResult("m", recs, np.column_stack([t, 0.88 * n]), 90.0)).ok
    empty = check_littles_law(ReplayResult("m", recs, np.empty((0, 2)), 90.0))
    assert not empty.ok and empty.cause == "unknown"
    with pytest.raises(SpecError, match="tolerance"):
        check_littles_law(ReplayResult("m", recs, np.column_stack([t, n]), 90.0), tolerance=1.5)


def test_table1_outputs_flag_the_miss_and_keep_the_samples(tmp_path) -> None:
    """table1.md carries the WARNING for a replay that misses; the samples are saved for redoing the check."""
    from petals_chain.experiments.replay import ReplayPlan, summarize
    from petals_chain.experiments.table1_report import write_outputs

    recs = [_rec(i, 2.0 * i, 2.0 * i + 0.5, 2.0 * i + 1.0 + (i % 5)) for i in range(40)]
    t = np.arange(0.0, 90.0, 0.05)
    n = _counts(recs, t)
    results = {"jffc_only": ReplayResult("jffc_only", recs, np.column_stack([t, 0.6 * n]), 90.0),
               "proposed": ReplayResult("proposed", recs, np.column_stack([t, n]), 90.0)}
    plan = ReplayPlan(np.array([r.arrival_s for r in recs]), np.full(40, 8), np.full(40, 4), 1.0, 1.0, 1.0, 0.5, 0.5,
                      1.0, 0.5, 764, "synthetic")
    stats = {m: summarize(res.records) for m, res in results.items()}
    paths = write_outputs(tmp_path, "t1", stats, results, plan, {m: {"status": "ran"} for m in results}, "test")
    md = paths["md"].read_text()
    assert md.count("WARNING: Little's law missed by more than 10 %") == 1
    assert "- jffc_only:" in md and "WARNING" in md.split("- jffc_only:")[1].splitlines()[0]
    lines = paths["samples"].read_text().splitlines()
    assert lines[0] == "method,time_s,in_flight" and len(lines) == 1 + 2 * t.size


def test_table1_resume_reads_back_what_a_run_wrote(tmp_path) -> None:
    """--resume: the methods a run replayed come back with their records, samples and stats; another plan is refused."""
    from dataclasses import replace

    from petals_chain.experiments.replay import ReplayPlan, summarize
    from petals_chain.experiments.table1_report import load_finished, write_outputs

    t = np.arange(0.0, 90.0, 0.05)
    results = {}
    for m in ("petals", "bprr"):
        recs = [replace(_rec(i, 2.0 * i, 2.0 * i + 0.5, 2.0 * i + 1.0 + (i % 5)), method=m) for i in range(40)]
        results[m] = ReplayResult(m, recs, np.column_stack([t, _counts(recs, t)]), 90.0)
    plan = ReplayPlan(np.arange(40) * 2.0, np.full(40, 8), np.full(40, 4), 1.0, 1.0, 1.0, 0.5, 0.5, 1.0, 0.5, 764,
                      "synthetic")
    stats = {m: summarize(res.records) for m, res in results.items()}
    infos = {"petals": {"status": "ran", "wall_s": 91.0}, "bprr": {"status": "failed", "summary": "x"}}
    write_outputs(tmp_path, "t1", stats, {"petals": results["petals"]}, plan, infos, "test")
    got_stats, got_results, got_infos = load_finished(tmp_path, "t1", plan)
    assert list(got_results) == ["petals"] and got_infos["petals"]["wall_s"] == 91.0  # a failed method is rerun
    assert got_results["petals"].records == results["petals"].records
    assert got_results["petals"].samples.shape == (t.size, 2)
    assert got_stats["petals"] == stats["petals"]
    assert load_finished(tmp_path, "t1", plan, rerun={"petals"}) == ({}, {}, {})  # --rerun petals replays it again
    assert load_finished(tmp_path, "other", plan) == ({}, {}, {})
    other = replace(plan, load=0.7)
    with pytest.raises(SpecError, match="another replay plan"):
        load_finished(tmp_path, "t1", other)


def test_the_witness_counts_a_request_from_its_dispatch_as_the_monitor_does() -> None:
    """A replay thread that dispatched a request 2 s after its planned arrival (a busy machine): the monitor counts it
    from its dispatch, and so does the records' witness, so the two agree exactly; λ·W (from planned arrivals) is the
    one that differs."""
    from dataclasses import replace

    recs = [_rec(i, 2.0 * i, 2.0 * i + 0.5, 2.0 * i + 1.5) for i in range(10)]
    recs[4] = replace(recs[4], start_s=10.5, end_s=11.5, waiting_s=2.5, service_s=1.0, response_s=3.5,
                      dispatch_lag_s=2.0)
    t = np.arange(0.0, 20.0, 0.01)
    seen = np.array([sum(1 for r in recs if r.arrival_s + r.dispatch_lag_s <= x < r.end_s) for x in t], float)
    check = check_littles_law(ReplayResult("m", recs, np.column_stack([t, seen]), 20.0))
    assert check.sampled_l == pytest.approx(check.records_l, abs=1e-3)
    assert check.lambda_w > check.sampled_l
