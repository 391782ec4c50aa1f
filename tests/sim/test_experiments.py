"""Quick runs of the compose-side experiments write their CSV/PNG/README and show the paper's claims."""

from __future__ import annotations

import argparse
import csv
import json
import math

import numpy as np
import pytest

from petals_chain.experiments import load
from petals_chain.experiments.__main__ import main
from petals_chain.experiments.common import update_readme


def _args(tmp_path, seed=1):
    return argparse.Namespace(quick=True, seed=seed, out=tmp_path, workers=1)


def _rows(path):
    with path.open() as fh:
        return list(csv.DictReader(fh))


@pytest.mark.data
def test_fig3_gbp_cr_never_loses_to_random_placements(tmp_path):
    summary = load("fig3").run(_args(tmp_path))
    rows = _rows(tmp_path / "fig3.csv")
    assert (tmp_path / "fig3.png").stat().st_size > 10_000
    for case in ("homogeneous", "heterogeneous"):
        for lam in {r["arrival_rate"] for r in rows if r["case"] == case}:
            ours = [float(r["objective"]) for r in rows if r["case"] == case and r["arrival_rate"] == lam
                    and r["method"] == "GBP-CR"]
            rand = [float(r["objective"]) for r in rows if r["case"] == case and r["arrival_rate"] == lam
                    and r["method"] == "random" and np.isfinite(float(r["objective"]))]
            assert len(ours) == 1
            assert not rand or ours[0] <= min(rand)
    assert "GBP-CR" in summary.lines[0]


@pytest.mark.data
def test_fig4_gca_between_lower_bound_and_gbp_cr(tmp_path):
    load("fig4").run(_args(tmp_path))
    rows = _rows(tmp_path / "fig4.csv")
    assert len(rows) >= 6
    for r in rows:
        gca, ilp, low, ck = (int(r[k]) for k in ("gca", "ilp", "lower", "cK"))
        assert low <= ilp <= gca <= ck


@pytest.mark.data
def test_fig6_lower_bound_pick_is_near_the_simulated_best(tmp_path):
    summary = load("fig6").run(_args(tmp_path))
    rows = _rows(tmp_path / "fig6.csv")
    for r in rows:
        if np.isfinite(float(r["sim_s"])):
            assert float(r["lower_s"]) <= float(r["upper_s"]) + 1e-9
    picks = summary.data["picks"]
    by_c = {}
    for r in rows:
        by_c.setdefault(int(r["c"]), []).append(float(r["sim_s"]))
    sim_mean = {c: np.mean(v) for c, v in by_c.items()}
    best = min(v for v in sim_mean.values() if np.isfinite(v))
    # the c the lower bound picks is within 5 % of the best simulated mean
    assert sim_mean[picks["lower_s"]] <= 1.05 * best


@pytest.mark.data
def test_fig7_and_the_results_readme(tmp_path):
    assert main(["fig7", "--quick", "--out", str(tmp_path)]) == 0
    rows = _rows(tmp_path / "fig7.csv")
    lower = [int(r["lower"]) for r in rows]
    assert all(c >= 1 for c in lower)
    assert lower == sorted(lower)  # the lower bound's c* grows with λ
    text = (tmp_path / "README.md").read_text()
    assert "## fig7" in text and "python -m petals_chain.experiments fig7 --quick" in text
    data = json.loads((tmp_path / "fig7.json").read_text())
    assert data["name"] == "fig7"


def test_readme_sections_are_replaced_not_duplicated(tmp_path):
    from petals_chain.experiments.common import Summary

    update_readme(tmp_path, Summary("figX", "first", "cmd a", ["one"]))
    update_readme(tmp_path, Summary("figA", "other", "cmd b", ["two"]))
    update_readme(tmp_path, Summary("figX", "second", "cmd c", ["three"]))
    text = (tmp_path / "README.md").read_text()
    assert text.count("## figX") == 1 and "second" in text and "first" not in text
    assert text.index("## figA") < text.index("## figX")


def test_unknown_experiment_is_refused(capsys):
    assert main(["fig99"]) == 2
    assert "unknown experiment" in capsys.readouterr().err
    with pytest.raises(KeyError):
        load("nope")


@pytest.mark.data
def test_fig5_jffc_is_best_and_mostly_service(tmp_path):
    summary = load("fig5").run(_args(tmp_path))
    rows = _rows(tmp_path / "fig5.csv")
    loads = sorted({float(r["load"]) for r in rows})
    for rho in loads:
        def mean(pol, key="mean_response_s", rho=rho):
            return np.mean([float(r[key]) for r in rows if r["policy"] == pol and float(r["load"]) == rho])
        for pol in ("JSQ", "SED", "JIQ"):
            assert mean("JFFC") <= mean(pol) * 1.03, (rho, pol)
        if rho <= 0.7:
            assert mean("JFFC", "mean_service_s") / mean("JFFC") > 0.85
    assert "JFFC between the Theorem 3.7 bounds" in summary.lines[1]


def test_data_dir_option_sets_the_folder_for_every_reader(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("PETALS_CHAIN_DATA", raising=False)
    assert main(["fig3", "--quick", "--data-dir", str(tmp_path / "missing"), "--out", str(tmp_path)]) == 2
    assert "data folder" in capsys.readouterr().err and not (tmp_path / "fig3.csv").exists()
    from petals_chain.data import data_dir

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["fig3", "--quick", "--data-dir", str(empty), "--out", str(tmp_path)]) == 2
    assert data_dir() == empty  # the option reached the reader, which names the file it missed there
    assert f"{empty}/ripe_atlas_eu_rtt.csv" in capsys.readouterr().err


@pytest.mark.data
def test_replot_redraws_fig3_from_its_csv_with_the_same_summary(tmp_path):
    """--replot reads the saved CSV: the same summary lines, a new PNG, no simulation; nothing saved is an error."""
    first = load("fig3").run(_args(tmp_path))
    (tmp_path / "fig3.png").unlink()
    again = load("fig3").run(argparse.Namespace(**vars(_args(tmp_path)), replot=True))
    assert again.lines == first.lines and (tmp_path / "fig3.png").stat().st_size > 10_000
    # the figures come from the file, not a new simulation: every random placement marked as missing the rate
    rows = _rows(tmp_path / "fig3.csv")
    for r in rows:
        r["objective"] = r["objective"] if r["method"] == "GBP-CR" else "nan"
    with (tmp_path / "fig3.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    edited = load("fig3").run(argparse.Namespace(**vars(_args(tmp_path)), replot=True))
    assert "cannot reach the rate: 100 %, 100 %, 100 %" in edited.lines[0] and edited.lines != first.lines
    with pytest.raises(FileNotFoundError, match="no saved results"):
        load("fig5").run(argparse.Namespace(**vars(_args(tmp_path)), replot=True))


def test_replot_of_an_experiment_that_cannot_is_refused(tmp_path, capsys):
    assert main(["fig4", "--replot", "--out", str(tmp_path)]) == 2
    assert "fig4 cannot redraw" in capsys.readouterr().err
    assert main(["fig6", "--replot", "--out", str(tmp_path)]) == 2  # no results/fig6.csv there yet
    assert "no saved results" in capsys.readouterr().err


@pytest.mark.data
def test_fig8_cells_run_with_their_whole_grid_seeds(tmp_path, monkeypatch, capsys):
    from petals_chain.experiments import fig8_overall as fig8

    grid = {"Js": (20, 40), "etas": (0.4,), "runs": 2, "n_jobs": 400}
    monkeypatch.setattr(fig8, "QUICK", grid)
    assert main(["fig8", "--quick", "--workers", "1", "--out", str(tmp_path), "--cells", "40:0.4"]) == 0
    (row,) = _rows(tmp_path / "fig8_cell_check.csv")
    assert (row["J"], row["eta"]) == ("40", "0.4")
    settings = ((20, 0.4), (40, 0.4))
    task = fig8.Fig8Run(settings, 2, 400)
    seeds = np.random.SeedSequence(1).spawn(4)
    direct = [task(seeds[i], i)["proposed_mean_response_s"] for i in (2, 3)]  # cell 1, runs 0 and 1
    assert float(row["proposed_mean_response_s"]) == pytest.approx(np.mean(direct), rel=1e-12)
    assert not (tmp_path / "fig8_runs.csv").exists() and "fig8-cells" in (tmp_path / "README.md").read_text()
    assert main(["fig8", "--quick", "--out", str(tmp_path), "--cells", "30:0.4"]) == 2
    assert "30:0.4 not in fig8's grid" in capsys.readouterr().err
    assert main(["fig7", "--cells", "40:0.4"]) == 2 and "fig8's" in capsys.readouterr().err


@pytest.mark.data
def test_fig8_methods_recomputes_only_those_columns(tmp_path, monkeypatch, capsys):
    from petals_chain.compose.method_table import METHODS
    from petals_chain.experiments import fig8_overall as fig8

    monkeypatch.setattr(fig8, "QUICK", {"Js": (40,), "etas": (0.4,), "runs": 2, "n_jobs": 400})
    saved = [{"J": 40, "eta": 0.4, "run": r} | {f"{m}_{k}": v for m in METHODS for k, v in (
        ("status", "infeasible"), ("mean_response_s", float("nan")), ("mean_waiting_s", float("nan")),
        ("mean_service_s", float("nan")), ("note", "kept"))} for r in range(2)]
    fig8.write_csv(tmp_path / "fig8_runs.csv", saved)
    assert main(["fig8", "--quick", "--workers", "1", "--out", str(tmp_path), "--methods", "proposed"]) == 0
    rows = _rows(tmp_path / "fig8_runs.csv")
    assert [list(r) for r in rows] == [list(saved[0])] * 2  # the saved columns, in their order
    assert all(r["proposed_status"] == "ok" and float(r["proposed_mean_response_s"]) > 0 for r in rows)
    assert all(r["paper_status"] == "infeasible" and r["paper_note"] == "kept" for r in rows)
    assert "--methods proposed" in (tmp_path / "README.md").read_text()
    fig8.write_csv(tmp_path / "fig8_runs.csv", saved[:1])
    assert main(["fig8", "--quick", "--out", str(tmp_path), "--methods", "proposed"]) == 2
    assert "not a whole 2-run grid" in capsys.readouterr().err
    assert main(["fig8", "--quick", "--out", str(tmp_path), "--methods", "nope"]) == 2
    assert "unknown nope" in capsys.readouterr().err


def test_fig8_an_overloaded_cell_is_unstable_not_a_percentage():
    """A cell where a baseline was overloaded in some run has no steady-state mean: no % and no interval, and the
    verdict lines count it apart from the stable cells."""
    from petals_chain.experiments import fig8_overall as fig8

    rows = []
    for cell, over in (((10, 0.4), True), ((20, 0.4), False)):
        for k in range(3):
            row = {"J": cell[0], "eta": cell[1], "run": k, "proposed_status": "ok",
                   "proposed_mean_response_s": 10.0 + k}
            for base in fig8.BASELINES:
                row[f"{base}_status"] = "overloaded" if over and base == "petals" and k == 1 else "ok"
                row[f"{base}_mean_response_s"] = 12.0 + k + (500 if over and base == "petals" else 0)
            rows.append(row)
    red = {(r["J"], r["eta"]): r for r in fig8.reductions(rows, ((10, 0.4), (20, 0.4)))}
    assert red[(10, 0.4)]["vs_petals_overloaded_runs"] == 1 and math.isnan(red[(10, 0.4)]["vs_petals_pct"])
    assert fig8._fmt(red[(10, 0.4)], "petals") == "unstable" and fig8._fmt(red[(20, 0.4)], "petals") != "unstable"
    assert red[(10, 0.4)]["vs_bprr_pct"] > 0  # the other baselines of that cell keep their comparison
    lines = fig8._verdicts(list(red.values()))
    petals = next(line for line in lines if "PETALS" in line and "capped" not in line.lower())
    assert "of 1 stable cells (paired 95 % CI); unstable (overloaded) in 1 of 2" in petals
