"""τp(b): a server's step time with b sessions batched, and the load-dependent model that uses it (compose/serial.py).

σ is the special case g(b) = 1 + σ(b − 1); the checks below compare the load-dependent MVA with an independent
birth-death solution, the curve's reading and validation, the slot cap on a batching server, the profiler's reading
of a server's step log, and cluster files carrying the curve."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from petals_chain.compose.joint import joint_compose
from petals_chain.compose.serial import cap_chains, chain_time, closed_chain, probe_throughput
from petals_chain.launch.profile_fit import BatchStep, batch_slowdown, linear_serial_fraction, read_step_log
from petals_chain.model import Chain, ModelSpec, ServerSpec, SpecError

MODEL = ModelSpec(num_blocks=30, block_bytes=14.16e6, cache_bytes=1.17e6, name="smol")


def _birth_death_throughput(demand: float, think: float, n: int, g) -> float:
    """n sessions alternating between a delay of mean ``think`` and one load-dependent station (i sessions there:
    total completion rate i/(demand·g(i))), solved as a birth-death chain: an independent check of the MVA."""
    up = [(n - i) / think for i in range(n)]  # i → i + 1
    down = [i / (demand * g(i)) for i in range(1, n + 1)]  # i → i − 1
    p = [1.0]
    for i in range(n):
        p.append(p[-1] * up[i] / down[i])
    p = np.array(p) / sum(p)
    return float(sum(p[i] * down[i - 1] for i in range(1, n + 1)))


@pytest.mark.parametrize("n", [1, 3, 8, 20])
@pytest.mark.parametrize("curve", [(1.0, 1.3, 1.5, 1.8), (1.0, 2.0), (1.0, 1.0, 1.0)])
def test_load_dependent_mva_matches_the_birth_death_chain(n, curve):
    spec = ServerSpec("a", 1e9, 2.0, 0.1, batch_slowdown=curve)
    thr, per_job = closed_chain([3.0], 2.0, n, [spec.step_factor])
    assert thr == pytest.approx(_birth_death_throughput(3.0, 2.0, n, spec.step_factor), rel=1e-9)
    assert per_job == pytest.approx(n / thr)


def test_a_server_that_never_slows_is_a_delay_and_one_session_at_a_time_is_a_queue():
    assert closed_chain([3.0], 2.0, 7, [lambda i: 1.0])[1] == pytest.approx(5.0)
    assert closed_chain([3.0, 1.0], 2.0, 5, [float, float]) == pytest.approx(closed_chain([3.0, 1.0], 2.0, 5))
    with pytest.raises(SpecError, match="step factors"):
        closed_chain([3.0], 2.0, 2, [float, float])


def test_step_factor_reads_the_table_extrapolates_past_it_and_falls_back_to_sigma():
    s = ServerSpec("a", 1e9, 1.0, 0.1, batch_slowdown=(1.0, 1.2, 1.5, 2.0))
    assert [s.step_factor(b) for b in (1, 2, 4)] == [1.0, 1.2, 2.0]
    assert s.step_factor(8) == pytest.approx(4.0)  # beyond B = 4 the extra sessions wait for another batch
    assert s.marginal_step_factor == pytest.approx(0.5) and s.contended
    sig = ServerSpec("b", 1e9, 1.0, 0.1, serial_fraction=0.25)
    assert sig.step_factor(5) == pytest.approx(2.0) and sig.marginal_step_factor == 0.25
    assert not ServerSpec("c", 1e9, 1.0, 0.1).contended
    with pytest.raises(SpecError, match="sessions >= 1"):
        s.step_factor(0)


@pytest.mark.parametrize("curve, message", [
    ((1.1, 1.2), "start with g\\(1\\) = 1"),
    ((1.0, 1.5, 1.4), "g\\(3\\) = 1.4 must lie in"),
    ((1.0, 2.5), "g\\(2\\) = 2.5 must lie in"),
    ((1.0, float("nan")), "finite number"),
    ([1.0, 1.2], "tuple of numbers"),
])
def test_a_bad_curve_is_refused_naming_the_server_and_the_point(curve, message):
    with pytest.raises(SpecError, match=f"server 'a'.*{message}"):
        ServerSpec("a", 1e9, 1.0, 0.1, batch_slowdown=curve)


def test_sigma_as_a_curve_predicts_the_same_probe_as_sigma():
    servers = [ServerSpec("a", 1e9, 2.0, 0.1), ServerSpec("b", 1e9, 2.4, 0.12)]
    for sigma in (0.0, 0.3, 1.0):
        curve = tuple(1.0 + sigma * (b - 1) for b in range(1, 9))
        as_curve = [dataclasses.replace(s, batch_slowdown=curve) for s in servers]
        assert probe_throughput(as_curve, [3, 5], 30) == pytest.approx(probe_throughput(servers, [3, 5], 30, sigma))


def test_a_batching_server_keeps_more_slots_than_a_serial_one_and_its_time_is_the_mva_time():
    batching = ServerSpec("a", 1.3e9, 2.0, 0.1, batch_slowdown=(1.0, 1.1, 1.25, 1.4, 1.55, 1.7, 1.85, 2.0))
    serial = dataclasses.replace(batching, batch_slowdown=(), serial_fraction=1.0)
    chain = Chain((0,), (30,), 25, 5.0)
    (b,) = cap_chains((chain,), [batching])
    (s,) = cap_chains((chain,), [serial])
    assert s.capacity == math.ceil(5.0 / 3.0)
    assert b.capacity == math.ceil(5.0 / (3.0 * 2.0 / 8))  # saturated: g(B)/B of τp·m per job
    assert b.service_time_s == pytest.approx(chain_time(chain, [batching], b.capacity))
    assert 5.0 < b.service_time_s < 5.0 + 3.0 * batching.step_factor(b.capacity)
    assert b.capacity / b.service_time_s > 2 * s.capacity / s.service_time_s  # batching is throughput


def test_the_default_composition_puts_more_sessions_on_a_batching_server_than_on_a_serial_one():
    names = ["s0", "s1", "s2", "s3"]
    curve = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7)
    batching = [ServerSpec(n, 1.31e9, 2.4, 0.08 + 0.01 * k, batch_slowdown=curve) for k, n in enumerate(names)]
    serial = [dataclasses.replace(s, batch_slowdown=(), serial_fraction=1.0) for s in batching]
    fast = joint_compose(batching, MODEL, 0.25)
    slow = joint_compose(serial, MODEL, 0.25)
    assert fast.total_rate_per_s > 2 * slow.total_rate_per_s


def test_the_curve_comes_from_the_decode_batches_of_a_step_log():
    rng = np.random.default_rng(0)
    truth = {1: 0.10, 2: 0.12, 4: 0.16, 8: 0.30}
    steps = [BatchStep(b, b, t * (1 + rng.normal(0, 0.01))) for b, t in truth.items() for _ in range(9)]
    steps += [BatchStep(2, 40, 5.0), BatchStep(1, 16, 3.0)]  # prefills: not decode steps, ignored
    curve = batch_slowdown(steps, "s0")
    assert len(curve) == 8 and curve[0] == 1.0
    assert curve[1] == pytest.approx(1.2, rel=0.03) and curve[7] == pytest.approx(3.0, rel=0.03)
    assert curve[2] == pytest.approx((curve[1] + curve[3]) / 2)  # b = 3 unseen: interpolated
    assert all(a <= b for a, b in zip(curve, curve[1:]))
    noisy = batch_slowdown([BatchStep(1, 1, 0.1), BatchStep(2, 2, 0.13), BatchStep(3, 3, 0.12)], "s0")
    assert noisy == (1.0, 1.3, 1.3)  # a faster step for more sessions is noise: the curve never falls
    with pytest.raises(SpecError, match="s0.*one session alone"):
        batch_slowdown([BatchStep(2, 2, 0.1)], "s0")


def test_linear_sigma_recovers_the_line_and_stays_in_zero_one():
    assert linear_serial_fraction([1.0 + 0.3 * b for b in range(8)]) == pytest.approx(0.3)
    assert linear_serial_fraction([1.0]) == 0.0
    assert linear_serial_fraction([1.0, 3.0]) == 1.0


def test_the_step_log_round_trips_and_a_bad_line_is_named(tmp_path):
    from petals_chain.server.batching import StepLog

    path = tmp_path / "steps.csv"
    log = StepLog(str(path))
    log.write(3, 3, 0.25)
    log.write(1, 40, 1.5)
    assert read_step_log(path) == [BatchStep(3, 3, 0.25), BatchStep(1, 40, 1.5)]
    StepLog(str(path)).write(2, 2, 0.2)  # a restarted server appends, without a second header
    assert len(read_step_log(path)) == 3
    path.write_text(path.read_text() + "2,2\n")
    with pytest.raises(SpecError, match=r"steps\.csv:5: expected 'sessions,tokens,seconds\[,bare_seconds\]'"):
        read_step_log(path)


def test_cluster_files_carry_the_curve_and_refuse_a_bad_one():
    from petals_chain.compose.cluster_file import parse_cluster

    doc = {"model": {"blocks": 30, "block_size": "14.16 MB", "cache_size": "1.17 MB"}, "load": {"arrival_rate": 0.2},
           "servers": [{"name": "s0", "memory": "1.3 GB", "tau_c": "2 s", "tau_p": "0.1 s",
                        "batch_slowdown": [1, 1.2, 1.5]}]}
    (s0,) = parse_cluster(doc, "c.yaml").servers
    assert s0.batch_slowdown == (1.0, 1.2, 1.5) and s0.step_factor(6) == pytest.approx(3.0)
    doc["servers"][0]["batch_slowdown"] = [1, 0.8]
    with pytest.raises(SpecError, match="batch_slowdown"):
        parse_cluster(doc, "c.yaml")


def test_the_bounds_see_each_slot_of_a_batching_chain_at_its_own_rate():
    from petals_chain.analysis.bounds import theorem37_bounds
    from petals_chain.compose.serial import bound_rates

    batching = ServerSpec("a", 1.3e9, 2.0, 0.1, batch_slowdown=(1.0, 1.1, 1.25, 1.4, 1.55, 1.7, 1.85, 2.0))
    chain = Chain((0,), (30,), 6, 5.0)
    (capped,) = cap_chains((chain,), [batching])
    rates, caps = bound_rates([capped])
    assert capped.load_rates[-1] == pytest.approx(capped.capacity / capped.service_time_s)
    assert capped.rate_with(1) == pytest.approx(1 / 5.0)
    assert caps == [1] * capped.capacity
    assert rates[0] == pytest.approx(1 / 5.0)  # one session alone: the paper's μ
    assert sum(rates) == pytest.approx(capped.capacity / capped.service_time_s)  # all slots: the MVA rate
    assert all(a >= b for a, b in zip(rates, rates[1:]))  # each more session adds less
    per_slot = theorem37_bounds(rates, caps, 0.3)
    flat = theorem37_bounds([capped.rate_per_s], [capped.capacity], 0.3)
    assert per_slot.lower_s < flat.lower_s  # a job alone on the chain is faster than at full batch
    plain = ServerSpec("p", 1.3e9, 2.0, 0.1)
    assert cap_chains((chain,), [plain]) == (chain,) and bound_rates([chain]) == ([0.2], [6])
    assert chain.rate_with(3) == pytest.approx(0.6)


def test_the_profile_plots_the_measured_curve(tmp_path):
    from petals_chain.launch.profile_fit import ServerFit
    from petals_chain.launch.profile_results import plot_batch_curves

    steps = {"s0": [BatchStep(b, b, 0.1 * (1 + 0.2 * (b - 1))) for b in (1, 1, 2, 4, 4)] + [BatchStep(1, 30, 2.0)]}
    fits = {"s0": ServerFit("s0", 0.01, 0.0, 0.0, 1e-4, 1e-3, batch_slowdown=batch_slowdown(steps["s0"], "s0"))}
    path = plot_batch_curves(tmp_path / "b.png", steps, fits, "t")
    assert path.stat().st_size > 10_000 and fits["s0"].batch_slowdown == (1.0, 1.2, 1.4, 1.6)
