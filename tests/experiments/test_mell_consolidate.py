"""mell-consolidate's paired summary and checkpoint, on replications built by hand (the live replay itself runs in
the experiment; tests/live covers the packers on a real swarm)."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest

from petals_chain.experiments import mell_consolidate as mc
from petals_chain.experiments.migration_live import Request, load_replications, save_replication
from petals_chain.experiments.paired import paired


def _req(policy: str, i: int, chain: str, a: float, b: float, moves: tuple[str, ...] = ()) -> Request:
    return Request(policy, i, a, end_s=b, waited_s=0.0, service_s=b - a, first_chain=chain, last_chain=chain,
                   moves=len(moves), move_modes=moves, tokens=(1, 2, i), segments=((chain, a, b),))


def _rep(rep: int, wf_end: float, mell_end: float, load: float = 0.8) -> dict:
    """Two requests on two servers under worst fit; under Mell the second joins the first's server."""
    runs = {"worst-fit": [_req("worst-fit", 0, "v1.0", 0.0, 10.0), _req("worst-fit", 1, "v1.1", 1.0, wf_end)],
            "mell": [_req("mell", 0, "v1.0", 0.0, 10.0), _req("mell", 1, "v1.0", 1.0, mell_end, ("kv",))]}
    stats = {p: {"offered": 0, "completed": int(p == "mell"), "failed": 0, "dropped": 0} for p in runs}
    chains = [{"chain_id": "v1.0", "capacity": 2, "service_time_s": 9.0}]
    return {"load_fraction": load, "rep": rep, "model": "tiny", "rate": 0.5, "chains": chains,
            "order": ["worst-fit", "mell"], "runs": runs, "stats": stats,
            "loadavg": [[0.5, 0.4, 0.3], [0.6, 0.5, 0.4]]}


def test_paired_says_decided_or_what_the_run_could_detect() -> None:
    clear = paired([5.0, 6.0, 5.5, 6.5])
    assert clear.decided and "excludes 0" in clear.text(" s")
    noisy = paired([5.0, -4.0, 3.0, -2.0])
    assert not noisy.decided and noisy.detectable > noisy.half_width > abs(noisy.mean)
    assert "80 % power" in noisy.text(" s")
    assert "no interval" in paired([1.0]).text()
    with pytest.raises(ValueError, match="no differences"):
        paired([])


def test_summary_pairs_server_seconds_by_replication_at_each_load(tmp_path: Path) -> None:
    by_load = {0.8: [_rep(0, 12.0, 12.0), _rep(1, 14.0, 14.0), _rep(2, 13.0, 13.0)],
               0.4: [_rep(i, 11.0 + i, 11.0 + i, 0.4) for i in range(3)]}
    summary = mc._summarize(by_load, 2, (8, 16), Namespace(out=tmp_path, quick=False, seed=1))
    text = "\n".join(summary.lines)
    # worst fit holds v1.0 for 10 s and v1.1 for 11-13 s; Mell holds v1.0 only, from 0 to 12-14 s
    assert "load 0.8 (0.500 arrivals/s): server-seconds used per replication" in text
    assert "worst fit 22.0 s, Mell 13.0 s on average" in text and "worst fit 21.0 s, Mell 12.0 s on average" in text
    assert summary.data["0.8"]["saving_percent"]["n"] == 3 and summary.data["0.8"]["saving_percent"]["mean"] > 0
    assert "outputs identical under both packers: True; errors: 0" in text
    assert (tmp_path / "mell-consolidate.png").is_file()
    assert len((tmp_path / "mell-consolidate.csv").read_text().splitlines()) == 1 + 6 * 4


def test_checkpoint_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "ckpt.jsonl"
    reps = [_rep(0, 12.0, 12.0), _rep(1, 14.0, 13.0)]
    for r in reps:
        save_replication(path, r)
    back = load_replications(path, mc._key)
    assert sorted(back) == [(0.8, 0), (0.8, 1)]
    assert back[(0.8, 1)]["runs"]["mell"][1] == reps[1]["runs"]["mell"][1]
    assert load_replications(None, mc._key) == {} and load_replications(tmp_path / "none.jsonl", mc._key) == {}
    save_replication(None, reps[0])  # a --quick run keeps nothing
