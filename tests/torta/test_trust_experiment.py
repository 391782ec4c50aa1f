"""torta-trust: the PPO layer's trust region against OT alone on a tiny setting, and the plateau of a learning
curve."""

from __future__ import annotations

from argparse import Namespace

import pytest

from petals_chain.experiments import torta_trust
from petals_chain.experiments.common import read_csv
from petals_chain.experiments.torta_common import RunSettings, evaluate_topology
from petals_chain.torta.params import DEFAULT


def test_plateau_is_where_the_smoothed_reward_has_made_most_of_its_rise() -> None:
    rising = [float(min(e, 20)) for e in range(40)]  # rises for 20 episodes, then flat
    assert 15 <= torta_trust.plateau_episode(rising) <= 22
    assert torta_trust.plateau_episode([1.0] * 30) == 0 and torta_trust.plateau_episode([]) == 0


def test_the_plateau_is_told_for_every_seed_with_those_still_rising() -> None:
    flat_after_20 = [float(min(e, 20)) for e in range(40)]
    still_rising = [float(e) for e in range(40)]
    text = torta_trust._plateau_text([flat_after_20, still_rising, flat_after_20])
    at = torta_trust.plateau_episode(flat_after_20)
    assert f"seeds {at}, {torta_trust.plateau_episode(still_rising)}, {at}) of 40" in text
    assert "1 of 3 seeds still rising (not converged)" in text
    assert "0 of 1 seeds still rising" in torta_trust._plateau_text([flat_after_20])


def test_tiny_run_pairs_each_trust_with_ot_alone_by_seed(tmp_path, monkeypatch) -> None:
    rs = RunSettings(4, 2, 2, DEFAULT.with_(policy_hidden=(8, 8, 8), epochs=1), 1)
    monkeypatch.setattr(torta_trust, "settings", lambda args: rs)
    args = Namespace(quick=True, seed=3, out=tmp_path, replot=False)
    summary = torta_trust.run(args)
    rows = read_csv(tmp_path / "torta-trust.csv")
    assert {float(r["trust"]) for r in rows} == set(torta_trust.TRUSTS)
    methods = torta_trust.METHODS + torta_trust.ANCHOR_METHODS
    assert len(rows) == len(torta_trust.TRUSTS) * len(torta_trust.TOPOLOGIES) * rs.seeds * len(methods)
    seeds = {(r["topology"], float(r["trust"])): set() for r in rows}
    for r in rows:
        seeds[(r["topology"], float(r["trust"]))].add(r["seed"])
    assert len({frozenset(v) for v in seeds.values()}) == 1  # every trust on the same seeds: paired
    assert any("TORTA faster than OT alone" in line for line in summary.lines)
    # the anchor arm trains nothing but shares the seed's predictor and arrivals: its OT-only is the shared one's
    anchor_lines = [line for line in summary.lines if "the anchor alone" in line]
    assert len(anchor_lines) == len(torta_trust.TOPOLOGIES)
    assert all(line.endswith(f"equals the shared evaluation's on {rs.seeds} of {rs.seeds} seeds")
               for line in anchor_lines)
    curves = read_csv(tmp_path / "torta-trust-curves.csv")  # every seed's training, not only the first
    assert {(c["topology"], int(float(c["seed"]))) for c in curves} == {
        (t, k) for t in torta_trust.TOPOLOGIES for k in range(rs.seeds)}
    # the main comparison's TORTA (default trust) on the same seeds is this run's trust-0.15 TORTA: same training
    main = evaluate_topology("abilene", args, rs, rs.seeds, runs=((None, ("TORTA",)),))
    here = {r["seed"]: float(r["mean_response_s"]) for r in rows
            if r["topology"] == "abilene" and r["method"] == "TORTA" and float(r["trust"]) == 0.15}
    assert {float(r["seed"]): r["mean_response_s"] for r in main} == pytest.approx(here)
    assert (tmp_path / "torta-trust.png").is_file()
    again = torta_trust.run(Namespace(**{**vars(args), "replot": True}))
    assert again.lines == summary.lines


def test_a_very_inaccurate_oracle_overforecasts_on_average() -> None:
    """Why Fig 12's TORTA is faster at PA 0.1 than at 0.3 (results/README.md, torta-fig12): the noisy oracle's
    relative error −ln(PA) cut at zero makes the forecast's mean (1 + ln(1/PA))/2 times the truth below PA = 1/e (1.65×
    at 0.1, 1.10× at 0.3; unbiased above), and a pool sized on an over-forecast waits less."""
    import numpy as np

    from petals_chain.torta.predictor import noisy_oracle

    actual = np.full(200_000, 10.0)
    rng = np.random.default_rng(0)
    ratio = {pa: noisy_oracle(actual, pa, rng).mean() / 10.0 for pa in (0.1, 0.3, 0.5, 0.9)}
    assert ratio[0.1] == pytest.approx((1 + np.log(10)) / 2, rel=0.01)
    assert ratio[0.3] == pytest.approx((1 + np.log(1 / 0.3)) / 2, rel=0.01)
    assert ratio[0.5] == pytest.approx(1.0, rel=0.01) and ratio[0.9] == pytest.approx(1.0, rel=0.01)


def test_one_training_per_seed_serves_the_comparison_fig12_and_the_trust_ablation(tmp_path, monkeypatch) -> None:
    """The main comparison (Figs 8-11), Fig 12 and the PPO ablation drawn in one process train each (topology, seed)
    once: their rows all come from the shared evaluation."""
    from petals_chain.experiments import torta_common, torta_fig12

    rs = RunSettings(4, 2, 2, DEFAULT.with_(policy_hidden=(8, 8, 8), epochs=1), 1)
    for mod in (torta_common, torta_fig12, torta_trust):
        monkeypatch.setattr(mod, "settings", lambda args: rs)
    trained = []
    real = torta_common.prepare
    # a training is a preparation with PPO episodes (the anchor arm prepares with none: its predictor only)
    monkeypatch.setattr(torta_common, "prepare", lambda *a, **k: (a[3] > 0 and trained.append(a[0])) or real(*a, **k))
    args = Namespace(quick=True, seed=4, out=tmp_path, replot=False)
    comparison = torta_common.comparison_rows(args)
    torta_fig12.run(args)
    torta_trust.run(args)
    assert sorted(trained) == sorted(torta_common.TOPOLOGIES * rs.seeds)  # one training per (topology, seed)
    fig12 = read_csv(tmp_path / "torta-fig12.csv")
    assert {round(float(r["accuracy"]), 2) for r in fig12 if r["method"] == "TORTA"} == set(torta_common.PAS)
    main = {(r["topology"], r["method"], r["seed"]): r["mean_response_s"] for r in comparison}
    for r in read_csv(tmp_path / "torta-trust.csv"):  # the ablation's baselines and default trust are the main rows
        method = {"OT-only (anchor run)": "OT-only"}.get(r["method"], r["method"])  # the anchor arm's own OT-only
        if method != "anchor" and (method != "TORTA" or float(r["trust"]) == DEFAULT.policy_trust):
            assert float(r["mean_response_s"]) == pytest.approx(main[(r["topology"], method, r["seed"])])
