"""The Ray backend against a head started on its own with `ray start --head`, as on a cluster, rather than a Ray
that the test's process starts (tests/sim/test_montecarlo_ray.py): the head runs with token authentication and
without the data folder in its environment, and the driver is a separate process. Its replications must see the
driver's data folder (``--data-dir``), and a driver that does not send the token must get one line saying how."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from petals_chain.data import DATA_ENV

ROOT = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
HEAD_START_LIMIT_S = 180  # a guard against a head that never comes up, not a budget: the wait ends when it answers
PORT_OPTIONS = ("--port", "--ray-client-server-port", "--node-manager-port", "--object-manager-port",
                "--dashboard-agent-grpc-port", "--dashboard-agent-listen-port", "--metrics-export-port",
                "--runtime-env-agent-port")

DRIVER = """
import json, os, sys
from petals_chain.data import set_data_dir
from petals_chain.sim.montecarlo import RayBackendError, run_replications

def where(seed, index):  # defined in __main__: Ray ships it by value
    return {"data": os.environ.get("PETALS_CHAIN_DATA"), "pid": os.getpid()}

set_data_dir(sys.argv[2])  # what --data-dir does
try:
    rows = run_replications(where, 2, 0, progress=False, ray=sys.argv[1])
except RayBackendError as exc:
    print(json.dumps({"error": str(exc)}))
else:
    print(json.dumps({"rows": rows, "driver": os.getpid()}))
"""


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports nobody listens on now."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """This process's environment without any Ray or data setting, with ``home`` as HOME (where Ray keeps its
    token) and ``extra`` on top."""
    env = {k: v for k, v in os.environ.items()
           if k != DATA_ENV and not k.startswith("RAY_")}
    return {**env, "HOME": str(home), **extra}


@pytest.fixture(scope="module")
def head() -> Iterator[tuple[str, Path]]:
    """A Ray head of one CPU in a process group of its own, token authentication on, no data folder in its
    environment; (its address, the HOME that holds its token). Stopped by its process group after the tests."""
    home = Path(tempfile.mkdtemp(prefix="rayhome"))
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths live under it
    env = clean_env(home, RAY_AUTH_MODE="token")
    subprocess.run([RAY, "get-auth-token", "--generate"], env=env, check=True, capture_output=True, timeout=120)
    ports = free_ports(len(PORT_OPTIONS))
    options = [x for opt, port in zip(PORT_OPTIONS, ports) for x in (opt, str(port))]
    log = (temp / "head.log").open("w")
    proc = subprocess.Popen([RAY, "start", "--head", "--block", "--num-cpus", "1", "--include-dashboard=false",
                             "--object-store-memory", str(100 * 2**20), "--temp-dir", str(temp), *options],
                            env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    address = f"127.0.0.1:{ports[0]}"
    try:
        deadline = time.monotonic() + HEAD_START_LIMIT_S
        while True:  # until the head's GCS accepts connections
            assert proc.poll() is None, (temp / "head.log").read_text()[-3000:]
            try:
                socket.create_connection(("127.0.0.1", ports[0]), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the Ray head did not open its port"
                time.sleep(0.2)
        yield address, home
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:  # Ray's own shutdown first; it can spend half a minute trying to drain the node, so not for long
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # its workers end when their raylet does
            proc.wait()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


def drive(address: str, home: Path, data: Path, **env: str) -> dict:
    """Run the driver in a fresh process against ``address``; its one JSON line."""
    out = subprocess.run([sys.executable, "-c", DRIVER, address, str(data)], cwd=ROOT, capture_output=True,
                         text=True, env=clean_env(home, **env), timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_workers_of_a_head_started_apart_see_the_drivers_data_folder(head, tmp_path: Path) -> None:
    address, home = head
    data = tmp_path / "data"
    data.mkdir()
    got = drive(address, home, data, RAY_AUTH_MODE="token")
    assert "error" not in got, got
    assert [r["data"] for r in got["rows"]] == [str(data), str(data)]  # the head's own environment has none
    assert all(r["pid"] != got["driver"] for r in got["rows"])  # computed in the cluster's workers


def test_a_driver_without_the_token_mode_is_told_how_to_join(head, tmp_path: Path) -> None:
    address, home = head
    got = drive(address, home, tmp_path)
    assert got["error"].startswith(f"--ray {address}: cannot join the Ray cluster: ")
    assert "\n" not in got["error"] and "RAY_AUTH_MODE=token" in got["error"]
