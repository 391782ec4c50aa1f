"""torta-trust: the PPO layer's trust region against OT alone, on a tiny setting (the main comparison's rows give
the default trust; the others are trained here), and the plateau of a learning curve."""

from __future__ import annotations

from argparse import Namespace

import pytest

from petals_chain.experiments import torta_trust
from petals_chain.experiments.common import read_csv, write_csv
from petals_chain.experiments.torta_common import RunSettings, evaluate_topology
from petals_chain.torta.params import DEFAULT


def test_plateau_is_where_the_smoothed_reward_has_made_most_of_its_rise() -> None:
    rising = [float(min(e, 20)) for e in range(40)]  # rises for 20 episodes, then flat
    assert 15 <= torta_trust.plateau_episode(rising) <= 22
    assert torta_trust.plateau_episode([1.0] * 30) == 0 and torta_trust.plateau_episode([]) == 0


def test_tiny_run_pairs_each_trust_with_ot_alone_by_seed(tmp_path, monkeypatch) -> None:
    rs = RunSettings(4, 2, 2, DEFAULT.with_(policy_hidden=(8, 8, 8), epochs=1), 1)
    monkeypatch.setattr(torta_trust, "settings", lambda args: rs)
    args = Namespace(quick=True, seed=3, out=tmp_path, replot=False)
    with pytest.raises(FileNotFoundError, match="run the main comparison first"):
        torta_trust.run(args)
    main = []
    for topo in torta_trust.TOPOLOGIES:
        main += evaluate_topology(topo, args, rs, rs.seeds, runs=((None, torta_trust.METHODS),))
    write_csv(tmp_path / "torta-runs-quick.csv", main)
    summary = torta_trust.run(args)
    rows = read_csv(tmp_path / "torta-trust.csv")
    assert {float(r["trust"]) for r in rows} == set(torta_trust.TRUSTS)
    assert len(rows) == len(torta_trust.TRUSTS) * len(torta_trust.TOPOLOGIES) * rs.seeds * len(torta_trust.METHODS)
    seeds = {(r["topology"], float(r["trust"])): set() for r in rows}
    for r in rows:
        seeds[(r["topology"], float(r["trust"]))].add(r["seed"])
    assert len({frozenset(v) for v in seeds.values()}) == 1  # every trust on the same seeds: paired
    assert any("TORTA faster than OT alone" in line for line in summary.lines)
    assert (tmp_path / "torta-trust.png").is_file()
    again = torta_trust.run(Namespace(**{**vars(args), "replot": True}))
    assert again.lines == summary.lines
