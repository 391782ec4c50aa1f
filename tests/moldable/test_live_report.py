"""The moldable-live report: s(k) per count of other sessions in the batch, greedy(p*) against every other policy
paired by replication, and a full run that resumes from its checkpoint; on rows built by hand (the live cells need a
swarm; tests/orchestrator/test_width_leases.py covers the batch-aware rule)."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest

from petals_chain.experiments import moldable_live as ml
from petals_chain.experiments.checkpoints import append_record
from petals_chain.experiments.common import update_readme
from petals_chain.moldable.live import POLICIES

# tokens/s at widths 1, 2, 4: alone width helps (×1.5 at 4), beside 2 others barely (×1.1)
CALIB = [{"others": b, "width": w, "sessions": 2, "tokens_per_s": v, "tokens_per_step": 1.0 + 0.1 * w,
          "service_s": 24 / v, "accept_rate": 0.3}
         for b, speeds in ((0, (1.0, 1.3, 1.5)), (2, (0.8, 0.85, 0.88))) for w, v in zip((1, 2, 4), speeds)]
EXTRA = {"greedy-p": 0.0, "greedy-p-lone": 2.0, "fixed-1": 1.0, "fixed-max": 3.0}  # seconds over greedy-p


def _sessions(reps: int = 3) -> list[dict]:
    rows = []
    for rep in range(reps):
        for policy in POLICIES:
            for i in range(2):
                resp = 20.0 + EXTRA[policy] + 0.3 * rep + (0.1 * rep if policy == "fixed-1" else 0.0) + i
                rows.append({"policy": policy, "load": 0.7, "rep": rep, "arrival_s": float(i), "width": 2,
                             "wait_s": 0.5, "service_s": resp - 0.5, "new_tokens": 24, "steps": 20, "accepted": 4,
                             "drafted": 10, "response_s": resp, "tokens_per_s": 24 / (resp - 0.5),
                             "measured_load": 0.6})
    return rows


def test_profiles_are_fitted_per_count_of_others() -> None:
    fits = ml.profiles(CALIB)
    assert sorted(fits) == [0, 2]
    assert fits[0].s[0] == 1.0 and fits[0].s[3] == pytest.approx(1.5) and fits[2].s[3] == pytest.approx(1.1)
    # an old profile without the column was measured alone
    assert list(ml.profiles([{k: v for k, v in r.items() if k != "others"} for r in CALIB[:3]])) == [0]


def test_report_pairs_greedy_p_with_every_other_policy_by_replication(tmp_path: Path) -> None:
    summary = ml._report(Namespace(out=tmp_path, quick=False, seed=1), [dict(r) for r in CALIB], _sessions(),
                         "a[0:16] → b[16:30]", ml.FULL, [0.5, 1.5])
    text = "\n".join(summary.lines)
    assert "3 replications" in text
    assert "beside 0 other sessions: measured tokens/s over width 1 at k = 1: 1.00, 2: 1.30, 4: 1.50" in text
    assert "beside 2 other sessions" in text
    paired = summary.data["paired"]
    assert paired["0.7/greedy-p-lone"]["mean"] == pytest.approx(-2.0) and paired["0.7/greedy-p-lone"]["n"] == 3
    assert "load 0.70: greedy-p minus fixed-max, mean response paired by replication: -3.00 ± 0.00 s (95 % " \
           "interval excludes 0, n = 3)" in text
    assert paired["0.7/fixed-1"]["mean"] == pytest.approx(-1.1)  # fixed-1's extra 0.1 s per replication
    assert "machine load average (1 min) at the calibration's and the cells' starts 0.50–1.50" in text
    for name in ("moldable_live.png", "moldable_live.csv", "moldable_live_speedup.csv", "moldable_live_sessions.csv"):
        assert (tmp_path / name).is_file()
    calib, rows, sessions = ml.saved_plot_data(tmp_path)
    assert len(rows) == len(POLICIES) and len(sessions) == 3 * len(POLICIES) * 2


def test_a_full_run_resumes_from_its_checkpoint_without_a_swarm(tmp_path: Path, monkeypatch) -> None:
    """With the calibration and every cell in the checkpoint, the run reports without starting anything."""
    ckpt = tmp_path / "ckpt.jsonl"
    append_record(ckpt, {"kind": "calibration", "rows": CALIB, "loadavg": [0.4, 0.3, 0.2]})
    for rep in range(ml.FULL["replications"]):
        for load in ml.FULL["loads"]:
            for policy in POLICIES:
                rows = [{**r, "load": load} for r in _sessions(rep + 1) if r["rep"] == rep and r["policy"] == policy]
                append_record(ckpt, {"kind": "cell", "rep": rep, "load": load, "policy": policy, "loadavg": [0.9],
                                "rows": rows})
    append_record(ckpt, {"kind": "chain", "chain": "a[0:16] → b[16:30]"})
    monkeypatch.setattr(ml, "checkpoint_path", lambda name, args, code: ckpt)
    monkeypatch.setattr(ml, "_calibrate", lambda *a: pytest.fail("calibrated again"))
    monkeypatch.setattr(ml, "_live", lambda *a: pytest.fail("started a swarm with nothing missing"))
    summary = ml.run(Namespace(out=tmp_path, quick=False, seed=1, replot=False))
    assert summary.data["chain"] == "a[0:16] → b[16:30]"
    assert summary.data["paired"]["0.3/fixed-max"]["n"] == ml.FULL["replications"]
    update_readme(tmp_path, summary)  # what `python -m petals_chain.experiments` does with it: README + JSON
    replot = ml.run(Namespace(out=tmp_path, quick=False, seed=1, replot=True))
    assert replot.lines == summary.lines
