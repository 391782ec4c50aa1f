"""Tests for the testbed launcher: testbed files, MIG planning against recorded nvidia-smi output, delays, teardown.

The MIG tests run a stand-in ``nvidia-smi`` (tests/fixtures/nvidia_smi/bin) that prints recorded outputs
of NVIDIA's documented formats by argv. The network tests create real namespaces, veth pairs and relay
processes (root needed; skipped without it) and check that nothing is left behind, also after SIGINT
and SIGKILL of the launcher.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from petals_chain.compose.cluster_file import load_cluster
from petals_chain.launch import emulate, latency, mig, mig_profiles, mig_smi, netns, state
from petals_chain.launch.launcher import Launch, host_addresses
from petals_chain.launch.testbed import TestbedError, load_testbed, parse_testbed
from petals_chain.model import ModelSpec
from petals_chain.model_shapes import KNOWN_SHAPES, paper_testbed_sizes
from petals_chain.units import parse_duration
from petals_chain.data.ripe import draw_topology

REPO = Path(__file__).resolve().parents[2]
TESTBEDS = REPO / "experiments" / "testbeds"
FIXTURES = REPO / "tests" / "fixtures" / "nvidia_smi"
STAND_IN_BIN = FIXTURES / "bin"
PY = sys.executable


# ---------------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------------
def write_testbed(tmp_path: Path, doc: dict | str, name: str = "tb.yaml") -> Path:
    """Write a testbed document (dict → YAML, or raw text) and return its path."""
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def cpu_doc(**over: object) -> dict:
    """A valid two-server CPU testbed document; keyword arguments replace top-level sections."""
    doc = {"name": "two", "model": {"name": "tiny", "blocks": 4, "block_size": "1MB", "cache_size": "0.1MB"},
           "cpu_servers": [{"name": "a", "memory_budget": "4MB"},
                           {"name": "b", "memory_budget": "2MB", "speed_factor": 0.5}],
           "latency": {"rtt_ms": {"a": 20, "b": 60}, "method": "relay"}}
    doc.update(over)
    return {k: v for k, v in doc.items() if v is not None}


def mig_doc(profiles: list, gpu_type: str = "A100-80GB") -> dict:
    """A one-GPU MIG testbed with the given profiles."""
    return {"model": {"name": "m", "blocks": 32, "block_size": "0.405GB", "cache_size": "0.0336GB"},
            "gpus": [{"index": 0, "type": gpu_type, "profiles": profiles}], "latency": {"rtt_ms": 10}}


def logged(log: Path) -> list[list[str]]:
    """The argv of every stand-in call so far."""
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Make the stand-in nvidia-smi replay a recorded scenario: returns scenario -> (NvidiaSmi, env for PATH, log)."""
    def use(scenario: str) -> tuple[mig_smi.NvidiaSmi, dict[str, str], Path]:
        """Select the scenario; its log file records every call."""
        log = tmp_path / f"nvsmi-{scenario}.log"
        monkeypatch.setenv("NVSMI_SCENARIO", str(FIXTURES / scenario))
        monkeypatch.setenv("NVSMI_LOG", str(log))
        env = {**os.environ, "PATH": f"{STAND_IN_BIN}{os.pathsep}{os.environ['PATH']}"}
        return mig_smi.NvidiaSmi(str(STAND_IN_BIN / "nvidia-smi")), env, log
    return use


# ---------------------------------------------------------------------------------------------------------------
# testbed files
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.data
def test_paper_mig_testbed_is_three_a100_with_3g_and_two_2g_each() -> None:
    tb = load_testbed(TESTBEDS / "paper_mig.yaml")
    assert (tb.model.block_bytes, tb.model.cache_bytes) == paper_testbed_sizes()  # 2048 fp16 tokens, not 4096
    assert tb.is_mig and len(tb.servers) == 9 and len(tb.gpus) == 3
    for g in tb.gpus:
        assert g.product == "A100-80GB" and sorted(g.profiles) == ["2g.20gb", "2g.20gb", "3g.40gb"]
        # 3g.40gb takes memory slices 4-7, the two 2g.20gb take 0-1 and 2-3: all 8, no overlap
        spans = sorted((s, s + mig_profiles.PRODUCTS[g.product].profiles[p].memory_slices)
                       for p, s in zip(g.profiles, g.placements))
        assert spans == [(0, 2), (2, 4), (4, 8)]
    assert [s.memory_bytes for s in tb.servers].count(40e9) == 3
    # RIPE delays: exactly the draw sim.network makes with this seed, in file order
    topo = draw_topology(9, np.random.default_rng(tb.seed))
    assert [s.rtt_s for s in tb.servers] == pytest.approx(list(topo.server_rtt_s))
    assert tb.trace is not None and tb.trace.requests == 1000 and tb.trace.path.is_file()


@pytest.mark.data
def test_cpu_emulated_testbed_matches_the_scaling_rule() -> None:
    """Budgets, speed factors and s_c of the shipped file follow from emulate.py and the paper's testbed."""
    tb = load_testbed(TESTBEDS / "cpu_emulated.yaml")
    paper = load_cluster(REPO / "experiments" / "clusters" / "llama2_7b_testbed.yaml")
    shape = KNOWN_SHAPES["smollm2-135m"]
    block = emulate.llama_block_bytes(shape, 4)
    # the paper's s_m and s_c come from LLaMA-2-7B's config and its 2048-token cache, never a literal
    assert (paper.model.block_bytes, paper.model.cache_bytes) == paper_testbed_sizes() == (404_766_720, 33_554_432)
    assert tb.model.cache_bytes // emulate.llama_cache_bytes_per_token(shape, 4) == 764
    assert tb.model.num_blocks == shape.layers and tb.model.block_bytes == pytest.approx(block, rel=1e-6)
    assert tb.model.cache_bytes == pytest.approx(emulate.scaled_cache_bytes(paper.model, block), rel=1e-5)
    model = ModelSpec(shape.layers, block, tb.model.cache_bytes, "smol")
    want = emulate.emulated_servers(paper.model, paper.workload, model, {"a100-3g.40gb": 3, "a100-2g.20gb": 6})
    assert [s.name for s in tb.servers] == [w[0] for w in want]
    for s, (_, _, budget, speed) in zip(tb.servers, want):
        assert s.memory_bytes == pytest.approx(budget, rel=1e-5) and s.speed_factor == pytest.approx(speed, rel=1e-3)
    # same shape as the paper: model copies per server and cache/block ratio
    copies = [s.memory_bytes / (model.num_blocks * model.block_bytes) for s in tb.servers]
    assert copies[0] == pytest.approx(40e9 / (paper.model.num_blocks * paper.model.block_bytes), rel=1e-5)
    assert copies[0] / copies[-1] == pytest.approx(2.0, rel=1e-5)


@pytest.mark.data
def test_cpu_emulated_rtts_equal_the_cluster_file() -> None:
    tb = load_testbed(TESTBEDS / "cpu_emulated.yaml")
    cluster = yaml.safe_load((REPO / "experiments" / "clusters" / "llama2_7b_testbed.yaml").read_text())
    assert [s.name for s in tb.servers] == [c["name"] for c in cluster["servers"]]
    assert [s.rtt_s * 1e3 for s in tb.servers] == pytest.approx([parse_duration(c["rtt"]) * 1e3
                                                                 for c in cluster["servers"]], abs=1e-3)


def test_block_arithmetic_of_smollm2_from_its_config() -> None:
    """14.16 MB per fp32 block and 1536 B of KV cache per token per block, from the LLaMA layout."""
    shape = emulate.LlamaShape.from_config({"hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
                                            "num_key_value_heads": 3, "num_hidden_layers": 30})
    q_o, k_v, mlp, norms = 2 * 576 * 576, 2 * 576 * 192, 3 * 576 * 1536, 2 * 576
    assert emulate.llama_block_bytes(shape, 4) == 4 * (q_o + k_v + mlp + norms)
    assert emulate.llama_cache_bytes_per_token(shape, 4) == 2 * 192 * 4


@pytest.mark.parametrize("text, field", [
    ("model: {name: x, blocks: 3\nlatency: [", "tb.yaml:"),  # YAML syntax: file (and line) named
    ("- just\n- a list\n", "expected a mapping"),
])
def test_malformed_file_is_rejected_with_its_name(tmp_path: Path, text: str, field: str) -> None:
    with pytest.raises(TestbedError, match=field):
        load_testbed(write_testbed(tmp_path, text))


@pytest.mark.parametrize("change, message", [
    ({"colour": "red"}, r"tb\.yaml: colour: unknown key \(known: cpu_servers, emulation, gpus, latency, model, name, "
                        r"network, trace\)"),
    ({"model": {"name": "x", "blocks": 0, "block_size": "1MB", "cache_size": "1MB"}}, r"model\.blocks"),
    ({"model": {"name": "x", "blocks": 2, "block_size": "1 parsec", "cache_size": "1MB"}}, r"model\.block_size"),
    ({"cpu_servers": [{"name": "a"}]}, r"cpu_servers\[0\] \(a\).*give 'memory_budget' \(or an emulated 'device'"),
    ({"cpu_servers": [{"name": "a", "memory_budget": "1MB", "speed_factor": 2}]}, r"speed_factor"),
    ({"cpu_servers": [{"name": "a", "memory_budget": "1MB"}, {"name": "a", "memory_budget": "1MB"}]},
     "used twice: a"),
    ({"latency": {"rtt_ms": {"a": 20}}}, r"no RTT for server\(s\) b"),
    ({"latency": {"rtt_ms": {"a": 20, "b": 1, "c": 3}}}, r"unknown server\(s\) c"),
    ({"latency": {"rtt_ms": 5, "ripe_atlas": {"seed": 1}}},
     "latency: give exactly one of 'rtt' .*, 'rtt_ms' .* or 'ripe_atlas'"),
    ({"latency": {"rtt_ms": 5, "method": "carrier-pigeon"}}, r"latency\.method"),
    ({"gpus": [{"index": 0, "type": "A100-80GB", "profiles": ["7g.80gb"]}]}, "exactly one of 'gpus'"),
    ({"network": {"subnet": "8.8.8.0/24"}}, "not a private range"),
    ({"network": {"subnet": "10.9.0.0/30"}}, "room for 0 /30 pairs"),
])
def test_bad_fields_are_named(tmp_path: Path, change: dict, message: str) -> None:
    with pytest.raises(TestbedError, match=message):
        load_testbed(write_testbed(tmp_path, cpu_doc(**change)))


def test_missing_trace_file_is_an_error(tmp_path: Path) -> None:
    doc = cpu_doc(trace={"path": str(tmp_path / "nowhere.csv")})
    with pytest.raises(TestbedError, match=r"trace\.path: trace file not found: .*nowhere\.csv"):
        load_testbed(write_testbed(tmp_path, doc))
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(TestbedError, match="header lacks column"):
        load_testbed(write_testbed(tmp_path, cpu_doc(trace={"path": "bad.csv"})))  # relative to the testbed file


def test_unknown_mig_profile_is_named(tmp_path: Path) -> None:
    with pytest.raises(TestbedError, match=r"gpus\[0\]\.profiles\[1\]: unknown MIG profile '3g\.30gb' for A100-80GB"):
        load_testbed(write_testbed(tmp_path, mig_doc(["3g.40gb", "3g.30gb"])))
    with pytest.raises(TestbedError, match=r"gpus\[0\]\.profiles\[0\]: unknown MIG profile '3g\.40gb' for A100-40GB"):
        load_testbed(write_testbed(tmp_path, mig_doc(["3g.40gb"], "A100-40GB")))
    with pytest.raises(TestbedError, match=r"gpus\[0\]\.type: unknown GPU type 'V100'"):
        load_testbed(write_testbed(tmp_path, mig_doc(["3g.40gb"], "V100")))


@pytest.mark.parametrize("profiles, message", [
    (["3g.40gb", "3g.40gb", "3g.40gb"], r"3 × 3g\.40gb exceed the A100-80GB limit of 2"),
    (["4g.40gb", "3g.40gb", "1g.10gb"], "need 8 compute slices"),
    (["1g.20gb", "1g.20gb", "1g.20gb", "3g.40gb"], "no non-overlapping placement"),
    (["2g.20gb"] * 4, r"4 × 2g\.20gb exceed"),
])
def test_more_instances_than_a_gpu_allows(tmp_path: Path, profiles: list, message: str) -> None:
    with pytest.raises(TestbedError, match=message):
        load_testbed(write_testbed(tmp_path, mig_doc(profiles)))


def test_placement_check_agrees_with_brute_force() -> None:
    """``place`` finds a layout exactly when one exists (all multisets of up to 4 profiles of an A100-80GB)."""
    prod = mig_profiles.PRODUCTS["A100-80GB"]
    names = [n for n in prod.profiles if not n.endswith("+me")]
    for k in range(1, 5):
        for combo in itertools.combinations_with_replacement(names, k):
            profs = [prod.profiles[n] for n in combo]
            feasible = sum(p.compute_slices for p in profs) <= 7 and all(
                combo.count(n) <= prod.profiles[n].max_instances for n in set(combo)) and any(
                len({x for p, s in zip(profs, starts) for x in range(s, s + p.memory_slices)})
                == sum(p.memory_slices for p in profs) and all(s + p.memory_slices <= 8 for p, s in zip(profs, starts))
                for starts in itertools.product(*[p.starts for p in profs]))
            try:
                starts = mig_profiles.place(prod, list(combo))
            except mig_profiles.MigProfileError:
                assert not feasible, combo
                continue
            assert feasible, combo
            used = [x for p, s in zip(profs, starts) for x in range(s, s + p.memory_slices)]
            assert len(used) == len(set(used)) and all(s in p.starts for p, s in zip(profs, starts))


def test_explicit_and_uniform_rtts_and_placeholders(tmp_path: Path) -> None:
    tb = parse_testbed(cpu_doc(latency={"rtt_ms": 12.5}), base=tmp_path)
    assert [s.rtt_s for s in tb.servers] == [0.0125, 0.0125] and tb.delay_method == "auto"
    tb = parse_testbed(cpu_doc(), base=tmp_path)
    assert [s.rtt_s for s in tb.servers] == [0.02, 0.06] and [s.memory_bytes for s in tb.servers] == [4e6, 2e6]
    with pytest.raises(TestbedError, match=r"\$\{NOPE_NOT_SET\} is not set"):
        parse_testbed(cpu_doc(trace={"path": "${NOPE_NOT_SET}/x.csv"}), base=tmp_path)


def test_endpoints_netem_commands_and_expected_rtts(tmp_path: Path) -> None:
    tb = parse_testbed(cpu_doc(latency={"rtt_ms": {"a": 24.78, "b": 0}}, network={"subnet": "10.9.8.0/24"}),
                       base=tmp_path)
    eps = netns.plan_endpoints(tb, "abc", "netem")
    assert [(e.gateway, e.address, e.listen_host) for e in eps] == [
        ("10.9.8.5", "10.9.8.6", "10.9.8.6"), ("10.9.8.9", "10.9.8.10", "10.9.8.10")]
    assert latency.netem_commands(eps[0]) == [
        ["tc", "qdisc", "replace", "dev", "pcl-abc-r0", "root", "netem", "delay", "12390us"],
        ["ip", "netns", "exec", "pcl-abc-0", "tc", "qdisc", "replace", "dev", "pcl-abc-n0", "root", "netem", "delay",
         "12390us"]]
    assert latency.netem_commands(eps[1]) == []  # RTT 0: no qdisc at all
    assert latency.expected_rtt_s(eps[0]) == pytest.approx(0.02478)
    assert latency.expected_rtt_s(eps[1], eps[0]) == pytest.approx(0.02478)  # netem: both pairs on the path
    relay = netns.plan_endpoints(tb, "abc", "relay")
    assert relay[0].listen_host == netns.LOOPBACK and latency.expected_rtt_s(relay[1], relay[0]) == 0.0
    assert latency.relay_args(relay[0]) == ["--listen", "10.9.8.6:31337", "--target", "127.0.0.1:31337",
                                            "--delay-ms", "12.390000"]
    assert max(len(state.root_link("2hzb4z", 999)), len(state.ns_link("2hzb4z", 999))) <= 15  # Linux IFNAMSIZ - 1
    with pytest.raises(ValueError, match="no /30 left"):
        netns.pair_addresses(tb.subnet, 63)


# ---------------------------------------------------------------------------------------------------------------
# MIG against recorded nvidia-smi output
# ---------------------------------------------------------------------------------------------------------------
def test_recorded_outputs_parse_and_agree_with_the_profile_table() -> None:
    gpus = mig_smi.parse_query_gpu((FIXTURES / "a100x3" / "query_gpu.csv").read_text())
    assert [g.index for g in gpus] == [0, 1, 2]
    assert all(g.product is mig_profiles.PRODUCTS["A100-80GB"] and g.mig_mode == "Disabled" for g in gpus)
    t4 = mig_smi.parse_query_gpu((FIXTURES / "t4" / "query_gpu.csv").read_text())
    assert t4[0].mig_mode is None and t4[0].product is None
    rows = mig_smi.parse_lgip((FIXTURES / "a100x3" / "lgip.txt").read_text())
    assert len(rows) == 3 * 7
    table = mig_profiles.PRODUCTS["A100-80GB"].profiles
    for r in rows:  # names, IDs and instance counts in the recording = our table
        assert table[r.name].profile_id == r.profile_id and table[r.name].max_instances == r.total
    gis = mig_smi.parse_lgi((FIXTURES / "a100x3" / "lgi.txt").read_text())
    assert sorted((g.gpu, g.name, g.start, g.size) for g in gis if g.gpu == 0) == [
        (0, "2g.20gb", 0, 2), (0, "2g.20gb", 2, 2), (0, "3g.40gb", 4, 4)]
    cis = mig_smi.parse_lci((FIXTURES / "a100x3" / "lci.txt").read_text())
    assert len(cis) == 9 and {c.gi for c in cis} == {g.gi for g in gis}
    names, devices = mig_smi.parse_list((FIXTURES / "a100x3" / "L.txt").read_text())
    assert sorted(names) == [0, 1, 2] and len(devices) == 9
    assert all(d.uuid.startswith("MIG-") for d in devices)
    assert mig_smi.parse_lgi("No GPU instances found: Not Found\n") == []


@pytest.mark.data
def test_plan_against_detected_gpus(tmp_path: Path, stand_in) -> None:
    smi, _, _ = stand_in("a100x3")
    gpus, why = mig.probe_gpus(smi)
    assert why == "" and len(gpus) == 3
    plan = mig.plan_mig(load_testbed(TESTBEDS / "paper_mig.yaml"), gpus)
    assert plan.detected
    assert plan.setup_commands() == [c for i in "012" for c in (
        ["nvidia-smi", "-i", i, "-mig", "1"], ["nvidia-smi", "mig", "-i", i, "-cgi", "9:4,14:0,14:2", "-C"])]
    assert plan.teardown_commands({0: [1, 5]})[:4] == [
        ["nvidia-smi", "mig", "-i", "0", "-dci", "-gi", "1"], ["nvidia-smi", "mig", "-i", "0", "-dci", "-gi", "5"],
        ["nvidia-smi", "mig", "-i", "0", "-dgi", "-gi", "1"], ["nvidia-smi", "mig", "-i", "0", "-dgi", "-gi", "5"]]
    h100 = parse_testbed({**mig_doc(["3g.40gb"], "H100-80GB")}, base=tmp_path)
    with pytest.raises(mig_smi.MigError, match="GPU 0 is a A100-80GB .*asks for H100-80GB"):
        mig.plan_mig(h100, gpus)


@pytest.mark.data
def test_apply_reads_back_uuids_and_tears_down(stand_in) -> None:
    smi, _, log = stand_in("a100x3")
    tb = load_testbed(TESTBEDS / "paper_mig.yaml")
    plan = mig.plan_mig(tb, mig.probe_gpus(smi)[0])
    steps: list[tuple] = []
    created = {}
    for g in plan.gpus:
        created[g.index] = mig.apply_gpu(g, smi, lambda i=g.index: steps.append(("enabled", i)),
                                         lambda gis, i=g.index: steps.append(("created", i, tuple(gis))))
    assert steps == [x for i in range(3) for x in (("enabled", i), ("created", i, (1, 5, 6)))]
    changing = [c for c in logged(log) if "-mig" in c or "-cgi" in c]
    assert changing == [c[1:] for c in plan.setup_commands()]  # exactly the planned commands, in order
    uuids = mig.read_back(tb, smi)
    _, devices = mig_smi.parse_list((FIXTURES / "a100x3" / "L.txt").read_text())
    assert sorted(uuids.values()) == sorted(d.uuid for d in devices)  # every device used once
    by_uuid = {d.uuid: d for d in devices}
    for s in tb.servers:  # each server got a device of its own GPU and profile
        assert (by_uuid[uuids[s.name]].gpu, by_uuid[uuids[s.name]].profile) == (s.gpu_index, s.profile)
    problems = mig.teardown_entries([{"gpu": i, "gis": gis, "enabled_mig": True} for i, gis in created.items()], smi)
    assert problems == []
    assert mig_smi.parse_lgi(smi(["mig", "-lgi"], check=False)) == []
    assert all(g.mig_mode == "Disabled" for g in mig.probe_gpus(smi)[0])
    assert [c for c in logged(log) if c[-2:] == ["-mig", "0"]] == [["-i", i, "-mig", "0"] for i in "012"]


@pytest.mark.data
def test_gpu_with_foreign_instances_is_refused(stand_in) -> None:
    smi, _, log = stand_in("a100x3_busy")
    plan = mig.plan_mig(load_testbed(TESTBEDS / "paper_mig.yaml"), mig.probe_gpus(smi)[0])
    assert not plan.gpus[0].enable_mig  # MIG already on there
    with pytest.raises(mig_smi.MigError, match=r"GPU 0 already has MIG GPU instance\(s\) \[1, 5, 6\]"):
        mig.apply_gpu(plan.gpus[0], smi, lambda: None, lambda gis: None)
    assert not any("-cgi" in c for c in logged(log))


@pytest.mark.parametrize("scenario, reason", [
    ("t4", "not MIG-capable"),
    ("nodriver", "couldn't communicate with the NVIDIA driver"),
    (None, "nvidia-smi not found on PATH"),
])
@pytest.mark.data
def test_without_a_mig_gpu_the_plan_is_printed_and_apply_refused(tmp_path: Path, stand_in,
                                                                  scenario: str | None, reason: str) -> None:
    log = tmp_path / "none.log"
    if scenario is None:  # a PATH with the network tools but certainly no nvidia-smi
        tools = tmp_path / "bin"
        tools.mkdir()
        for tool in ("ip", "tc", "sysctl"):
            if shutil.which(tool):
                (tools / tool).symlink_to(shutil.which(tool))
        env = {**os.environ, "PATH": str(tools)}
    else:
        _, env, log = stand_in(scenario)
    env["PETALS_CHAIN_LAUNCH_STATE"] = str(tmp_path / "state")
    before = set(state.list_netns())
    proc = subprocess.run([PY, "-m", "petals_chain.launch", str(TESTBEDS / "paper_mig.yaml"), "--apply"],
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "refusing to apply" in proc.stderr
    assert "nvidia-smi mig -i 2 -cgi 9:4,14:0,14:2 -C" in proc.stdout and reason in proc.stdout
    assert not any("-cgi" in c or "-mig" in c for c in logged(log))
    assert set(state.list_netns()) == before and not list((tmp_path / "state").glob("*.json"))


def test_bad_testbed_starts_nothing(tmp_path: Path) -> None:
    path = write_testbed(tmp_path, cpu_doc(trace={"path": "missing.csv"}))
    env = {**os.environ, "PETALS_CHAIN_LAUNCH_STATE": str(tmp_path / "state")}
    before = set(state.list_netns())
    proc = subprocess.run([PY, "-m", "petals_chain.launch", str(path), "--measure"], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "trace.path: trace file not found" in proc.stderr
    assert proc.stdout == "" and set(state.list_netns()) == before and not (tmp_path / "state").exists()


# ---------------------------------------------------------------------------------------------------------------
# namespaces, delays, teardown (root)
# ---------------------------------------------------------------------------------------------------------------
def _netns_works() -> bool:
    """Whether this process may create network namespaces (root on a kernel that has them)."""
    if os.geteuid() != 0:
        return False
    name = f"pcltest{os.getpid()}"
    ok = subprocess.run(["ip", "netns", "add", name], capture_output=True).returncode == 0
    subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return ok


needs_netns = pytest.mark.skipif(not _netns_works(), reason="needs root and network namespaces")


def free_subnet() -> str:
    """A /24 in 10.231.0.0/16 that no address on this host uses (picked by PID, so parallel runs differ)."""
    used = host_addresses()
    for k in range(256):
        cand = ipaddress.IPv4Network(f"10.231.{(os.getpid() + k) % 256}.0/24")
        if not netns.host_conflicts(cand, used):
            return str(cand)
    pytest.skip("no free /24 in 10.231.0.0/16")


def leftovers(tag: str) -> dict[str, list]:
    """Namespaces, links, tagged process groups and the record still present for a launch tag."""
    return {"netns": [n for n in state.list_netns() if n.startswith(f"{state.PREFIX}-{tag}-")],
            "links": [n for n in state.list_links() if n.startswith(f"{state.PREFIX}-{tag}-")],
            "pgids": sorted(state.tagged_pgids(tag)),
            "record": [str(p) for p in state.state_dir().glob(f"{tag}.json")]}


def _alive_groups(pgids: list[int]) -> list[int]:
    """The process groups of ``pgids`` that still exist."""
    alive = []
    for g in pgids:
        try:
            os.killpg(g, 0)
            alive.append(g)
        except ProcessLookupError:
            pass
    return alive


@needs_netns
def test_netem_detection_agrees_with_the_kernel() -> None:
    """detect_netem says what an independent try (in an ``unshare -n`` namespace) finds; here: absent."""
    tag = f"t{os.getpid() % 1000}"
    probe = latency.detect_netem(state.ns_name(tag, "probe"))
    direct = subprocess.run(["unshare", "-n", "tc", "qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"],
                            capture_output=True, text=True)
    assert probe.available == (direct.returncode == 0)
    assert state.ns_name(tag, "probe") not in state.list_netns()
    if not probe.available:
        assert "netem unavailable" in probe.detail
        assert latency.choose_method("auto", probe) == "relay"
        with pytest.raises(latency.DelayMethodError, match="latency.method is 'netem'"):
            latency.choose_method("netem", probe)
    assert latency.choose_method("relay", probe) == "relay"


@needs_netns
def test_relay_delays_measured_between_namespaces_and_server_hook(tmp_path: Path) -> None:
    """20 ms and 60 ms servers: root -> each and namespace -> namespace within a few ms; then nothing is left."""
    tb = load_testbed(write_testbed(tmp_path, cpu_doc(network={"subnet": free_subnet(), "port": 31337})))
    launch = Launch(tb, log=lambda s: None)
    try:
        launch.up()
        assert launch.method == "relay"
        tag = launch.tag
        assert len(leftovers(tag)["netns"]) == 2 and len(leftovers(tag)["links"]) == 2
        results = launch.measure(count=12, pairs=[(0, 1), (1, 0)])
        by = {(r.source, r.server): r for r in results}
        assert set(by) == {("client", "a"), ("client", "b"), ("a", "b"), ("b", "a")}
        for r in results:  # relay: only the destination's relay is on the path
            assert r.expected_s == pytest.approx({"a": 0.020, "b": 0.060}[r.server])
            assert abs(r.median_s - r.expected_s) <= 0.005, latency.format_results(results, launch.method)
        # the server hook: a process in namespace b, bound where a server would bind, reached through the relay
        ep = launch.endpoint(1)
        srv = launch.start_server(1, [PY, "-m", "petals_chain.launch.echo", "serve", "--listen",
                                      f"{ep.listen_host}:{ep.port}"])
        launch._wait_ready(srv, "stand-in server")
        env = dict(x.split(b"=", 1) for x in Path(f"/proc/{srv.pid}/environ").read_bytes().split(b"\0") if b"=" in x)
        assert env[b"CUDA_VISIBLE_DEVICES"] == b"" and env[b"PETALS_CHAIN_SERVER_NAME"] == b"b"
        assert env[b"PETALS_CHAIN_MEMORY_BUDGET_BYTES"] == b"2000000" and env[b"PETALS_CHAIN_SPEED_FACTOR"] == b"0.5"
        from petals_chain.launch import echo
        rtts = echo.probe(ep.address, ep.port, count=5)
        # Scheduling delays on a loaded machine only ever add time: the fastest echo is the relay's own delay, and
        # none may come back sooner than the configured 60 ms.
        assert min(rtts) >= 0.060 - 0.0005 and abs(min(rtts) - 0.060) <= 0.003, rtts
        pgids = list(launch.record.pgids)
        assert _alive_groups(pgids)
    finally:
        problems = launch.down()
    assert problems == []
    assert leftovers(tag) == {"netns": [], "links": [], "pgids": [], "record": []}
    assert _alive_groups(pgids) == []


def _start_holding(tb_path: Path, tmp_path: Path) -> tuple[subprocess.Popen, str, list[int]]:
    """Start ``python -m petals_chain.launch TB --hold`` in its own session; wait for 'ready'; (proc, tag, pgids)."""
    proc = subprocess.Popen([PY, "-m", "petals_chain.launch", str(tb_path), "--hold"], stdout=subprocess.PIPE,
                            stderr=open(tmp_path / "launcher.err", "w"), text=True, cwd=REPO,
                            start_new_session=True)
    deadline = time.monotonic() + 60
    tag = None
    while time.monotonic() < deadline and tag is None:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        if line.startswith("ready tag="):
            tag = line.split()[1].split("=")[1]
    assert tag, (tmp_path / "launcher.err").read_text()
    record = json.loads((state.state_dir() / f"{tag}.json").read_text())
    return proc, tag, record["pgids"]


@needs_netns
def test_sigint_to_the_launcher_tears_everything_down(tmp_path: Path) -> None:
    tb_path = write_testbed(tmp_path, cpu_doc(network={"subnet": free_subnet()}))
    proc, tag, pgids = _start_holding(tb_path, tmp_path)
    try:
        assert len(leftovers(tag)["netns"]) == 2 and len(_alive_groups(pgids)) == 2  # two relays
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert leftovers(tag) == {"netns": [], "links": [], "pgids": [], "record": []}
    assert _alive_groups(pgids) == []


@needs_netns
def test_after_a_crash_relays_exit_and_teardown_cleans_up(tmp_path: Path) -> None:
    tb_path = write_testbed(tmp_path, cpu_doc(network={"subnet": free_subnet()}))
    proc, tag, pgids = _start_holding(tb_path, tmp_path)
    os.killpg(proc.pid, signal.SIGKILL)  # no handler runs: namespaces, links and the record stay behind
    proc.wait(timeout=10)
    assert len(leftovers(tag)["netns"]) == 2 and leftovers(tag)["record"]
    deadline = time.monotonic() + 10
    while _alive_groups(pgids) and time.monotonic() < deadline:  # relays notice their owner is gone
        time.sleep(0.1)
    assert _alive_groups(pgids) == []
    out = subprocess.run([PY, "-m", "petals_chain.launch", "--teardown"], capture_output=True, text=True, cwd=REPO,
                         timeout=60)
    assert out.returncode == 0 and tag in out.stdout, out.stderr
    assert leftovers(tag) == {"netns": [], "links": [], "pgids": [], "record": []}
    again = subprocess.run([PY, "-m", "petals_chain.launch", "--teardown", "--tag", tag], capture_output=True,
                           text=True, cwd=REPO, timeout=60)
    assert again.returncode == 0 and "nothing to clean" in again.stdout  # idempotent
