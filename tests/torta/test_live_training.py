"""The live demo's PPO policy: its training scenarios are the live workload (same regions, slot, lanes; never the
replayed seed), the trainer's ``--topology live3`` writes a checkpoint, and the live orchestrator loads it through
``--ppo-checkpoint`` so that torta-ppo routes by the policy's plan."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from petals_chain.orchestrator.regions.cli import build, parse_args
from petals_chain.torta import live_demo
from petals_chain.torta.regional import FORECAST_SLOTS, RegionLoad
from petals_chain.experiments.torta_train import main as train_main


def test_live_scenario_is_the_replayed_workload() -> None:
    """The scenario's tasks are exactly the seed's live arrivals (origin and time), binned by the live slot; the
    training seeds differ from the replayed one; the forecast is the live moving average."""
    sc = live_demo.live_scenario(1)
    times = live_demo.arrivals(np.random.default_rng(1), False)
    want = sorted((t, live_demo.REGIONS.index(o)) for o in live_demo.ORIGINS for t in times[o])
    got = list(zip(sc.tasks.arrival_s.tolist(), sc.tasks.origin.tolist()))
    assert got == want and sc.params.slot_s == live_demo.SLOT_S and sc.params.server_slots == live_demo.SLOTS_PER_SERVER
    assert np.array_equal(sc.tasks.slot, (sc.tasks.arrival_s // live_demo.SLOT_S).astype(int))
    train = live_demo.training_scenarios(1)
    assert all(not np.array_equal(s.tasks.arrival_s, sc.tasks.arrival_s) for s in train)
    counts = sc.tasks.counts(sc.slots, 3).astype(float)
    t = 12
    assert np.allclose(live_demo.live_forecast(counts, t), counts[t - FORECAST_SLOTS:t].mean(0))
    assert np.array_equal(live_demo.live_forecast(counts, 0), np.zeros(3))


def test_trained_live_checkpoint_drives_torta_ppo(tmp_path: Path) -> None:
    """Two episodes of ``train --topology live3`` give a checkpoint the live orchestrator loads; torta-ppo is then
    accepted and its plan is a routing matrix that differs from the OT plan torta follows."""
    assert train_main(["--topology", "live3", "--episodes", "2", "--seed", "3", "--out", str(tmp_path)]) == 0
    ck = tmp_path / "checkpoints" / "live3-ep2.pt"
    assert (tmp_path / "torta-train-live3.csv").read_text().count("\n") == 3  # header + one row per episode
    lat = ";".join(",".join(f"{x:g}" for x in row) for row in live_demo.LATENCY_MS)
    reg = build(parse_args(["--regions", ",".join(live_demo.REGIONS), "--latency-ms", lat, "--ppo-checkpoint", str(ck),
                            "--model-blocks", "4", "--block-bytes", "1e9", "--cache-bytes", "1e8"]))
    assert reg.check_policy("torta-ppo") == "torta-ppo"
    reg.macro.counts[:] = [6.0, 1.0, 0.0]
    cap = np.full(3, 0.5)
    ot = reg.macro.new_slot(RegionLoad(cap, np.array([3.0, 0.0, 1.0]), np.zeros(3), np.full(3, 2.0)))
    ppo = reg.macro.ppo_plan
    assert np.allclose(ppo.sum(1), 1.0) and (ppo >= 0).all() and not np.allclose(ppo, ot)
