"""The method table is the one the simulator, the orchestrator's --method and the live testbed all read."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import yaml

from petals_chain.compose.method_table import METHODS, Method, Routing, get_method, live_method, method_names
from petals_chain.launch.live_methods import LiveMethod, plan_method
from petals_chain.launch.live_setup import FittedServer
from petals_chain.model import ModelSpec, ServerSpec, SpecError
from petals_chain.orchestrator.cli import build_orchestrator, parse_args
from petals_chain.orchestrator.leasing.leases import LeaseManager
from petals_chain.orchestrator.leasing.ws_rr import WsRrLeaseManager
from petals_chain.sim.systems import build_system, simulate_system
from petals_chain.sim.workloads import poisson_workload

REPO = Path(__file__).resolve().parents[2]
GB = 1e9
MODEL = ModelSpec(4, 1 * GB, 0.1 * GB, "tiny")
# a and b hold the whole model (so "JFFC only" is feasible), c and d only part of it.
SERVERS = [ServerSpec("a", 8 * GB, 0.2, 0.05), ServerSpec("b", 6 * GB, 0.3, 0.08), ServerSpec("c", 3 * GB, 0.1, 0.04),
           ServerSpec("d", 3 * GB, 0.1, 0.04)]


def write_cluster(path: Path) -> Path:
    """A cluster file (``compose`` format) with MODEL and SERVERS at λ = 0.5/s."""
    doc = {"model": {"name": MODEL.name, "blocks": MODEL.num_blocks, "block_gb": MODEL.block_bytes / GB,
                     "cache_gb": MODEL.cache_bytes / GB},
           "load": {"arrival_rate": 0.5, "target_load": 0.7},
           "servers": [{"name": s.name, "memory_gb": s.memory_bytes / GB, "tau_c_s": s.tau_c_s, "tau_p_s": s.tau_p_s}
                       for s in SERVERS]}
    path.write_text(yaml.safe_dump(doc))
    return path


def test_table_entries_are_consistent() -> None:
    """Names are the keys; the figures' order starts with the proposed scheme; only PETALS skips the orchestrator;
    only the oracle and the authors' capped PETALS are simulator-only; a bad entry is refused naming the field."""
    assert list(METHODS) == ["proposed", "paper", "max-chains", "jffc_only", "petals", "petals_capped", "bprr",
                             "bprr_oracle"]
    assert all(name == m.name and m.label and m.legend for name, m in METHODS.items())
    assert method_names(orchestrated=False) == ("petals", "petals_capped")
    assert method_names(live=False) == ("petals_capped", "bprr_oracle")
    assert method_names(live=True, orchestrated=True) == ("proposed", "paper", "max-chains", "jffc_only", "bprr")
    assert [m.name for m in METHODS.values() if m.tunes_c] == ["proposed", "paper", "max-chains"]
    with pytest.raises(SpecError, match="field 'estimate'"):
        Method("x", "x", "x", Routing.WS_RR, METHODS["bprr"].compose, estimate="psychic")
    with pytest.raises(SpecError, match="field 'routing'"):
        Method("x", "x", "x", "jffc", METHODS["bprr"].compose)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match=r"method: unknown method 'vllm'; choose one of proposed, paper, max-chains, "
                                               r"jffc_only"):
        get_method("vllm")


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_builds_and_runs_in_the_simulator(name: str) -> None:
    """build_system takes every method of the table: fixed chains for JFFC, a routing graph otherwise, and the
    placement is the one the method's own composer gives."""
    method = METHODS[name]
    system = build_system(name, SERVERS, MODEL, 0.5)
    assert system.placement == method.compose(SERVERS, MODEL, 0.5, 0.7).placement
    assert (system.graph is None) == (method.routing is Routing.JFFC)
    assert bool(system.chains) == (method.routing is Routing.JFFC)
    if method.routing is Routing.WS_RR:
        assert system.info["estimate"] == method.estimate and system.info["R"] >= 1
    res = simulate_system(system, poisson_workload(0.5, 200, np.random.default_rng(3)), warmup_jobs=20)
    assert res.mean_response_s > 0 and res.littles_law_gap < 1e-9


@pytest.mark.parametrize("name", list(METHODS))
def test_every_method_is_accepted_or_refused_by_the_orchestrator(name: str, tmp_path: Path) -> None:
    """--method M builds the orchestrator with M's composer and lease manager (JFFC or WS-RR, constructed by the
    Orchestrator); PETALS and simulator-only methods are refused with the reason and the choices."""
    method = METHODS[name]
    cluster = write_cluster(tmp_path / "cluster.yaml")
    args = parse_args(["--method", name, "--cluster", str(cluster), "--pin-cluster-times", "--offer-unready-chains"])
    if not (method.live and method.orchestrated):
        with pytest.raises(SpecError, match=r"--method: .*choose one of proposed, paper, max-chains, jffc_only, bprr$"):
            build_orchestrator(args)
        return
    orch, got = build_orchestrator(args)
    assert got is method
    from petals_chain.orchestrator.leasing.migration import MigratingLeaseManager  # JFFC that can move sessions

    assert type(orch.leases) is {Routing.JFFC: MigratingLeaseManager, Routing.WS_RR: WsRrLeaseManager}[method.routing]
    assert isinstance(orch.leases, LeaseManager)
    comp = orch.registry.composition
    assert comp is not None and comp.placement == method.compose(SERVERS, MODEL, 0.5, 0.7).placement
    assert len(orch.leases.snapshot().chains) == (len(comp.chains) if method.routing is Routing.JFFC else
                                                  sum(1 for m in comp.placement.num_blocks if m > 0))


def test_orchestrator_refusals_name_the_reason(tmp_path: Path) -> None:
    """PETALS routes by itself; the oracle is simulator-only; --c/--tune only for a method that tunes c;
    --block-bytes with --cluster is the exact s_m and must agree with the file's rounded figure."""
    cluster = str(write_cluster(tmp_path / "cluster.yaml"))
    with pytest.raises(SpecError, match="PETALS routes every request itself"):
        build_orchestrator(parse_args(["--method", "petals", "--cluster", cluster]))
    with pytest.raises(SpecError, match="simulator only .*exact size"):
        build_orchestrator(parse_args(["--method", "bprr_oracle", "--cluster", cluster]))
    with pytest.raises(SpecError, match="--c/--tune: method jffc_only does not tune c"):
        build_orchestrator(parse_args(["--method", "jffc_only", "--cluster", cluster, "--c", "2"]))
    orch, _ = build_orchestrator(parse_args(["--cluster", cluster, "--c", "2", "--tune", "upper"]))
    assert orch.registry.composition is not None and orch.registry.composition.c == 2
    exact = MODEL.block_bytes * (1 + 1e-8)
    orch, _ = build_orchestrator(parse_args(["--cluster", cluster, "--block-bytes", repr(exact)]))
    assert orch.registry.model.block_bytes == exact and orch.registry.model.cache_bytes == MODEL.cache_bytes
    with pytest.raises(SpecError, match="--cache-bytes 2e\\+08 contradicts"):
        build_orchestrator(parse_args(["--cluster", cluster, "--cache-bytes", "2e8"]))


def _run_cli(*argv: str) -> subprocess.CompletedProcess:
    """``python -m petals_chain.orchestrator ARGV`` to completion."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "petals_chain.orchestrator", *argv], capture_output=True, text=True,
                          env=env, timeout=60)


def test_cli_bad_method_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """An unknown name and PETALS: exit 2, one line on stderr naming the choices."""
    cluster = str(write_cluster(tmp_path / "cluster.yaml"))
    for name, why in (("magic", "unknown method 'magic'"), ("petals", "PETALS routes every request itself")):
        proc = _run_cli("--method", name, "--cluster", cluster, "--port", "0")
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert why in lines[0] and "choose one of proposed, paper, max-chains, jffc_only, bprr" in lines[0]


def test_cli_serves_bprr_by_ws_rr(tmp_path: Path) -> None:
    """The real process with --method bprr routes by WS-RR: one 'chain' per server of the placement, and a lease's
    route covers every block."""
    cluster = str(write_cluster(tmp_path / "cluster.yaml"))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "petals_chain.orchestrator", "--method", "bprr", "--cluster",
                             cluster, "--port", "0", "--offer-unready-chains"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        line = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in line and "method bprr" in line, line
        url = line.split("listening on ")[1].split()[0]
        with urllib.request.urlopen(url + "/chains", timeout=10) as r:
            chains = json.loads(r.read())["chains"]
        assert chains and all(c["chain_id"].startswith("server.") for c in chains)
        req = urllib.request.Request(url + "/lease", data=b'{"timeout_s": 5}', method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            spans = json.loads(r.read())["spans"]
        assert spans[0]["start"] == 0 and spans[-1]["end"] == MODEL.num_blocks
        assert all(a["end"] == b["start"] for a, b in zip(spans, spans[1:]))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err


def test_testbed_takes_its_methods_from_the_table() -> None:
    """plan_method: a composition for orchestrated methods, None for PETALS (it places itself), and the
    simulator-only oracle or an unknown name refused before anything starts."""
    fitted = [FittedServer(s.name, s.memory_bytes, s.tau_p_s, s.tau_c_s, 100.0, 1000.0) for s in SERVERS]
    for name in method_names(live=True, orchestrated=True):
        comp = plan_method(name, fitted, MODEL, 0.5)
        assert comp is not None and comp.placement == METHODS[name].compose(SERVERS, MODEL, 0.5).placement
    assert plan_method("petals", fitted, MODEL, 0.5) is None
    with pytest.raises(SpecError, match="simulator only"):
        plan_method("bprr_oracle", fitted, MODEL, 0.5)
    with pytest.raises(SpecError, match="unknown method 'magic'; choose one of proposed, paper, max-chains, jffc_only, "
                                               "petals, bprr"):
        LiveMethod("magic", None, fitted, arrival_rate=0.5)  # type: ignore[arg-type]
    assert live_method("petals").routing is Routing.PETALS
