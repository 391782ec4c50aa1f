"""torta-live's replications: their arrivals, round order, checkpoint and paired summary, on replications built by
hand (the live rounds themselves need root and a swarm; tests/live covers the regional swarm)."""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest

from petals_chain.experiments import torta_live as tl
from petals_chain.torta import live_demo


def test_each_replication_has_its_own_arrivals_none_the_policy_was_trained_on() -> None:
    seqs = [tl.replication_arrivals(1, rep, quick=False) for rep in range(4)]
    assert tl.replication_arrivals(1, 2, quick=False) == seqs[2]  # seeded
    firsts = {tuple(s["r0"][:3]) for s in seqs}
    assert len(firsts) == 4
    trained = [live_demo.arrivals(np.random.default_rng(1 + live_demo.TRAIN_SEED_OFFSET + k), False)
               for k in range(live_demo.TRAIN_SCENARIOS)]
    assert not any(s == t for s in seqs for t in trained)


def test_rounds_alternate_direction_over_replications() -> None:
    assert tl.round_order(0) == list(tl.POLICIES) and tl.round_order(1) == list(reversed(tl.POLICIES))


def _rep(rep: int, extra: dict[str, float]) -> dict:
    """Two requests per origin; each policy's response is 2 s plus ``extra[policy]`` (+ 1 s for origin r0)."""
    rows = []
    for k, policy in enumerate(tl.round_order(rep)):
        for o in tl.ORIGINS:
            for i in range(2):
                rows.append({"rep": rep, "policy": policy, "round": 4 * rep + k, "origin": o, "id": i,
                             "at_s": float(i), "region": o, "response_s": 2.0 + extra.get(policy, 0.0)
                             + (o == "r0"), "waited_s": 0.0, "correct": True, "error": ""})
    return {"rep": rep, "order": tl.round_order(rep), "rows": rows, "loadavg": [[0.4, 0.3, 0.2], [0.5, 0.4, 0.3]]}


def test_summary_pairs_each_policy_with_torta_by_arrival_sequence(tmp_path: Path) -> None:
    reps = [_rep(0, {"rr": 1.0, "skylb": 0.2}), _rep(1, {"rr": 1.2, "skylb": -0.2}), _rep(2, {"rr": 0.8})]
    summary = tl.summarize(reps, Namespace(out=tmp_path, quick=False, seed=1))
    text = "\n".join(summary.lines)
    assert summary.data["rr-minus-torta"]["mean"] == pytest.approx(1.0)
    assert summary.data["rr-minus-torta"]["n"] == 3
    assert "round robin minus TORTA-OT, mean response paired by arrival sequence: +1.00 ± 0.50 s (95 % interval " \
           "excludes 0, n = 3)" in text
    assert summary.data["skylb-minus-torta"]["mean"] == pytest.approx(0.0)
    assert "SkyLB-style minus TORTA-OT" in text and "includes 0" in text
    assert "TORTA-OT: 2.50 s over 12 requests; origin r0: 3.00 s (served in r0 6, r1 0, r2 0)" in text
    assert "12/12 answers equal local greedy, 0 errors" in text
    assert len((tmp_path / "torta-live.csv").read_text().splitlines()) == 1 + 3 * 4 * 4
    assert (tmp_path / "torta-live.png").is_file()


def test_a_full_run_resumes_from_its_checkpoint_without_a_swarm(tmp_path: Path, monkeypatch) -> None:
    """With every replication in the checkpoint the run summarises without starting anything (no root needed)."""
    ckpt = tmp_path / "ckpt.jsonl"
    reps = [_rep(r, {"rr": 1.0 + 0.1 * r}) for r in range(tl.REPLICATIONS)]
    ckpt.write_text("".join(json.dumps(r) + "\n" for r in reps))
    monkeypatch.setattr(tl, "checkpoint_path", lambda name, args, code: ckpt)
    monkeypatch.setattr(tl, "run_live", lambda *a, **k: pytest.fail("started a swarm with nothing missing"))
    summary = tl.run(Namespace(out=tmp_path, quick=False, seed=1))
    assert summary.data["rr-minus-torta"]["n"] == tl.REPLICATIONS
