"""migration-jffc's steady-state window, paired summary, bounds and checkpoint, on replications built by hand (the
live replay itself runs in the experiment; tests/live covers JFFC moves on a real swarm)."""

from __future__ import annotations

import math
from argparse import Namespace
from pathlib import Path

import pytest

from petals_chain.analysis.bounds import theorem37_bounds
from petals_chain.experiments import migration_jffc as mj
from petals_chain.experiments.migration_live import Request, load_replications, save_replication

SIZE = {"warmup": 1, "measured": 3, "tail": 1, "new_tokens": 4, "replications": 2}


def _req(policy: str, i: int, arrival: float, response: float, chain: str, moves: int = 0) -> Request:
    return Request(policy, i, arrival, end_s=arrival + response, waited_s=0.0, service_s=response,
                   first_chain="v1.1" if moves else chain, last_chain=chain, moves=moves,
                   move_downtime_s=0.5 * moves, move_modes=("kv",) * moves, tokens=(1, i),
                   segments=((chain, arrival, arrival + response),))


def _rep(rep: int, gain: float) -> dict:
    """Five arrivals 10 s apart; plain JFFC serves the even ones on the fast chain in 4 s and the odd ones on the
    slow chain in 10 s; with migration the odd ones take ``gain`` s less (moved to the fast chain). The warm-up
    request and the tail are 100 s under both policies, so a mean over them would show it."""
    plain, moved = [], []
    for i in range(5):
        edge = i in (0, 4)
        fast = i % 2 == 0
        base = 100.0 if edge else (4.0 if fast else 10.0)
        plain.append(_req("none", i, 10.0 * i, base, "v1.0" if fast else "v1.1"))
        moved.append(_req("jffc", i, 10.0 * i, base - (0 if fast or edge else gain), "v1.0", moves=int(not fast)))
    calibration = {"chains": [{"chain_id": "v1.0", "capacity": 2, "orchestrator_service_time_s": 3.0,
                               "full_service_time_s": 5.0},
                              {"chain_id": "v1.1", "capacity": 2, "orchestrator_service_time_s": 9.0,
                               "full_service_time_s": 12.0}], "capacity_per_s": 2 / 5 + 2 / 12}
    stats = {p: {"offered": 0, "completed": 2 * (p == "jffc"), "failed": 0, "dropped": 0} for p in ("none", "jffc")}
    return {"rep": rep, "model": "tiny", "rate": 0.28, "calibration": calibration, "order": ["none", "jffc"],
            "runs": {"none": plain, "jffc": moved}, "stats": stats, "loadavg": [[0.5, 0.4, 0.3], [0.6, 0.5, 0.4]],
            "warmup": 1, "measured": 3, "tail": 1}


def test_only_the_middle_requests_count_and_the_bound_uses_what_plain_jffc_measured() -> None:
    figs = mj.replication_figures(_rep(0, 3.0))
    # measured: requests 1 (slow), 2 (fast), 3 (slow): plain (10 + 4 + 10) / 3, migration (7 + 4 + 7) / 3
    assert figs["mean_response_s"]["none"] == pytest.approx(8.0)
    assert figs["mean_response_s"]["jffc"] == pytest.approx(6.0)
    assert figs["arrival_rate"] == pytest.approx(0.1)  # 4 gaps over 40 s
    # service per chain under plain JFFC over all its requests: v1.0 (100 + 4 + 100) / 3, v1.1 10
    assert figs["service_s"] == pytest.approx([68.0, 10.0])
    bound = theorem37_bounds([1 / 68.0, 1 / 10.0], [2, 2], 0.1)
    assert math.isfinite(bound.lower_s)
    assert (figs["lower_s"], figs["upper_s"]) == pytest.approx((bound.lower_s, bound.upper_s))


def test_summary_pairs_by_replication_and_says_where_plain_jffc_lies(tmp_path: Path) -> None:
    reps = [_rep(0, 3.0), _rep(1, 2.0)]
    summary = mj._summarize(reps, SIZE, Namespace(out=tmp_path, quick=False, seed=1))
    text = "\n".join(summary.lines)
    assert "only the middle 3 count" in text
    # per replication, migration minus plain: −2 s and −4/3 s
    assert summary.data["difference_s"]["mean"] == pytest.approx(-5 / 3)
    assert summary.data["difference_s"]["n"] == 2
    assert "moves: 4 completed" in text and "outputs identical under both policies: True; errors: 0" in text
    assert math.isfinite(summary.data["lower_bound_s"])
    assert ("inside it" in text) == (summary.data["lower_bound_s"] <= 8.0 <= summary.data["upper_bound_s"])
    assert len((tmp_path / "migration-jffc.csv").read_text().splitlines()) == 1 + 2 * 2 * 5
    assert (tmp_path / "migration-jffc.png").is_file()


def test_a_failed_request_stops_the_summary_instead_of_skewing_the_pairs(tmp_path: Path) -> None:
    rep = _rep(0, 3.0)
    rep["runs"]["jffc"][2].error = "RuntimeError: boom"
    with pytest.raises(RuntimeError, match="1 requests failed"):
        mj._summarize([rep], SIZE, Namespace(out=tmp_path, quick=False, seed=1))


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.jsonl"
    for r in (_rep(0, 3.0), _rep(1, 2.0)):
        save_replication(path, r)
    back = load_replications(path, mj._key)
    assert sorted(back) == [0, 1]
    assert mj.replication_figures(back[1]) == mj.replication_figures(_rep(1, 2.0))
