"""The mell-theorem2 experiment: its rows match an independent per-slot check with the plain ILP, its summary
numbers are those of its CSV, `--replot` gives the same summary, and a slot above 4/3·OPT + c is reported."""

from __future__ import annotations

import argparse
from collections import Counter
from dataclasses import asdict

import numpy as np
import pytest

from petals_chain.experiments import mell_theorem2 as t2
from petals_chain.experiments.mell_common import hash_name
from petals_chain.experiments.paper import run_seeds
from petals_chain.mell.optimal import optimal_bins
from petals_chain.mell.random_sequences import SequenceShape, run_sequence
from petals_chain.mell.scheduler import MellScheduler

SEQS = 2
STEPS = {"mix": 25, "single-op": 60, "bursty": 25, "tiny": 25}


@pytest.fixture()
def tiny(monkeypatch, tmp_path):
    monkeypatch.setattr(t2, "SEQUENCES", {"quick": SEQS, "full": SEQS})
    monkeypatch.setattr(t2, "STEPS", STEPS)
    return argparse.Namespace(quick=True, seed=5, out=tmp_path, replot=False)


def _independent(seed: int) -> Counter:
    """Slots per (shape, OPT, |A|) from the same sequences, OPT by the ILP on every slot (no bound, no cache)."""
    seen: Counter = Counter()
    for name, shape in t2.SHAPES.items():
        for rng in run_seeds(seed + 7919 * hash_name(name), SEQS):
            def check(sched, _res, name=name):
                sizes = list(sched.st.size.values())
                if sizes and len(sizes) <= t2.MAX_LIVE:
                    opt = optimal_bins(sizes, t2.C)
                    if opt >= t2.MIN_OPT:
                        seen[(name, opt, sched.num_gpus())] += 1
            run_sequence(MellScheduler(t2.C), rng, STEPS[name], check=check, **asdict(shape))
    return seen


def test_rows_summary_and_replot(tiny):
    s = t2.run(tiny)
    rows = t2.saved_rows(tiny.out)
    assert (tiny.out / "mell_theorem2.png").stat().st_size > 10_000
    exact = [r for r in rows if r["opt"] is not None]
    # the rows are what a plain ILP on every slot finds (the size-bound shortcut and the cache change nothing)
    got = Counter()
    for r in exact:
        got[(r["shape"], r["opt"], r["gpus"])] += r["slots"]
    assert got == _independent(tiny.seed)
    assert {r["shape"] for r in exact} == set(t2.SHAPES)
    # the summary's numbers are those of the CSV
    d = s.data
    assert d["slots"] == sum(r["slots"] for r in exact) > 100
    assert d["worst_ratio"] == pytest.approx(max(r["gpus"] / r["opt"] for r in exact))
    assert d["worst_ratio_opt3"] == pytest.approx(max(r["gpus"] / r["opt"] for r in exact if r["opt"] >= 3))
    assert d["worst_excess"] == pytest.approx(max(r["gpus"] - 4 * r["opt"] / 3 for r in exact))
    assert d["share_equal"] == pytest.approx(sum(r["slots"] for r in exact if r["gpus"] == r["opt"]) / d["slots"])
    assert sum(d["diff"].values()) == d["slots"] and d["below_opt"] == 0
    assert 0 < d["ilps"] + d["searches"] <= d["solver_slots"] < d["slots"]
    assert all(r["size_bound"] <= r["opt"] for r in exact)
    assert {r["method"] for r in exact} <= {"bound", "ilp", "search"}
    assert f"slots above 4/3·OPT + c: {d['above_bound']}" in s.lines[2]
    # --replot redraws from the CSV alone, with the same summary
    (tiny.out / "mell_theorem2.png").unlink()
    tiny.replot = True
    again = t2.run(tiny)
    assert again.lines == s.lines and (tiny.out / "mell_theorem2.png").is_file()


def test_a_slot_above_the_bound_is_reported_as_a_counterexample():
    rows = [{"shape": "mix", "opt": 3, "gpus": 3, "size_bound": 3, "method": "bound", "slots": 7, "solves": 0,
             "first_at": "0/1"},
            {"shape": "mix", "opt": 3, "gpus": 9, "size_bound": 2, "method": "ilp", "slots": 2, "solves": 1,
             "first_at": "1/4"},  # 9 > 4/3·3 + 4 = 8
            {"shape": "mix", "opt": None, "gpus": 30, "size_bound": 20, "method": "-", "slots": 5, "solves": 0,
             "first_at": "2/9"},  # 30 ≤ 4/3·20 + 4: settled by the size bound
            {"shape": "mix", "opt": None, "gpus": 40, "size_bound": 20, "method": "-", "slots": 1, "solves": 0,
             "first_at": "2/10"}]  # not settled
    d = t2.summarise(rows)
    assert d["slots"] == 9 and d["above_bound"] == 2 and d["worst_excess"] == pytest.approx(5.0)
    assert d["worst_ratio_opt3"] == pytest.approx(3.0) and d["share_equal"] == pytest.approx(7 / 9)
    assert d["big_slots"] == 6 and d["big_settled"] == 5 and d["diff"] == {0: 7, 6: 2}


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="sequences"):
        t2.collect(1, 0)
    with pytest.raises(ValueError, match="no slot"):
        t2.summarise([])
    with pytest.raises(ValueError, match="tiny_share"):
        SequenceShape(tiny_share=1.5)
    with pytest.raises(ValueError, match="max_life"):
        SequenceShape(max_life=1)
    with pytest.raises(ValueError, match="capacity"):
        run_sequence(MellScheduler(8), np.random.default_rng(0), 3)
    with pytest.raises(ValueError, match="steps"):
        run_sequence(MellScheduler(1000), np.random.default_rng(0), -1)

