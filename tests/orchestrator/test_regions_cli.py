"""The region-aware orchestrator's command line: a PPO checkpoint for as many regions refines the plan, a
mismatched one or a malformed latency matrix is refused with one line and exit code 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from petals_chain.orchestrator.regions.cli import anchor_map, build, latency_matrix, main, parse_args
from petals_chain.torta.ppo import BetaPolicy
from petals_chain.torta.regional import RegionError, RegionLoad

MODEL = ["--model-blocks", "4", "--block-bytes", "1GB", "--cache-bytes", "0.1GB"]


def checkpoint(path: Path, regions: int) -> Path:
    """A policy checkpoint in the format ``torta.train`` writes."""
    net = BetaPolicy(3 * regions + 3 + 2 * regions * regions, regions, hidden=(8,))
    torch.save({"policy": net.state_dict(), "value": {}, "episode": 1, "regions": regions, "anchored": True,
                "hidden": [8]}, path)
    return path


def test_checkpoint_policy_drives_the_plan(tmp_path: Path) -> None:
    """With --ppo-checkpoint, torta-ppo's plan is the policy's (near its anchor), torta's stays the bare OT plan;
    without one, torta-ppo is refused naming the policy."""
    args = parse_args(["--regions", "a,b,c", "--latency-ms", "5,60,25;60,5,40;25,40,5", "--ppo-checkpoint",
                       str(checkpoint(tmp_path / "p.pt", 3)), *MODEL])
    reg = build(args)
    assert list(reg.regions) == ["a", "b", "c"] and reg.macro.policy is not None
    reg.macro.counts[:] = [9.0, 1.0, 0.0]
    cap = np.full(3, 10.0)
    plan = reg.macro.new_slot(RegionLoad(cap, np.zeros(3), cap, np.zeros(3)))
    assert np.array_equal(plan, reg.macro.prob)
    ppo = reg.macro.ppo_plan
    assert np.allclose(ppo.sum(1), 1.0) and not np.allclose(ppo, reg.macro.prob)
    assert reg.check_policy("torta-ppo") == "torta-ppo"
    bare = build(parse_args(["--regions", "a,b,c", "--latency-ms", "5,60,25;60,5,40;25,40,5", *MODEL]))
    with pytest.raises(RegionError, match="policy: torta-ppo needs"):
        bare.check_policy("torta-ppo")


def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint for 4 regions, a 2×2 matrix for 3 regions, non-numbers: one line naming the option, exit 2."""
    ck = str(checkpoint(tmp_path / "p4.pt", 4))
    assert main(["--regions", "a,b,c", "--latency-ms", "0,1,1;1,0,1;1,1,0", "--ppo-checkpoint", ck, *MODEL]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --ppo-checkpoint") and "\n" not in err
    assert main(["--regions", "a,b,c", "--latency-ms", "0,1;1,0", *MODEL]) == 2
    assert "--latency-ms" in capsys.readouterr().err
    with pytest.raises(RegionError, match="--latency-ms"):
        latency_matrix("0,x;1,0", 2)
    assert main(["--regions", "a,b", "--latency-ms", "0,1;1,0", "--anchors", "z=http://h:1/health", *MODEL]) == 2
    assert capsys.readouterr().err.startswith("error: --anchors: unknown region 'z'")
    with pytest.raises(RegionError, match="--anchors: expected"):
        anchor_map("a=ftp://h", ["a"])
    assert anchor_map("a=http://h:1/x, b=https://g/y", ["a", "b"]) == {"a": "http://h:1/x", "b": "https://g/y"}
    assert np.allclose(latency_matrix("0,20;20,0", 2), [[0, 0.02], [0.02, 0]])


def test_unreadable_checkpoint_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file that is no checkpoint: exit 2 naming --ppo-checkpoint."""
    bad = tmp_path / "bad.pt"
    bad.write_text("not a checkpoint")
    assert main(["--regions", "a", "--latency-ms", "0", "--ppo-checkpoint", str(bad), *MODEL]) == 2
    assert capsys.readouterr().err.startswith("error: --ppo-checkpoint: cannot read")
