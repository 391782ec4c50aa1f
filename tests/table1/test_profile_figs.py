"""Figs 9-10 computations: the step decomposition is exact on synthetic steps, and sane on the committed samples."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from petals_chain.experiments import fig9_computation as f9
from petals_chain.experiments import fig10_communication as f10
from petals_chain.experiments import profile_figs as pf
from petals_chain.launch.profile_fit import FULL_GRID, ServerFit, synthetic_samples
from petals_chain.model import SpecError

L = 30
BASE = (FULL_GRID.base_input, FULL_GRID.base_output)


def _synthetic(fit: ServerFit):
    return synthetic_samples(fit, FULL_GRID.jobs(L), np.random.default_rng(0))


FIT = ServerFit("s0", round_trip_s=0.05, session_s=0.01, t_o_s=0.001, t_in_s=1e-4, t_out_s=2e-3, rtt_s=0.03)


def test_decomposition_is_exact_when_the_steps_follow_the_model():
    samples = _synthetic(FIT)
    for data in (f9.panels(samples, {"s0": FIT}, L, BASE), f10.panels(samples, {"s0": FIT}, L, BASE)):
        for key, pts in data.items():
            assert pts, key
            err = pf.panel_error(pts)
            assert err.rel_rmse < 1e-9 and err.max_rel_error < 1e-9, key


def test_a_wrong_model_shows_where_it_over_estimates():
    samples = _synthetic(FIT)
    slow = ServerFit("s0", 0.05, 0.01, 0.001, 1e-4, 2.4e-3, rtt_s=0.03)  # decode 20 % too slow
    err = pf.panel_error(f9.panels(samples, {"s0": slow}, L, BASE)["output"])
    assert err.bias > 0 and err.under_at == () and set(err.over_at) == set(FULL_GRID.output_tokens)
    # the paper's communication model: RTT + 18 ms = 48 ms per round trip, under the true 50 ms
    paper = pf.panel_error(f10.panels(samples, {"s0": FIT}, L, BASE, paper_model=True)["rest @ output"])
    assert paper.bias == pytest.approx(-0.04, abs=1e-9)
    assert "under-estimates by 4.0 %" in paper.describe()


def test_bad_input():
    with pytest.raises(SpecError, match="no fit"):
        pf.computation_vs_blocks(_synthetic(FIT), {}, BASE)
    with pytest.raises(SpecError, match="axis"):
        pf.first_token_comm(_synthetic(FIT), {"s0": FIT}, num_blocks=L, axis="blocks", base=BASE)
    with pytest.raises(SpecError, match="all zero"):
        pf.panel_error([pf.Point("s0", 1, 0.0, 1.0)])
    with pytest.raises(SpecError, match="no profile samples"):
        f9.load_stem(f9.DEFAULT_STEM.with_name("nonexistent"))


def test_committed_profile_matches_the_papers_shapes(tmp_path):
    profile, samples = f9.load_stem()
    data = f9.panels(samples, profile.fits, profile.num_blocks, BASE)
    kinds = pf.kind_of(profile.fits)
    for key, pts in data.items():
        err = pf.panel_error(pts)
        assert err.n >= 9 and err.rel_rmse < 0.6, (key, err)
        for kind in ("high end", "low end"):
            assert pf.slope([p for p in pts if kinds[p.server] == kind]) > 0, (key, kind)  # grows with x
    hi = pf.slope([p for p in data["output"] if kinds[p.server] == "high end"])
    lo = pf.slope([p for p in data["output"] if kinds[p.server] == "low end"])
    assert lo > hi  # the low-end stand-ins decode more slowly (1.16 x on the committed, loaded-machine profile)
    comm = f10.panels(samples, profile.fits, profile.num_blocks, BASE)
    assert pf.slope(comm["rest @ output"]) > 0.5 * min(f.round_trip_s for f in profile.fits.values())
    summary = f9.run(argparse.Namespace(out=tmp_path, quick=False, seed=1))
    assert (tmp_path / "fig9.csv").is_file() and (tmp_path / "fig9.png").stat().st_size > 10_000
    assert any(line.startswith("decode vs output length: relative RMSE") for line in summary.lines)
    paper = f10.panels(samples, profile.fits, profile.num_blocks, BASE, paper_model=True)
    assert [p.measured_s for p in paper["rest @ output"]] == [p.measured_s for p in comm["rest @ output"]]
    assert all(p.model_s == pytest.approx((p.x - 1) * (profile.fits[p.server].rtt_s + 0.018))
               for p in paper["rest @ output"])
