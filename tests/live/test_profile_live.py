"""The live profiler's model fit (paper Figs 9-10), its outputs, and the emulated device speed.

The fit is checked against step times generated from known figures (it must recover them);
the outputs are read back (profile JSON, cluster file the composer accepts); the slowdown is
timed on real CPU work. The live measurement itself runs in tests/test_table1.py (one testbed
for both, to keep CI short).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from petals_chain.launch.profile_fit import (
    FULL_GRID,
    PARAMS,
    QUICK_GRID,
    Capacity,
    ProfileGrid,
    ServerFit,
    StepSample,
    design_row,
    fit_server,
    synthetic_samples,
)
from petals_chain.launch.profile_results import Profile, job_times, load_profile, read_samples_csv, write_samples_csv
from petals_chain.launch.slowdown import speed_factor_from_env, stretched
from petals_chain.model import SpecError


def _random_fit(rng: np.random.Generator, name: str) -> ServerFit:
    """Plausible server figures: round trip 5-60 ms, session 0-20 ms, per-block times of a small CPU model."""
    return ServerFit(name, round_trip_s=rng.uniform(0.005, 0.06), session_s=rng.uniform(0.0, 0.02),
                     t_o_s=rng.uniform(1e-4, 2e-3), t_in_s=rng.uniform(2e-5, 3e-4), t_out_s=rng.uniform(5e-4, 5e-3))


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_fit_recovers_known_figures_without_noise(seed: int) -> None:
    """Exact step times from known (r, s, t_o, t_in, t_out): the fit returns them to 1e-6 relative."""
    rng = np.random.default_rng(seed)
    truth = _random_fit(rng, "s0")
    samples = synthetic_samples(truth, FULL_GRID.jobs(30), rng, noise_s=0.0)
    fit = fit_server(samples, "s0")
    for p in ("round_trip_s", "session_s", "t_o_s", "t_in_s", "t_out_s"):
        assert getattr(fit, p) == pytest.approx(getattr(truth, p), rel=1e-6, abs=1e-9), p
    assert fit.r2 == pytest.approx(1.0)
    assert fit.samples == len(samples)


def test_fit_recovers_figures_through_noise_and_gives_tau() -> None:
    """With 1 ms of step noise and repeats, τp and τc of a job are recovered within a few percent."""
    rng = np.random.default_rng(7)
    grid = ProfileGrid(repeats=4)
    for k in range(5):
        truth = _random_fit(rng, f"s{k}")
        fit = fit_server(synthetic_samples(truth, grid.jobs(30), rng, noise_s=1e-3), truth.name)
        for l_in, l_out in ((64, 24), (16, 2), (256, 32)):
            assert fit.tau_p_s(l_in, l_out) == pytest.approx(truth.tau_p_s(l_in, l_out), rel=0.08)
            assert fit.tau_c_s(l_out) == pytest.approx(truth.tau_c_s(l_out), rel=0.05)
            assert fit.job_time_s(30, l_in, l_out) == pytest.approx(truth.job_time_s(30, l_in, l_out), rel=0.03)
        assert fit.r2 > 0.9


def test_tau_formulas_follow_the_paper() -> None:
    """τp = t_o + t_in·l_in + t_out·(l_out−1); τc = s + l_out·r; model τc = l_out·(RTT + 18 ms)."""
    f = ServerFit("s", round_trip_s=0.03, session_s=0.01, t_o_s=0.001, t_in_s=1e-4, t_out_s=2e-3, rtt_s=0.02)
    assert f.tau_p_s(100, 11) == pytest.approx(0.001 + 0.01 + 0.02)
    assert f.tau_c_s(11) == pytest.approx(0.01 + 11 * 0.03)
    assert f.job_time_s(5, 100, 11) == pytest.approx(f.tau_c_s(11) + 5 * f.tau_p_s(100, 11))
    assert f.model_tau_c_s(10) == pytest.approx(10 * 0.038)
    assert f.inference_rps == pytest.approx(500.0) and f.forward_rps == pytest.approx(1e4)
    zero = ServerFit("z", 0.01, 0.0, 0.0, 0.0, 0.0)  # nnls may fit 0 for a cost too small to see
    assert math.isfinite(zero.inference_rps) and math.isfinite(zero.forward_rps) and zero.forward_rps > 1e6


def test_fit_refuses_under_determined_or_bad_samples() -> None:
    """One block count (round trip and compute inseparable), one input length, bad times or kinds: clear errors."""
    truth = ServerFit("s0", 0.02, 0.0, 1e-3, 1e-4, 2e-3)
    rng = np.random.default_rng(0)
    one_m = synthetic_samples(truth, [(30, 8, 4), (30, 64, 4)], rng)
    with pytest.raises(SpecError, match="two block counts"):
        fit_server(one_m, "s0")
    one_len = synthetic_samples(truth, [(1, 8, 4), (30, 8, 4)], rng)
    with pytest.raises(SpecError, match="two input lengths"):
        fit_server(one_len, "s0")
    with pytest.raises(SpecError, match="no step samples"):
        fit_server(one_m, "s9")
    bad = [StepSample("s0", 1, 8, 2, "decode", 1, 1, -0.5)] + synthetic_samples(truth, QUICK_GRID.jobs(30), rng)
    with pytest.raises(SpecError, match="positive"):
        fit_server(bad, "s0")
    with pytest.raises(SpecError, match="kind"):
        design_row(StepSample("s0", 1, 8, 2, "backward", 1, 1, 0.1))


def test_grid_covers_blocks_input_and_output_lengths() -> None:
    """Jobs vary m at the base job and l_in, l_out on all L blocks; fractions of L become counts; repeats."""
    g = ProfileGrid(blocks=(1, 0.5, 1.0), input_tokens=(8, 64), output_tokens=(2, 16), base_input=32,
                    base_output=8, repeats=2)
    jobs = g.jobs(30)
    assert {j[0] for j in jobs if j[1:] == (32, 8)} == {1, 15, 30}
    assert {j[1] for j in jobs if j[0] == 30 and j[2] == 8} == {8, 32, 64}
    assert {j[2] for j in jobs if j[0] == 30 and j[1] == 32} == {2, 8, 16}
    assert all(jobs.count(j) == 2 for j in jobs)
    assert g.max_length() == 64 + 16
    assert {j[0] for j in g.jobs(4)} == {1, 2, 4}


def test_samples_csv_round_trip_and_job_times(tmp_path: Path) -> None:
    """Samples survive CSV; job times are the sums of their steps."""
    rng = np.random.default_rng(3)
    truth = _random_fit(rng, "s1")
    samples = synthetic_samples(truth, [(4, 16, 5), (2, 16, 5)], rng)
    back = read_samples_csv(write_samples_csv(tmp_path / "s.csv", samples))
    assert back == samples
    jt = job_times(samples)
    assert jt[("s1", 4, 16, 5, 0)] == pytest.approx(truth.job_time_s(4, 16, 5))


def _profile(fits: dict[str, ServerFit], cap: Capacity | None = None) -> Profile:
    """A profile object as the CLI builds it."""
    return Profile("tb", "m", 30, 1527, fits, cap, (64, 24), "now", "cmd")


def test_profile_json_round_trip_and_errors(tmp_path: Path) -> None:
    """load_profile reads what to_json writes; a missing file or a bad field is an error naming it."""
    rng = np.random.default_rng(5)
    fits = {n: _random_fit(rng, n) for n in ("s0", "s1")}
    cap = Capacity(0.8, 64, 24, 4, 30.0, 24, 4.1)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_profile(fits, cap).to_json()))
    back = load_profile(path)
    assert back.capacity == cap and back.job == (64, 24) and set(back.fits) == set(fits)
    for n, f in fits.items():
        assert [getattr(back.fits[n], p) for p in PARAMS] == [getattr(f, p) for p in PARAMS]
    doc = json.loads(path.read_text())
    assert doc["servers"][0]["tau_p_s"] == pytest.approx(fits["s0"].tau_p_s(64, 24))
    doc["servers"][1]["t_out_s"] = "fast"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=r"servers\[1\]\.t_out_s"):
        load_profile(path)
    path.write_text("{}")
    with pytest.raises(SpecError, match="not a profile"):
        load_profile(path)
    with pytest.raises(SpecError, match="not found"):
        load_profile(tmp_path / "missing.json")


def test_outputs_give_a_cluster_the_composer_accepts(tmp_path: Path) -> None:
    """write_outputs: CSV, JSON, PNG, and a cluster file whose τ are the fitted ones for the profile's job."""
    from petals_chain.compose.cluster_file import load_cluster
    from petals_chain.compose.tuning import compose
    from petals_chain.launch.live_setup import ModelSetup
    from petals_chain.launch.profile_results import write_outputs

    rng = np.random.default_rng(11)
    fits = {n: _random_fit(rng, n) for n in ("s0", "s1", "s2")}
    samples = [s for f in fits.values() for s in synthetic_samples(f, QUICK_GRID.jobs(30), rng, 1e-4)]
    refit = {n: fit_server(samples, n, rtt_s=0.02) for n in fits}
    setup = ModelSetup(tmp_path, "m", "float32", 1527, 14_160_384, 2_345_472, 30, 576)
    memory = {"s0": 1.311e9, "s1": 0.656e9, "s2": 0.656e9}
    paths = write_outputs(tmp_path / "out", "tb", _profile(refit, Capacity(1.0, 64, 24, 6, 30, 30, 3)), samples,
                          setup, memory, QUICK_GRID)
    assert all(p.is_file() and p.stat().st_size > 0 for p in paths.values())
    cluster = load_cluster(paths["cluster"])
    assert cluster.model.num_blocks == 30 and cluster.model.cache_bytes == pytest.approx(2_345_472)
    by = {s.name: s for s in cluster.servers}
    for n, f in refit.items():
        assert by[n].tau_p_s == pytest.approx(f.tau_p_s(64, 24))
        assert by[n].tau_c_s == pytest.approx(f.tau_c_s(24))
        assert by[n].memory_bytes == pytest.approx(memory[n])
    assert cluster.load.arrival_rate == pytest.approx(0.7)  # target load × measured capacity
    comp = compose(cluster.servers, cluster.model, cluster.load.arrival_rate, cluster.load.target_load)
    assert comp.total_capacity >= 1


def _burn(seconds: float) -> float:
    """Busy CPU work for about ``seconds`` of this thread's CPU time."""
    t0 = time.thread_time()
    x = 0.0
    while time.thread_time() - t0 < seconds:
        x += math.sqrt(x + 1.0)
    return x


def test_slowdown_stretches_cpu_time_by_the_speed_factor() -> None:
    """At speed 0.5 a call lasts about twice its CPU time; at speed 1 it never sleeps; at 0.25 it sleeps 3× the CPU."""
    slow = stretched(_burn, 0.5)
    t0, c0 = time.perf_counter(), time.thread_time()
    slow(0.08)
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    assert wall >= 1.9 * cpu
    sleeps: list[float] = []
    same = stretched(_burn, 1.0, sleep=sleeps.append)
    same(0.01)
    assert sleeps == []  # speed 1: never sleeps (wall-clock free, so a busy machine cannot fail it)
    quarter = stretched(lambda: None, 0.25, clock=iter([1.0, 1.2]).__next__, sleep=sleeps.append)
    quarter()
    assert sleeps == [pytest.approx(0.6)]  # 0.2 s of CPU at a quarter speed: 3 × 0.2 s more


def test_speed_factor_from_env_checks_the_value() -> None:
    """Unset means 1; a number in (0, 1] is taken; anything else names the variable."""
    assert speed_factor_from_env({}) == 1.0
    assert speed_factor_from_env({"PETALS_CHAIN_SPEED_FACTOR": "0.5679"}) == pytest.approx(0.5679)
    for bad in ("fast", "0", "1.5", "-1"):
        with pytest.raises(ValueError, match="PETALS_CHAIN_SPEED_FACTOR"):
            speed_factor_from_env({"PETALS_CHAIN_SPEED_FACTOR": bad})
