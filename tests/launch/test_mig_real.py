"""MIG detection and planning against what nvidia-smi printed on a real GPU (tests/fixtures/nvidia_smi/h100_real).

The recording is of an H100 80GB HBM3 with MIG disabled (driver 580), captured read-only by
experiments/gpu/mig_readonly.sh; the stand-in nvidia-smi replays exactly the recorded calls and refuses any
other. The hand-written MIG-enabled scenarios (a100x3*) stay in the launcher's own tests, unverified on hardware.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from petals_chain.launch import mig, mig_profiles, mig_smi
from petals_chain.launch import plan as launch_plan
from petals_chain.launch.__main__ import _mig_plan
from petals_chain.launch.testbed import load_testbed, parse_testbed

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "nvidia_smi"
REAL = FIXTURES / "h100_real"
STAND_IN = FIXTURES / "bin" / "nvidia-smi"
H100_TESTBED = REPO / "experiments" / "gpu" / "mig_h100.yaml"
H100 = mig_profiles.PRODUCTS["H100-80GB"]
CHANGING = {"-mig", "-cgi", "-cci", "-dgi", "-dci", "-r", "--gpu-reset", "-pm", "-pl", "-ac", "-lgc", "-c"}


@pytest.fixture
def real_h100(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> tuple[mig_smi.NvidiaSmi, Path]:
    """The stand-in nvidia-smi replaying the real H100 recording; its call log."""
    log = tmp_path / "nvsmi.log"
    monkeypatch.setenv("NVSMI_SCENARIO", str(REAL))
    monkeypatch.setenv("NVSMI_LOG", str(log))
    return mig_smi.NvidiaSmi(str(STAND_IN)), log


def calls(log: Path) -> list[list[str]]:
    """The argv of every stand-in call so far."""
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def h100_doc(gpu_type: str = "H100-80GB", profiles: tuple[str, ...] = ("3g.40gb", "2g.20gb", "2g.20gb")) -> dict:
    """A one-GPU MIG testbed document."""
    return {"model": {"name": "m", "blocks": 32, "block_size": "0.405GB", "cache_size": "0.0336GB"},
            "gpus": [{"index": 0, "type": gpu_type, "profiles": list(profiles)}], "latency": {"rtt_ms": 10}}


def test_recorded_h100_outputs_parse_and_agree_with_the_profile_table() -> None:
    gpus = mig_smi.parse_query_gpu((REAL / "query_gpu.csv").read_text())
    assert [(g.index, g.name, g.memory_mib, g.mig_mode) for g in gpus] == [
        (0, "NVIDIA H100 80GB HBM3", 81559.0, "Disabled")]
    assert gpus[0].product is H100
    names, devices = mig_smi.parse_list((REAL / "L.txt").read_text())
    assert names == {0: ("NVIDIA H100 80GB HBM3", gpus[0].uuid)} and devices == []
    rows = mig_smi.parse_lgip((REAL / "lgip.txt").read_text())
    assert [r.name for r in rows] == list(H100.profiles)  # all seven, in the table's order
    for r in rows:  # IDs and instance counts = the table; the real memory is at least what the name advertises
        prof = H100.profiles[r.name]
        assert (r.gpu, r.profile_id, r.free, r.total) == (0, prof.profile_id, prof.max_instances, prof.max_instances)
        assert r.memory_gib * 2**30 >= prof.memory_bytes
    places = {p.profile_id: (p.starts, p.size) for p in mig_smi.parse_lgipp((REAL / "lgipp.txt").read_text())}
    assert places == {p.profile_id: (p.starts, p.memory_slices) for p in H100.profiles.values()}
    no_mig = (REAL / "no_mig.txt").read_text()
    assert mig_smi.mig_off(no_mig) and mig_smi.parse_lgi(no_mig) == [] and mig_smi.parse_lci(no_mig) == []
    assert not mig_smi.mig_off((REAL / "lgip.txt").read_text())


def test_probe_reads_the_offered_profiles_while_mig_is_off(real_h100) -> None:
    smi, log = real_h100
    gpus, why = mig.probe_gpus(smi)
    assert why == "" and len(gpus) == 1
    g = gpus[0]
    assert g.mig_mode == "Disabled" and g.product is H100
    assert g.offered == {p.name: p.profile_id for p in H100.profiles.values()}
    assert g.placements == {p.profile_id: (p.starts, p.memory_slices) for p in H100.profiles.values()}
    assert all(not CHANGING.intersection(c) for c in calls(log))  # detection only reads


def test_plan_on_the_real_h100(real_h100) -> None:
    smi, log = real_h100
    tb = load_testbed(H100_TESTBED)
    plan, note, ok = _mig_plan(tb, smi)
    assert ok and note == "checked on this host's GPUs" and plan.detected
    assert plan.gpus[0].ids_read and plan.gpus[0].enable_mig
    assert plan.setup_commands() == [["nvidia-smi", "-i", "0", "-mig", "1"],
                                     ["nvidia-smi", "mig", "-i", "0", "-cgi", "9:4,14:0,14:2", "-C"]]
    text = launch_plan.describe(tb, mig_plan=plan, mig_note=note)
    assert "GPU 0 (H100-80GB): MIG is off: setup enables it" in text
    assert "profile IDs read from its nvidia-smi mig -lgip" in text
    assert "nvidia-smi mig -i 0 -cgi 9:4,14:0,14:2 -C" in text
    assert all(not CHANGING.intersection(c) for c in calls(log))


def test_a100_testbed_is_refused_on_the_real_h100(real_h100, tmp_path: Path) -> None:
    smi, _ = real_h100
    gpus, _ = mig.probe_gpus(smi)
    tb = parse_testbed(h100_doc("A100-80GB"), base=tmp_path)
    assert mig.check_gpus(tb, gpus) == [
        "GPU 0 is a H100-80GB (NVIDIA H100 80GB HBM3); the testbed asks for A100-80GB"]
    with pytest.raises(mig_smi.MigError, match="asks for A100-80GB"):
        mig.plan_mig(tb, gpus)
    plan, note, ok = _mig_plan(tb, smi)
    assert not ok and note.startswith("NOT applicable here: GPU 0 is a H100-80GB")


def test_disagreements_with_the_listing_are_named(real_h100, tmp_path: Path) -> None:
    smi, _ = real_h100
    g = mig.probe_gpus(smi)[0][0]
    tb = parse_testbed(h100_doc(), base=tmp_path)
    fewer = dataclasses.replace(g, offered={k: v for k, v in g.offered.items() if k != "3g.40gb"})
    assert mig.check_gpus(tb, [fewer]) == [
        "GPU 0 (NVIDIA H100 80GB HBM3) does not offer MIG profile(s) 3g.40gb (nvidia-smi mig -lgip lists "
        "1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 4g.40gb, 7g.80gb)"]
    moved = dataclasses.replace(g, placements={**g.placements, 9: ((0, 2), 4)})
    (problem,) = mig.check_gpus(tb, [moved])
    assert "places profile 3g.40gb (ID 9) at starts {0, 2} over 4 slices" in problem and "mig_profiles.py" in problem
    renumbered = dataclasses.replace(g, offered={**g.offered, "3g.40gb": 31})
    assert mig.plan_mig(tb, [renumbered]).gpus[0].create_spec() == "31:4,14:0,14:2"  # the GPU's own IDs win


def test_apply_says_mig_is_off_when_no_profile_is_listed() -> None:
    class MigOff(mig_smi.NvidiaSmi):
        """Every listing answers as a GPU whose MIG mode is not (yet) enabled."""

        def __call__(self, args: list[str], *, check: bool = True) -> str:
            return mig_smi.NO_MIG_DEVICES + "\n"

    g = mig.GpuPlan(0, "H100-80GB", ("3g.40gb",), (0,), (9,), enable_mig=False)
    with pytest.raises(mig_smi.MigError, match=r"GPU 0: nvidia-smi mig -lgip lists no MIG profiles \(No MIG-enabled "
                                           r"devices found\.\): MIG is not enabled there"):
        mig.apply_gpu(g, MigOff("/bin/false"), lambda: None, lambda gis: None)


def test_the_recording_is_read_only_and_real_errors_come_through(real_h100) -> None:
    smi, log = real_h100
    with pytest.raises(mig_smi.MigError, match="no recording of .*-mig"):
        smi(["-i", "0", "-mig", "1"])
    with pytest.raises(mig_smi.MigError, match=r'exit 2\): Field "virtualization_mode" is not a valid field to query'):
        smi(["--query-gpu=index,virtualization_mode,addressing_mode", "--format=csv"])
    assert smi(["mig", "-lgi"], check=False).strip() == mig_smi.NO_MIG_DEVICES
    assert len(calls(log)) == 3
