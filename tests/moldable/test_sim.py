"""The loss-system simulator: a Table 1 cell, scaling of both schemes in n, invariants, Little's law, Lemma 2."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.model import SpecError
from petals_chain.moldable import kernel as K
from petals_chain.moldable.optimal import LoadError
from petals_chain.moldable.sim import (InvariantError, MoldableRun, measures, regime_load, replicate,
                                      replicate_cells, summarise)
from petals_chain.moldable.speedup import from_table, linear

SUB = (1.0, 1.8, 2.5, 3.0, 3.4)


def test_table1_cell_sub_linear_mean_field_exp() -> None:
    """Paper: P_b = 0.0204, E[D] = 0.3782 at n = 4000 (5e6 arrivals). 4 runs of 1e6 arrivals here; E[D] by the
    all-admitted estimator, as the completed-jobs one is biased low by a horizon 5 times shorter than the paper's."""
    rows = replicate(MoldableRun(4000, 0.8, SUB, "greedy-p", "exp", 1_000_000), 4, 5, workers=1, progress=False)
    s = summarise(rows)
    assert s["blocking"].ci_low <= 0.0204 <= s["blocking"].ci_high
    assert s["exec_time_all"].ci_low <= 0.3782 <= s["exec_time_all"].ci_high
    assert s["blocking"].half_width < 0.003 and s["exec_time_all"].half_width < 0.002


def test_greedy_p_blocking_falls_with_n_greedy_does_not() -> None:
    p_star, greedy = [], []
    for n in (250, 1000, 4000):
        p_star.append(MoldableRun(n, 0.8, SUB, "greedy-p", "exp", 200_000)(1)["blocking"])
        greedy.append(MoldableRun(n, 0.8, SUB, "greedy", "exp", 200_000)(1)["blocking"])
    assert p_star[0] > p_star[1] > p_star[2]
    assert p_star[2] < 0.03
    assert min(greedy) >= 0.14  # greedy stays near its fluid limit 1 - a_d/λ = 0.15


@pytest.mark.parametrize("dist", list(K.DISTS))
def test_invariants_and_little_in_every_run(dist: str) -> None:
    for speed, scheme in ((SUB, "greedy-p"), (SUB, "greedy"), (linear(5).s, "greedy-p")):
        row = MoldableRun(500, regime_load(500, 0.5, 0.1), speed, scheme, dist, 100_000)(3)
        # time averages vs per-job means: exact up to the jobs still in service at the end, whose share is
        # large only for Pareto sizes (infinite variance) in a run this short
        tol = 0.05 if dist == "pareto" else 0.01
        assert row["little_rel_err"] < tol and row["work_rel_err"] < 2 * tol
        assert row["busy_fraction"] <= 1
        if scheme == "greedy-p":
            assert row["max_servers_per_job"] <= 2 if speed == SUB else row["max_servers_per_job"] == 5
        # x̄ by server count adds up to the jobs in system
        assert sum(row[f"x{i}"] for i in range(1, 6)) == pytest.approx(row["occupancy_jobs"])


def test_sample_path_identity_is_enforced() -> None:
    sp = from_table(SUB)
    area, out = K.new_outputs(5)
    cum = np.cumsum([0, 0, 0.625, 0.375, 0.0])
    cum[-1] = 1
    K.moldable_kernel(100, sp.array(), cum, 80.0, 5000, 0, np.random.default_rng(0), 3, area, out)
    measures(sp, 100, 0.8, area, out)  # consistent
    area[2] *= 1.001
    with pytest.raises(InvariantError, match="Little"):
        measures(sp, 100, 0.8, area, out)


def test_lemma2_fails_when_two_counts_are_used() -> None:
    """Lemma 2 claims at most one job ever holds fewer than i_1 servers; with I* = {3, 4} (sub-linear, λ = 0.8)
    many do at once: an i_2-job leaves, an arrival takes i_1 servers and the next one gets the rest."""
    row = MoldableRun(250, 0.8, SUB, "greedy-p", "exp", 200_000)(1)
    assert row["max_jobs_below_i1"] >= 5
    # it holds when |I*| = 1 (linear speed-up: every job asks for d = 5)
    row = MoldableRun(250, 0.8, linear(5).s, "greedy-p", "exp", 200_000)(1)
    assert row["max_jobs_below_i1"] <= 1


def test_bad_simulation_input() -> None:
    with pytest.raises(SpecError, match="dist"):
        MoldableRun(100, 0.8, SUB, dist="weibull")
    with pytest.raises(SpecError, match="scheme"):
        MoldableRun(100, 0.8, SUB, scheme="best")
    with pytest.raises(SpecError, match="beta"):
        regime_load(100, 0.5, 20)
    with pytest.raises(LoadError, match="load"):
        MoldableRun(100, 1.5, SUB)


def test_replicate_cells_groups_rows_and_matches_single_runs() -> None:
    cells = [MoldableRun(100, 0.8, SUB, "greedy", "exp", 2000), MoldableRun(50, 0.5, SUB, "greedy-p", "det", 1000)]
    grouped = replicate_cells(cells, 3, 9, workers=1, progress=False)
    assert [[(r["cell"], r["replication"]) for r in g] for g in grouped] == [[(c, k) for k in range(3)] for c in (0, 1)]
    seeds = np.random.SeedSequence(9).spawn(6)
    assert grouped[1][2]["blocking"] == cells[1](seeds[5], 2)["blocking"]
    assert grouped[0][0]["blocking"] != grouped[0][1]["blocking"]
