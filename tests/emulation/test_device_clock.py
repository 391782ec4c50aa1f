"""The emulated device's clock (server/device_clock.py): waits out the device's time, chains steps, counts validity."""

from __future__ import annotations

import pytest

from petals_chain.device_profile import DeviceProfile
from petals_chain.server import device_clock
from petals_chain.server.device_clock import ClockSettings, DeviceClock, read_log

FLAT = DeviceProfile("flat", 1e9, host_s=0.010, batch_host_s=0.0, t_in_s=0.0, weights_s=0.0, kv_s=0.0)


class FakeTime:
    """A clock that only moves when the step computes or the clock sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s

    def work(self, s: float):
        def fn() -> str:
            self.now += s
            return "out"
        return fn


def test_a_step_lasts_its_device_time_and_counts_valid_when_compute_fits(tmp_path) -> None:
    t = FakeTime()
    clock = DeviceClock(FLAT, str(tmp_path / "steps.csv"), clock=t.clock, sleep=t.sleep)
    assert clock.run(2, [1], [5], t.work(0.004)) == "out"  # 2 blocks × 10 ms of device time, 4 ms of compute
    assert t.now == pytest.approx(100.020) and t.slept == [pytest.approx(0.016)]
    assert clock.run(3, [1], [6], t.work(0.050)) == "out"  # compute overran 30 ms of device time: no wait
    assert t.slept[1:] == [] and clock.steps == 2 and clock.valid == 1 and clock.valid_share == 0.5
    summary = read_log(tmp_path / "steps.csv")
    assert summary["steps"] == 2 and summary["valid_share"] == 0.5
    assert summary["worst_ratio"] == pytest.approx(0.050 / 0.030)


def test_back_to_back_steps_chain_on_the_device_clock() -> None:
    """A step starting right at the previous deadline (after the sleep's overshoot) starts at the deadline: the
    overshoot does not accumulate; after an idle gap the device starts fresh."""
    t = FakeTime()

    def late_sleep(s: float) -> None:  # every sleep overshoots by 1 ms
        t.sleep(s + 0.001)

    clock = DeviceClock(FLAT, clock=t.clock, sleep=late_sleep)
    for _ in range(10):
        clock.run(1, [1], [0], t.work(0.002))
    assert t.now == pytest.approx(100.0 + 10 * 0.010 + 0.001)  # one overshoot, not ten
    t.now += 1.0  # idle
    start = t.now
    clock.run(1, [1], [0], t.work(0.002))
    assert t.now == pytest.approx(start + 0.010 + 0.001)


def test_settings_from_the_environment() -> None:
    assert ClockSettings.from_env({}) is None
    s = ClockSettings.from_env({"PETALS_CHAIN_DEVICE": "a100-2g.20gb", "PETALS_CHAIN_TIME_DILATION": "3",
                                "PETALS_CHAIN_DEVICE_LOG": "/tmp/x.csv"})
    assert (s.device, s.dilation, s.log_path) == ("a100-2g.20gb", 3.0, "/tmp/x.csv")
    with pytest.raises(ValueError, match="unknown device 'v100'"):
        ClockSettings.from_env({"PETALS_CHAIN_DEVICE": "v100"})
    with pytest.raises(ValueError, match="PETALS_CHAIN_TIME_DILATION='0.5' must be >= 1"):
        ClockSettings.from_env({"PETALS_CHAIN_DEVICE": "h100", "PETALS_CHAIN_TIME_DILATION": "0.5"})


def test_step_shapes_read_from_petals_and_batched_requests() -> None:
    """PETALS' one-session step and our batched step are charged for the sessions and tokens they ran."""
    import torch
    from petals.data_structures import InferenceMetadata

    infos = tuple(InferenceMetadata(f"b{i}", 40, (), None) for i in range(3))
    assert device_clock._merged_shape(torch.zeros(1, 7, 8), infos) == (3, [7], [40])
    other = tuple(InferenceMetadata(f"b{i}", 12, (), None) for i in range(3))
    requests = [(torch.zeros(1, 1, 8), None, infos), (torch.zeros(2, 4, 8), None, other)]
    assert device_clock._batched_shape(requests) == (3, [1, 4, 4], [40, 12, 12])
