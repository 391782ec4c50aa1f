"""The processes of one method on a launched testbed: servers in their namespaces, helpers in the root one.

:class:`TestbedSwarm` spawns and stops them (whole process groups, tagged so the launch's teardown
finds strays) and waits for their readiness lines; :func:`wait_petals_servers` and
:func:`wait_orchestrated` wait until the servers of a method serve what they should.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from petals_chain.launch import state
from petals_chain.launch.launcher import Launch
from petals_chain.launch.live_setup import ModelSetup
from petals_chain.launch.testbed_format import REPO_ROOT
from petals_chain.model import SpecError

READY_LINE = re.compile(r"orchestrator listening on (http://\S+)")
DHT_LINE = re.compile(r"^ready (.+)$", re.M)


class MethodError(RuntimeError):
    """A method could not be started on the testbed (a process died or never became ready); quotes its log."""


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of our helper processes: offline hub, our package importable, quiet warnings, unbuffered."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update({"HF_HUB_OFFLINE": "1", "PYTHONWARNINGS": "ignore", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"})
    env.update(extra or {})
    return env


class TestbedSwarm:
    """Starts and stops the processes of one method on a launched testbed (servers in namespaces, the rest in root)."""

    __test__ = False

    def __init__(self, launch: Launch, setup: ModelSetup, log_dir: Path, *, python: str = sys.executable,
                 max_batch_sessions: int | None = None) -> None:
        self.launch = launch
        self.max_batch_sessions = max_batch_sessions  # orchestrated servers' --max-batch-sessions (None: default)
        self.setup = setup
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.python = python
        self.procs: dict[str, subprocess.Popen] = {}
        self.device_log_dir: Path | None = None  # emulated devices: each server's step log goes here

    @property
    def host(self) -> str:
        """The root-namespace address every server namespace reaches (gateway of the first server)."""
        return self.launch.endpoint(0).gateway

    def log_path(self, label: str) -> Path:
        """Where process ``label`` writes its output."""
        return self.log_dir / f"{label}.log"

    def log_tail(self, label: str, lines: int = 15) -> str:
        """The last lines of a process's log."""
        try:
            return "\n".join(self.log_path(label).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def spawn_root(self, label: str, argv: Sequence[str]) -> subprocess.Popen:
        """Start ``argv`` in the root namespace in its own session, tagged so the launch's teardown finds it."""
        env = _env({state.TAG_ENV: self.launch.tag})
        with open(self.log_path(label), "wb") as out:
            proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)
        self.launch.record.add("pgids", proc.pid)
        self.procs[label] = proc
        return proc

    def spawn_server(self, j: int, argv: Sequence[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start a server command in namespace ``j`` through the launcher (tagged, its speed/budget in the env, plus
        ``env``)."""
        name = self.launch.testbed.servers[j].name
        label = f"server-{name}"
        path = self.log_path(label)
        path.unlink(missing_ok=True)
        env = dict(env or {})
        if self.device_log_dir is not None:  # server/device_clock.py logs each step's real and device time there
            self.device_log_dir.mkdir(parents=True, exist_ok=True)
            env.setdefault("PETALS_CHAIN_DEVICE_LOG", str(self.device_log_dir / f"{name}.csv"))
        proc = self.launch.start_server(j, list(argv), env=_env(env), log_path=path)
        self.procs[label] = proc
        return proc

    def wait_line(self, label: str, pattern: re.Pattern, timeout_s: float) -> re.Match:
        """Wait until process ``label``'s log matches ``pattern``; MethodError with the log if it dies or times out."""
        deadline = time.monotonic() + timeout_s
        proc = self.procs[label]
        while time.monotonic() < deadline:
            m = pattern.search(self.log_path(label).read_text(errors="replace"))
            if m:
                return m
            if proc.poll() is not None:
                raise MethodError(f"{label} exited with code {proc.returncode}:\n{self.log_tail(label)}")
            time.sleep(0.2)
        raise MethodError(f"{label} not ready within {timeout_s:g} s:\n{self.log_tail(label)}")

    def check_alive(self) -> None:
        """MethodError if any process of this method has exited."""
        for label, proc in self.procs.items():
            if proc.poll() is not None:
                raise MethodError(f"{label} exited with code {proc.returncode}:\n{self.log_tail(label)}")

    def start_dht(self, timeout_s: float = 60.0) -> list[str]:
        """A DHT bootstrap node in the root namespace (:mod:`petals_chain.launch.dht_node`); returns its multiaddrs."""
        self.spawn_root("dht", [self.python, "-m", "petals_chain.launch.dht_node", "--host", self.host])
        return self.wait_line("dht", DHT_LINE, timeout_s).group(1).split()

    def endpoint_args(self, j: int) -> list[str]:
        """Where server j listens (loopback behind the relay, or its address under netem) and what it announces."""
        ep = self.launch.endpoint(j)
        return [f"/ip4/{ep.listen_host}/tcp/{ep.port}", f"/ip4/{ep.address}/tcp/{ep.port}"]

    def start_petals_server(self, j: int, initial_peers: Sequence[str], *, block_indices: tuple[int, int] | None = None,
                            num_blocks: int | None = None, attn_cache_tokens: int,
                            throughput: dict[str, Any] | float = 1.0, batched: bool = False,
                            env: dict[str, str] | None = None) -> subprocess.Popen:
        """A plain PETALS server in namespace j (fixed ``block_indices``, or ``num_blocks`` it places itself); with
        ``batched``, PETALS' server with our batching pool (launch/slowdown.py's ``batched`` entry)."""
        if (block_indices is None) == (num_blocks is None):
            raise SpecError("start_petals_server: give exactly one of block_indices or num_blocks")
        name = self.launch.testbed.servers[j].name
        listen, announce = self.endpoint_args(j)
        entry = "batched" if batched else "petals"
        argv = [self.python, "-m", "petals_chain.launch.slowdown", entry, str(self.setup.model_dir),
                "--public_name", name, "--dht_prefix", self.setup.dht_prefix, "--initial_peers", *initial_peers,
                "--host_maddrs", listen, "--announce_maddrs", announce, "--device", "cpu",
                "--torch_dtype", self.setup.dtype, "--num_handlers", "1", "--attn_cache_tokens", str(attn_cache_tokens),
                "--inference_max_length", str(self.setup.max_length), "--skip_reachability_check", "--no_auto_relay"]
        argv += (["--block_indices", f"{block_indices[0]}:{block_indices[1]}"] if block_indices is not None
                 else ["--num_blocks", str(num_blocks)])
        if isinstance(throughput, dict):  # PETALS' own throughput cache, filled with the profiler's measurement
            cache_dir = self.log_dir / f"petals-cache-{name}"
            cache_dir.mkdir(parents=True, exist_ok=True)
            (cache_dir / "throughput_v5.json").write_text(json.dumps(throughput))
            argv += ["--throughput", "auto", "--cache_dir", str(cache_dir)]
        else:
            argv += ["--throughput", repr(float(throughput))]
        return self.spawn_server(j, argv, env)

    def start_orchestrated_server(self, j: int, url: str, tau_p_s: float, job: tuple[int, int]) -> subprocess.Popen:
        """An orchestrated server (``petals_chain.server``) in namespace j with its testbed budget and fitted τp."""
        srv = self.launch.testbed.servers[j]
        listen, announce = self.endpoint_args(j)
        argv = [self.python, "-m", "petals_chain.launch.slowdown", "orchestrated", str(self.setup.model_dir),
                "--orchestrator", url, "--memory-budget", str(int(srv.memory_bytes)), "--name", srv.name,
                "--max-length", str(self.setup.max_length), "--torch-dtype", self.setup.dtype,
                "--tau-p-s", repr(float(tau_p_s)), "--job-input-tokens", str(job[0]),
                "--job-output-tokens", str(job[1]), "--host-maddrs", listen, "--announce-maddrs", announce,
                "--num-handlers", "1", "--torch-threads", "1", "--heartbeat-period-s", "2", "--settle-s", "1"]
        if self.max_batch_sessions is not None:
            argv += ["--max-batch-sessions", str(self.max_batch_sessions)]
        return self.spawn_server(j, argv)

    def stop(self, labels: Sequence[str] | None = None, grace_s: float = 5.0) -> None:
        """Stop the named processes (default: all of this method), whole process groups, and forget them."""
        chosen = [lb for lb in (labels if labels is not None else list(self.procs)) if lb in self.procs]
        procs = [self.procs.pop(lb) for lb in chosen]
        if not procs:
            return
        state.kill_groups({p.pid for p in procs}, grace_s=grace_s)
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)
            if self.launch.record is not None and p.pid in self.launch.record.pgids:
                self.launch.record.pgids.remove(p.pid)
        if self.launch.record is not None:
            self.launch.record.save()


def online_servers(dht: Any, uids: Sequence[str]) -> dict[str, tuple[str, int, int]]:
    """Servers ONLINE in the DHT for these block uids, by public name: (peer id, first block, end block)."""
    from petals.data_structures import ServerState
    from petals.utils.dht import get_remote_module_infos

    out: dict[str, tuple[str, int, int]] = {}
    for info in get_remote_module_infos(dht, list(uids), latest=True):
        if info is None:
            continue
        for peer, srv in info.servers.items():
            if srv.state == ServerState.ONLINE and srv.public_name:
                out[srv.public_name] = (peer.to_base58(), int(srv.start_block), int(srv.end_block))
    return out


def wait_petals_servers(dht: Any, uids: Sequence[str], names: Sequence[str], swarm: TestbedSwarm,
                        timeout_s: float = 300.0) -> dict[str, tuple[str, int, int]]:
    """Until every named PETALS server is ONLINE in the DHT; returns name -> (peer id, start, end)."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, tuple[str, int, int]] = {}
    while time.monotonic() < deadline:
        swarm.check_alive()
        seen = online_servers(dht, uids)
        if all(n in seen for n in names):
            return {n: seen[n] for n in names}
        time.sleep(1.0)
    missing = [n for n in names if n not in seen]
    tails = "\n".join(f"--- {n}\n{swarm.log_tail(f'server-{n}', 6)}" for n in missing)
    raise MethodError(f"PETALS servers {missing} not online within {timeout_s:g} s\n{tails}")


def wait_orchestrated(url: str, names: Sequence[str], swarm: TestbedSwarm, timeout_s: float = 300.0,
                      stable_s: float = 2.0) -> dict[str, Any]:
    """Until every named server registered and serves exactly its assignment and the chains are offered (unchanged
    for stable_s): the method's chains, as the replay will see them, are then the ones recorded."""
    from petals_chain.protocol.blocking import request_json
    from petals_chain.protocol.http_client import OrchestratorError

    deadline = time.monotonic() + timeout_s
    ok_since, last = None, None
    while time.monotonic() < deadline:
        swarm.check_alive()
        try:
            servers = request_json(url + "/servers")
            health = request_json(url + "/health")
        except (OrchestratorError, OSError, ValueError):  # an error status, unreachable, not JSON yet
            time.sleep(0.5)
            continue
        recs = {r["name"]: r for r in servers["servers"]}
        # composed, and every composed chain offered (a registration is believed once the DHT vouches for it)
        offered = health.get("chains", 0) >= max(1, health.get("chains_composed", 1))
        registered = all(n in recs and recs[n]["alive"] and recs[n]["peer_id"] for n in names)
        serving = all(r["serving"] == {"start": r["assignment"]["start"], "end": r["assignment"]["end"]}
                      for r in recs.values() if r["alive"] and r["assignment"] and r["assignment"]["num_blocks"] > 0)
        ready = bool(health["composition"]) and offered and registered and serving
        key = (servers["version"], ready)
        if ready and key == last:
            if ok_since is not None and time.monotonic() - ok_since >= stable_s:
                return {"servers": servers, "health": health, "chains": request_json(url + "/chains")}
        else:
            ok_since = time.monotonic() if ready else None
        last = key
        time.sleep(0.5)
    raise MethodError(f"orchestrated servers not ready within {timeout_s:g} s; last state {last}\n"
                      + "\n".join(f"--- {n}\n{swarm.log_tail(f'server-{n}', 6)}" for n in names))
