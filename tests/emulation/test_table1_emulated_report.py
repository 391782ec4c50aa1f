"""The emulated Table 1's report: times ÷ k, invalid replays left out, censored requests counted at the cutoff, and
the paired intervals against PETALS over requests and over rounds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from petals_chain.experiments.replay import RequestRecord
from petals_chain.experiments.table1_report import write_requests_csv
from petals_chain.experiments.table1_emulated_report import load_replays, report, summarize

K = 4.0


def _replay(out: Path, config: str, r: int, responses: list[float], *, valid: bool = True,
            censored: tuple[int, ...] = ()) -> None:
    recs = [RequestRecord(config, i, 0.0, 0.0, x, 0.0, x, x, 10, 2, 2, 0, 0.0, "s0",
                          "not finished" if i in censored else "", censored=i in censored)
            for i, x in enumerate(responses)]
    (out / "replays").mkdir(parents=True, exist_ok=True)
    write_requests_csv(out / "replays" / f"{config}-r{r}_requests.csv", recs)
    details = {"config": config, "round": r, "status": "ran", "time_dilation": K, "valid": valid,
               "validity": {"valid_share": 0.995 if valid else 0.9, "steps": 100}, "loadavg_1m": [0.5, 0.7]}
    (out / "replays" / f"{config}-r{r}.json").write_text(json.dumps(details))


def test_report_pairs_by_request_and_by_round(tmp_path: Path) -> None:
    # dilated seconds: PETALS 12 s per request, proposed 4 s (native 3 and 1), two rounds; one invalid extra replay
    for r in (1, 2):
        _replay(tmp_path, "petals", r, [12.0 + r, 12.0 - r, 12.0])
        _replay(tmp_path, "proposed", r, [4.0, 4.0, 4.0])
    _replay(tmp_path, "proposed", 3, [400.0] * 3, valid=False)
    replays = load_replays(tmp_path)
    assert len(replays) == 5 and sum(not r.valid for r in replays) == 1
    summary = summarize(replays)
    assert summary["petals"]["response_mean"] == pytest.approx(3.0)
    assert summary["proposed"]["response_mean"] == pytest.approx(1.0) and summary["proposed"]["replays"] == 2
    assert summary["proposed"]["vs_petals_pct"] == pytest.approx(100 * (1 - 1 / 3))
    mean, low, high = summary["proposed"]["saving_by_request"]
    assert mean == pytest.approx(2.0) and low < 2.0 < high and summary["proposed"]["paired_requests"] == 6
    mean, low, high = summary["proposed"]["saving_by_replay"]
    assert mean == pytest.approx(2.0) and summary["proposed"]["paired_rounds"] == 2
    lines = report(tmp_path)
    assert any("INVALID" in line for line in lines) and (tmp_path / "table1.png").is_file()


def test_censored_requests_count_at_the_cutoff(tmp_path: Path) -> None:
    _replay(tmp_path, "petals", 1, [8.0, 40.0, 8.0], censored=(1,))
    replay = load_replays(tmp_path)[0]
    assert replay.censored == 1 and replay.response[1] == pytest.approx(10.0)
    assert summarize([replay])["petals"]["censored"] == 1
