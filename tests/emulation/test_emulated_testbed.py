"""A testbed of emulated devices: the file's fields, the dilation of round trips, the servers' environment, the model's
units, and the workload of the emulated Table 1 (native timestamps × k, full lengths, the same cut for everyone)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from petals_chain.data.azure import Trace
from petals_chain.experiments.table1_emulated import CONFIGS, plan_native
from petals_chain.launch.launcher import Launch
from petals_chain.launch.testbed import TestbedError, load_testbed
from tests.launch.test_testbed_format import write

REPO = Path(__file__).resolve().parents[2]
TESTBED = """
model: {name: m, blocks: 32, block_size: 404766720 B, cache_size: 33554432 B}
cpu_servers:
  - {name: a, device: a100-3g.40gb}
  - {name: b, device: a100-2g.20gb}
emulation: {time_dilation: 3}
latency: {rtt: {a: 20 ms, b: 10 ms}, method: relay}
"""


def test_devices_give_memory_and_dilated_round_trips(tmp_path: Path) -> None:
    tb = load_testbed(write(tmp_path, TESTBED))
    assert tb.emulated and tb.time_dilation == 3.0
    assert [(s.device, s.memory_bytes) for s in tb.servers] == [("a100-3g.40gb", 40e9), ("a100-2g.20gb", 20e9)]
    assert [s.rtt_s for s in tb.servers] == pytest.approx([0.060, 0.030])
    again = tb.with_dilation(5)
    assert again.time_dilation == 5.0 and [s.rtt_s for s in again.servers] == pytest.approx([0.100, 0.050])
    env = Launch(again).server_env(1)
    assert env["PETALS_CHAIN_DEVICE"] == "a100-2g.20gb" and float(env["PETALS_CHAIN_TIME_DILATION"]) == 5.0


@pytest.mark.parametrize("old, new, message", [
    ("device: a100-2g.20gb}", "device: a100-2g.30gb}", "unknown device 'a100-2g.30gb'"),
    ("{name: b, device: a100-2g.20gb}", "{name: b, memory_budget: 1 GB}", "every server emulates a device or none"),
    ("{name: a, device: a100-3g.40gb}", "{name: a, device: a100-3g.40gb, speed_factor: 0.5}", "no speed_factor"),
    ("time_dilation: 3", "time_dilation: 0.5", "time_dilation"),
])
def test_bad_emulation_fields_are_one_clear_error(tmp_path: Path, old: str, new: str, message: str) -> None:
    with pytest.raises(TestbedError, match=message):
        load_testbed(write(tmp_path, TESTBED.replace(old, new)))


def test_dilation_needs_emulated_servers(tmp_path: Path) -> None:
    plain = TESTBED.replace("device: a100-3g.40gb", "memory_budget: 1 GB").replace(
        "device: a100-2g.20gb", "memory_budget: 1 GB")
    with pytest.raises(TestbedError, match="time dilation needs servers that emulate a device"):
        load_testbed(write(tmp_path, plain))
    tb = load_testbed(write(tmp_path, plain.replace("emulation: {time_dilation: 3}\n", "")))
    assert not tb.emulated
    with pytest.raises(TestbedError, match="emulate a device"):
        tb.with_dilation(2)


def test_the_shipped_testbed_is_the_papers_nine_slices() -> None:
    import yaml

    from petals_chain.launch.testbed import parse_testbed

    path = REPO / "experiments" / "testbeds" / "paper_emulated.yaml"
    raw = yaml.safe_load(path.read_text())
    raw.pop("trace")  # the trace needs the data folder; the servers do not
    tb = parse_testbed(raw, where=path.name, base=path.parent)
    kinds = [s.device for s in tb.servers]
    assert kinds.count("a100-3g.40gb") == 3 and kinds.count("a100-2g.20gb") == 6
    assert tb.model.num_blocks == 32


def test_native_plan_dilates_time_and_cuts_long_prompts_alike() -> None:
    trace = Trace(np.array([0.0, 0.5, 0.75, 2.0]), np.array([100, 3000, 2040, 10]), np.array([20, 30, 10, 5]))
    plan = plan_native(trace, 4.0, 2048)
    assert plan.arrival_s.tolist() == [0.0, 2.0, 3.0, 8.0]
    assert plan.output_tokens.tolist() == [20, 30, 10, 5]  # outputs are never cut
    assert plan.input_tokens.tolist() == [100, 2018, 2038, 10]  # prompts keep l_in + l_out <= 2048
    assert plan.trace_rate_per_s == pytest.approx(1.5) and plan.replay_rate_per_s == pytest.approx(1.5 / 4)
    assert plan_native(trace, 4.0, 2048, compose_rate=1.92).replay_rate_per_s == pytest.approx(0.48)


def test_configurations_cover_the_five_methods_and_the_papers_own_servers() -> None:
    assert {c.method for c in CONFIGS.values()} == {"petals", "bprr", "jffc_only", "paper", "proposed"}
    one_at_a_time = {c.name for c in CONFIGS.values() if c.max_batch_sessions == 1}
    assert one_at_a_time == {"paper-b1", "proposed-b1"}
    assert not CONFIGS["petals"].batching and CONFIGS["proposed"].batching and not CONFIGS["paper-b1"].batching
