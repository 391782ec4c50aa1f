"""A full TORTA comparison keeps each finished seed, so a run stopped after hours resumes without retraining."""

from __future__ import annotations

import json
from argparse import Namespace

import pytest

from petals_chain.experiments import common, torta_common
from petals_chain.experiments.torta_common import RunSettings, evaluate_topology
from petals_chain.torta.params import DEFAULT


def test_full_comparison_resumes_from_its_checkpoint(tmp_path, monkeypatch) -> None:
    real = common.checkpoint_path  # the real name (and None for --quick), kept under tmp_path, not results/resume/
    monkeypatch.setattr(torta_common, "checkpoint_path",
                        lambda name, a, code: (p := real(name, a, code)) and tmp_path / p.name)
    rs = RunSettings(4, 2, 1, DEFAULT.with_(policy_hidden=(8, 8, 8), epochs=1), 1)
    args = Namespace(quick=False, seed=5, out=tmp_path / "out")
    args.out.mkdir()
    first = evaluate_topology("abilene", args, rs, 2, runs=((None, ("OT-only", "SkyLB")),))
    assert {r["method"] for r in first} == {"OT-only", "SkyLB"} and len(first) == 4
    [ckpt] = tmp_path.glob("torta-runs-abilene-seed5-*.jsonl")
    assert len(ckpt.read_text().splitlines()) == 2  # one line per finished seed

    def no_training(*a, **k):
        raise AssertionError("a finished seed was computed again")

    monkeypatch.setattr(torta_common, "prepare", no_training)
    again = evaluate_topology("abilene", args, rs, 2, runs=((None, ("OT-only", "SkyLB")),))
    assert json.dumps(again, sort_keys=True) == json.dumps(first, sort_keys=True)  # NaN accuracy compares as text
    with pytest.raises(AssertionError, match="computed again"):  # a quick run keeps no checkpoint: it recomputes
        evaluate_topology("abilene", Namespace(quick=True, seed=5, out=args.out), rs, 2,
                          runs=((None, ("OT-only", "SkyLB")),))
