"""The four serving methods of Table 1, live on a launched testbed: PETALS, BPRR, JFFC only and the proposed scheme.

All four run real PETALS servers inside the testbed's namespaces (behind its delays), each as a
slower device per its speed factor (:mod:`petals_chain.launch.slowdown`), and real clients in the
root namespace that call ``generate()``:

* ``petals``: plain PETALS servers that choose their own blocks (``--num_blocks m_j``, PETALS' own
  sizing with its attention cache for ``DEFAULT_CACHE_JOBS`` full-length sessions; no
  ``--block_indices``) and announce the per-block speeds the profiler measured (PETALS'
  throughput cache, read by ``--throughput auto``); the plain PETALS client routes every session
  itself (``min_latency`` with the 10 s alloc penalty) and retries a full server with PETALS'
  backoff. Nothing of PETALS is patched.
* ``bprr``: orchestrated servers on BPRR's CG-BP placement; the orchestrator routes every request by
  WS-RR (:mod:`petals_chain.orchestrator.ws_rr_leases`).
* ``jffc_only``: every server that holds the whole model is a one-server chain; JFFC leases.
* ``proposed``: GBP-CR + GCA with c tuned by the Theorem 3.7 lower bound; JFFC leases.

Orchestrated methods use the orchestrator of :mod:`petals_chain.orchestrator.app` with the
servers' τp/τc pinned to the profiler's fitted values (a server's own RTT to the orchestrator does
not cross the emulated delays), started by ``python -m petals_chain.launch.methods orchestrator``.
Every session of every method reserves cache for the static job length (the paper's s_c).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from petals_chain import defaults
from petals_chain.compose.capacity import blocks_array
from petals_chain.compose.petals_default import DEFAULT_CACHE_JOBS
from petals_chain.launch import state
from petals_chain.launch.launcher import Launch
from petals_chain.launch.testbed import REPO_ROOT, Testbed, TestbedError
from petals_chain.model import Composition, InfeasibleError, ModelSpec, ServerSpec, SpecError

METHODS: tuple[str, ...] = ("petals", "bprr", "jffc_only", "proposed")
LABELS: dict[str, str] = {"petals": "PETALS", "bprr": "BPRR", "jffc_only": "JFFC only", "proposed": "proposed"}
ORCHESTRATED = ("bprr", "jffc_only", "proposed")
READY_LINE = re.compile(r"orchestrator listening on (http://\S+)")
DHT_LINE = re.compile(r"^ready (.+)$", re.M)
DEFAULT_DTYPE = "float32"
NETWORK_RPS = 1e9  # PETALS' measured network throughput; the emulated links have no bandwidth limit

log = logging.getLogger("petals_chain.methods")


class MethodError(RuntimeError):
    """A method could not be started on the testbed (a process died or never became ready); quotes its log."""


# ---- the model as every process must see it -----------------------------------------------------------------


@dataclass(frozen=True)
class ModelSetup:
    """The checkpoint, its dtype, the static job length its cache slots are sized for, and the exact sizes."""

    model_dir: Path
    name: str
    dtype: str
    max_length: int
    block_bytes: int
    cache_bytes: int
    num_blocks: int
    hidden_size: int

    @property
    def spec(self) -> ModelSpec:
        """The ModelSpec the orchestrator and the composers use (exactly the servers' s_m and s_c)."""
        return ModelSpec(self.num_blocks, float(self.block_bytes), float(self.cache_bytes), self.name)

    @property
    def dht_prefix(self) -> str:
        """PETALS DHT prefix of the model (PETALS' delimiters replaced)."""
        return self.name.replace(".", "-").replace(" ", "-")


def model_setup(testbed: Testbed, model_dir: str | Path | None = None, dtype: str = DEFAULT_DTYPE) -> ModelSetup:
    """Sizes of the testbed's checkpoint; the job length is the testbed's s_c in tokens of this checkpoint."""
    from petals_chain.checkpoint.sizing import block_sizes, check_model_dir, load_config

    path = model_dir or testbed.model_path
    if path is None:
        raise TestbedError(f"{testbed.source or testbed.name}: model.path is needed to run servers")
    directory = check_model_dir(path)
    config = load_config(directory)
    groups = getattr(config, "num_key_value_groups", 1) or 1
    per_token = 2 * config.hidden_size // groups * (4 if dtype == "float32" else 2)
    max_length = int(testbed.model.cache_bytes // per_token)
    if max_length < 2:
        raise TestbedError(f"{testbed.source or testbed.name}: model.cache_size {testbed.model.cache_bytes:g} B holds "
                           f"{max_length} tokens of this checkpoint ({per_token} B per token): too small")
    sizes = block_sizes(directory, dtype, max_length)
    if sizes.num_blocks != testbed.model.num_blocks:
        raise TestbedError(f"{testbed.source or testbed.name}: model.blocks = {testbed.model.num_blocks} but "
                           f"{directory} has {sizes.num_blocks} blocks")
    return ModelSetup(directory, testbed.model.name, dtype, max_length, sizes.block_bytes, sizes.cache_bytes,
                      sizes.num_blocks, int(config.hidden_size))


def petals_num_blocks(servers: Sequence[ServerSpec], model: ModelSpec,
                      cache_jobs: int = DEFAULT_CACHE_JOBS) -> list[int]:
    """PETALS' own server sizing on a budget: m_j = min(⌊M_j / (s_m + cache_jobs·s_c)⌋, L) (its GPU rule)."""
    return [int(m) for m in blocks_array(servers, model, cache_jobs)]


def petals_throughput_cache(model_dir: Path, dtype: str, inference_rps: float, forward_rps: float) -> dict[str, Any]:
    """PETALS' throughput cache entry (``throughput_v5.json``) for a CPU server, as its own measurement writes it."""
    key = f"model_{model_dir}_device_CPU_dtype_{dtype}"
    return {key: {"inference_rps": float(inference_rps), "forward_rps": float(forward_rps),
                  "network_rps": NETWORK_RPS}}


# ---- processes on the testbed -------------------------------------------------------------------------------


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

    def __init__(self, launch: Launch, setup: ModelSetup, log_dir: Path, *, python: str = sys.executable) -> None:
        self.launch = launch
        self.setup = setup
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.python = python
        self.procs: dict[str, subprocess.Popen] = {}

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

    def spawn_server(self, j: int, argv: Sequence[str]) -> subprocess.Popen:
        """Start a server command in namespace ``j`` through the launcher (tagged, its speed/budget in the env)."""
        name = self.launch.testbed.servers[j].name
        label = f"server-{name}"
        path = self.log_path(label)
        path.unlink(missing_ok=True)
        proc = self.launch.start_server(j, list(argv), env=_env(), log_path=path)
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
        """A DHT bootstrap node in the root namespace (``methods dht``); returns its multiaddrs."""
        self.spawn_root("dht", [self.python, "-m", "petals_chain.launch.methods", "dht", "--host", self.host])
        return self.wait_line("dht", DHT_LINE, timeout_s).group(1).split()

    def endpoint_args(self, j: int) -> list[str]:
        """Where server j listens (loopback behind the relay, or its address under netem) and what it announces."""
        ep = self.launch.endpoint(j)
        return [f"/ip4/{ep.listen_host}/tcp/{ep.port}", f"/ip4/{ep.address}/tcp/{ep.port}"]

    def start_petals_server(self, j: int, initial_peers: Sequence[str], *, block_indices: tuple[int, int] | None = None,
                            num_blocks: int | None = None, attn_cache_tokens: int,
                            throughput: dict[str, Any] | float = 1.0) -> subprocess.Popen:
        """A plain PETALS server in namespace j (fixed ``block_indices``, or ``num_blocks`` it places itself)."""
        if (block_indices is None) == (num_blocks is None):
            raise SpecError("start_petals_server: give exactly one of block_indices or num_blocks")
        name = self.launch.testbed.servers[j].name
        listen, announce = self.endpoint_args(j)
        argv = [self.python, "-m", "petals_chain.launch.slowdown", "petals", str(self.setup.model_dir),
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
        return self.spawn_server(j, argv)

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
    """Until every named server registered and serves exactly its assignment (unchanged for stable_s)."""
    from petals_chain.loopback.swarm import http_json

    deadline = time.monotonic() + timeout_s
    ok_since, last = None, None
    while time.monotonic() < deadline:
        swarm.check_alive()
        try:
            servers = http_json(url + "/servers")
            health = http_json(url + "/health")
        except (urllib.error.URLError, OSError, ValueError):
            time.sleep(0.5)
            continue
        recs = {r["name"]: r for r in servers["servers"]}
        ready = bool(health["composition"]) and all(n in recs and recs[n]["alive"] and recs[n]["peer_id"]
                                                    for n in names) and all(
            r["serving"] == [r["assignment"]["start"], r["assignment"]["end"]]
            for r in recs.values() if r["alive"] and r["assignment"] and r["assignment"]["num_blocks"] > 0)
        key = (servers["version"], ready)
        if ready and key == last:
            if ok_since is not None and time.monotonic() - ok_since >= stable_s:
                return {"servers": servers, "health": health, "chains": http_json(url + "/chains")}
        else:
            ok_since = time.monotonic() if ready else None
        last = key
        time.sleep(0.5)
    raise MethodError(f"orchestrated servers not ready within {timeout_s:g} s; last state {last}\n"
                      + "\n".join(f"--- {n}\n{swarm.log_tail(f'server-{n}', 6)}" for n in names))


# ---- clients: one real generate() per request ---------------------------------------------------------------


@dataclass
class RequestTiming:
    """What one request saw (time.monotonic() seconds): service start, end, its route, failed attempts, error."""

    start_s: float | None = None
    end_s: float | None = None
    first_step_s: float | None = None
    route: str = ""
    failed_attempts: int = 0
    tokens: int = 0
    error: str | None = None


def _petals_session_class() -> type:
    """A petals InferenceSession that only timestamps its routing attempts (behaviour unchanged)."""
    from petals.client.inference_session import InferenceSession

    class RecordingInferenceSession(InferenceSession):
        """petals' InferenceSession, recording when each (re)routing happened and when the first step ended."""

        def __init__(self, sequence_manager: Any, max_length: int) -> None:
            super().__init__(sequence_manager, max_length)
            self.route_times: list[float] = []
            self.first_step_s: float | None = None
            self.spans: list[Any] = []

        def _update_sequence(self, server_idx: int, block_idx: int, attempt_no: int) -> int:
            """Timestamp, then petals' own re-routing."""
            self.route_times.append(time.monotonic())
            out = super()._update_sequence(server_idx, block_idx, attempt_no)
            self.spans = [s.span for s in self._server_sessions]
            return out

        def step(self, *args: Any, **kwargs: Any) -> Any:
            """petals' step; the end of the first one is when the job surely holds its cache everywhere."""
            out = super().step(*args, **kwargs)
            if self.first_step_s is None:
                self.first_step_s = time.monotonic()
            return out

    return RecordingInferenceSession


class PetalsClient:
    """The plain PETALS client (its own routing and retries) for all requests of a replay."""

    def __init__(self, setup: ModelSetup, initial_peers: Sequence[str]) -> None:
        import petals

        self.setup = setup
        self.model = petals.AutoDistributedModelForCausalLM.from_pretrained(
            str(setup.model_dir), initial_peers=list(initial_peers), dht_prefix=setup.dht_prefix, show_route=False)
        self._session_cls = _petals_session_class()
        self.names: dict[str, str] = {}

    def serve(self, prompt: Any, new_tokens: int) -> RequestTiming:
        """One request: a session reserving the static job length, greedy generation of exactly new_tokens."""
        out = RequestTiming()
        sess = self._session_cls(self.model.transformer.h.sequence_manager, max_length=self.setup.max_length)
        try:
            with sess:
                ids = self.model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                          do_sample=False, session=sess)
                out.tokens = int(ids.shape[1] - prompt.shape[1])
        except Exception as exc:  # recorded per request; the replay goes on
            out.error = f"{type(exc).__name__}: {exc}"
        out.end_s = time.monotonic()
        out.first_step_s = sess.first_step_s
        if sess.first_step_s is not None:
            before = [t for t in sess.route_times if t <= sess.first_step_s]
            out.start_s = before[-1] if before else sess.first_step_s
            out.failed_attempts = max(0, len(before) - 1)
        out.route = " -> ".join(f"{self.names.get(s.peer_id.to_base58(), str(s.peer_id)[-6:])}[{s.start}:{s.end}]"
                                for s in sess.spans)
        return out

    def close(self) -> None:
        """Stop the client's routing thread and its DHT node."""
        manager = self.model.transformer.h.sequence_manager
        with contextlib.suppress(Exception):
            manager.shutdown()
        with contextlib.suppress(Exception):
            manager.dht.shutdown()


class LeasingClient:
    """The orchestrated client: every session leases a chain (JFFC or WS-RR) before it starts."""

    def __init__(self, setup: ModelSetup, url: str, lease_timeout_s: float = 3600.0) -> None:
        from petals_chain.client.session import AutoDistributedModelForCausalLM

        self.setup = setup
        self.model = AutoDistributedModelForCausalLM.from_pretrained(
            str(setup.model_dir), orchestrator=url, lease_timeout_s=lease_timeout_s, lease_ttl_s=defaults.LEASE_TTL_S,
            show_route=False)

    def serve(self, prompt: Any, new_tokens: int) -> RequestTiming:
        """One request: lease (waits in the orchestrator's queue), generate exactly new_tokens, release."""
        out = RequestTiming()
        sess = None
        try:
            sess = self.model.transformer.h.open_session(max_length=self.setup.max_length)
            out.start_s = time.monotonic()
            out.route = sess.record.route() if sess.record is not None else ""
            ids = self.model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                                      session=sess)
            out.tokens = int(ids.shape[1] - prompt.shape[1])
        except Exception as exc:  # recorded per request; the replay goes on
            out.error = f"{type(exc).__name__}: {exc}"
        finally:
            if sess is not None:
                sess.close()
        out.end_s = time.monotonic()
        return out

    def close(self) -> None:
        """Close the orchestrator connection and the client's DHT node."""
        manager = self.model.transformer.h.sequence_manager
        with contextlib.suppress(Exception):
            self.model.orchestrator.close()
        with contextlib.suppress(Exception):
            manager.shutdown()
        with contextlib.suppress(Exception):
            manager.dht.shutdown()


# ---- one method, start to stop ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FittedServer:
    """A server's fitted figures for the replay's mean job: τp per block, τc, and per-block speeds for PETALS."""

    name: str
    memory_bytes: float
    tau_p_s: float
    tau_c_s: float
    inference_rps: float  # decode steps per second per block (1 / t_out)
    forward_rps: float  # prefill tokens per second per block (1 / t_in)

    @property
    def spec(self) -> ServerSpec:
        """The ServerSpec the composers see."""
        return ServerSpec(self.name, self.memory_bytes, self.tau_c_s, self.tau_p_s)


def write_cluster(path: Path, setup: ModelSetup, servers: Sequence[FittedServer], arrival_rate: float,
                  target_load: float, job: tuple[int, int]) -> Path:
    """A cluster file (``petals_chain compose`` format) with the fitted τ: what the orchestrator composes with."""
    import yaml

    doc = {
        "model": {"name": setup.name, "blocks": setup.num_blocks, "block_gb": setup.block_bytes / 1e9,
                  "cache_gb": setup.cache_bytes / 1e9},
        "load": {"arrival_rate": float(arrival_rate), "target_load": float(target_load)},
        "workload": {"input_tokens": int(job[0]), "output_tokens": int(job[1])},
        "servers": [{"name": s.name, "memory_gb": s.memory_bytes / 1e9, "tau_c_s": float(s.tau_c_s),
                     "tau_p_s": float(s.tau_p_s)} for s in servers],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Written by petals_chain.launch.profiler: tau_p_s / tau_c_s fitted on the live testbed\n"
                    + yaml.safe_dump(doc, sort_keys=False))
    return path


@dataclass
class MethodInfo:
    """What a started method looks like: placement (name -> [start, end)), chains and notes for the report."""

    method: str
    placement: dict[str, tuple[int, int]] = field(default_factory=dict)
    chains: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    startup_s: float = 0.0


def plan_method(method: str, servers: Sequence[FittedServer], model: ModelSpec, arrival_rate: float,
                target_load: float = defaults.TARGET_LOAD) -> Composition | None:
    """The composition an orchestrated method will use (None for PETALS); InfeasibleError if it cannot serve."""
    specs = [s.spec for s in servers]
    if method == "petals":
        return None
    return compose_for(method, specs, model, arrival_rate, target_load)


def compose_for(method: str, specs: Sequence[ServerSpec], model: ModelSpec, arrival_rate: float,
                target_load: float = defaults.TARGET_LOAD, c: int | None = None, tune: str = "lower") -> Composition:
    """The composition pipeline of an orchestrated method (the registry's compose_fn)."""
    if method == "proposed":
        from petals_chain.compose.tuning import compose

        return compose(specs, model, arrival_rate, target_load, c=c, tune=tune)
    if method == "jffc_only":
        from petals_chain.compose.whole_model import whole_model_composition

        return whole_model_composition(specs, model)
    if method == "bprr":
        from petals_chain.compose.bprr import bprr_concurrency, cg_bp

        r = bprr_concurrency(specs, model, arrival_rate)
        return Composition(tuple(specs), model, cg_bp(specs, model, r), (), c=r, meta={"R": r})
    raise SpecError(f"unknown orchestrated method {method!r}; choose one of {', '.join(ORCHESTRATED)}")


class LiveMethod:
    """One method brought up on a launched testbed: servers (+ orchestrator or DHT) and its client."""

    def __init__(self, method: str, swarm: TestbedSwarm, servers: Sequence[FittedServer], *, arrival_rate: float,
                 target_load: float = defaults.TARGET_LOAD, job: tuple[int, int] = (64, 24),
                 ready_timeout_s: float = 300.0) -> None:
        if method not in METHODS:
            raise SpecError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
        self.method = method
        self.swarm = swarm
        self.servers = list(servers)
        self.arrival_rate = arrival_rate
        self.target_load = target_load
        self.job = job
        self.ready_timeout_s = ready_timeout_s
        self.client: PetalsClient | LeasingClient | None = None
        self.info = MethodInfo(method)
        self.url: str | None = None

    def start(self) -> MethodInfo:
        """Start everything and wait until the method can serve; the client is then ``self.client``."""
        t0 = time.monotonic()
        try:
            if self.method == "petals":
                self._start_petals()
            else:
                self._start_orchestrated()
        except BaseException:
            self.stop()
            raise
        self.warm_up()
        self.info.startup_s = time.monotonic() - t0
        return self.info

    def warm_up(self) -> None:
        """One tiny request (not recorded): first-call costs and lazy imports happen before concurrent requests
        (CPython 3.11 corrupts its AST state when threads first-import modules that parse source concurrently)."""
        import torch

        timing = self.client.serve(torch.tensor([[101, 102, 103, 104]]), 2)
        if timing.error:
            raise MethodError(f"{self.method}: the warm-up request failed: {timing.error}")

    def _start_petals(self) -> None:
        """DHT + plain PETALS servers sized by PETALS' rule, then the plain client."""
        setup = self.swarm.setup
        peers = self.swarm.start_dht()
        m = petals_num_blocks([s.spec for s in self.servers], setup.spec)
        index = {s.name: j for j, s in enumerate(self.swarm.launch.testbed.servers)}
        started = []
        for s, mj in zip(self.servers, m):
            if mj < 1:
                continue
            cache = petals_throughput_cache(setup.model_dir, setup.dtype, s.inference_rps, s.forward_rps)
            self.swarm.start_petals_server(index[s.name], peers, num_blocks=mj,
                                           attn_cache_tokens=DEFAULT_CACHE_JOBS * setup.max_length, throughput=cache)
            started.append(s.name)
        if not started:
            raise InfeasibleError("PETALS: no server can hold a block with its attention cache")
        self.client = PetalsClient(setup, peers)
        uids = [f"{setup.dht_prefix}.{i}" for i in range(setup.num_blocks)]
        found = wait_petals_servers(self.client.model.transformer.h.sequence_manager.dht, uids, started, self.swarm,
                                    self.ready_timeout_s)
        self.client.names = {peer: name for name, (peer, _, _) in found.items()}
        self.info.placement = {n: (a, b) for n, (_, a, b) in found.items()}
        self.info.notes = {"attn_cache_tokens": DEFAULT_CACHE_JOBS * setup.max_length,
                           "sessions_per_server": DEFAULT_CACHE_JOBS, "num_blocks": dict(zip(started, m))}

    def _start_orchestrated(self) -> None:
        """Orchestrator (pinned fitted τ; WS-RR for BPRR) with its DHT, orchestrated servers, the leasing client."""
        setup = self.swarm.setup
        comp = compose_for(self.method, [s.spec for s in self.servers], setup.spec, self.arrival_rate,
                           self.target_load)  # fails here, before anything starts, if the method cannot serve
        cluster = write_cluster(self.swarm.log_dir / f"cluster-{self.method}.yaml", setup, self.servers,
                                self.arrival_rate, self.target_load, self.job)
        argv = [self.swarm.python, "-m", "petals_chain.launch.methods", "orchestrator", "--method", self.method,
                "--cluster", str(cluster), "--model-dir", str(setup.model_dir), "--max-length", str(setup.max_length),
                "--dtype", setup.dtype, "--model-name", setup.name, "--host", self.swarm.host, "--port", "0"]
        self.swarm.spawn_root("orchestrator", argv)
        self.url = self.swarm.wait_line("orchestrator", READY_LINE, 120.0).group(1)
        from petals_chain.loopback.swarm import http_json

        index = {s.name: j for j, s in enumerate(self.swarm.launch.testbed.servers)}
        holding = [r["name"] for r in http_json(self.url + "/servers")["servers"]
                   if r["assignment"] and r["assignment"]["num_blocks"] > 0]
        if not holding:
            raise MethodError(f"{self.method}: the orchestrator assigned no blocks:\n"
                              f"{self.swarm.log_tail('orchestrator')}")
        taus = {s.name: s.tau_p_s for s in self.servers}
        for name in holding:
            self.swarm.start_orchestrated_server(index[name], self.url, taus[name], self.job)
        state_now = wait_orchestrated(self.url, holding, self.swarm, self.ready_timeout_s)
        self.client = LeasingClient(setup, self.url)
        recs = state_now["servers"]["servers"]
        self.info.placement = {r["name"]: (r["assignment"]["start"], r["assignment"]["end"]) for r in recs
                               if r["assignment"] and r["assignment"]["num_blocks"] > 0}
        self.info.chains = state_now["chains"]["chains"]
        self.info.notes = {"c": state_now["health"].get("c"), "capacity": state_now["health"].get("capacity"),
                           "chains": len(self.info.chains), **{k: v for k, v in comp.meta.items() if k == "R"}}

    def stop(self) -> None:
        """Close the client and stop every process of this method."""
        if self.client is not None:
            self.client.close()
            self.client = None
        labels = [lb for lb in self.swarm.procs if lb.startswith("server-")]
        self.swarm.stop(labels)
        self.swarm.stop()

    def __enter__(self) -> LiveMethod:
        """``with LiveMethod(...) as m:`` starts it."""
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop everything of this method."""
        self.stop()


# ---- the orchestrator of a method (a root-namespace process) ------------------------------------------------


async def _run_orchestrator(args: argparse.Namespace) -> None:
    """Build the method's registry + orchestrator from the cluster file, start its DHT, serve until a signal."""
    from petals_chain.compose.cluster import load_cluster
    from petals_chain.orchestrator.dht import start_dht
    from petals_chain.orchestrator.app import Orchestrator, build_app, serve
    from petals_chain.orchestrator.registry import Registry
    from petals_chain.checkpoint.sizing import block_sizes

    cluster = load_cluster(args.cluster)
    model = block_sizes(args.model_dir, args.dtype, args.max_length).model_spec(args.model_name)
    if cluster.model.num_blocks != model.num_blocks:
        raise SpecError(f"{args.cluster}: {cluster.model.num_blocks} blocks, the checkpoint has {model.num_blocks}")
    method = args.method

    def compose_fn(specs: Sequence[ServerSpec], mdl: ModelSpec, rate: float, target: float, c: int | None = None,
                   tune: str = "lower") -> Composition:
        """The registry's pipeline for this method."""
        return compose_for(method, specs, mdl, rate, target, c=c, tune=tune)

    registry = Registry(model, arrival_rate=cluster.load.arrival_rate, target_load=cluster.load.target_load,
                        compose_fn=compose_fn)
    registry.add_planned(cluster.servers)
    kwargs: dict[str, Any] = {"lease_ttl_s": args.lease_ttl_s, "heartbeat_timeout_s": args.heartbeat_timeout_s}
    orch = Orchestrator(registry, pinned={s.name: s for s in cluster.servers}, offer_when_serving=True, **kwargs)
    if method == "bprr":
        from petals_chain.orchestrator.ws_rr_leases import WsRrLeaseManager

        orch.leases = WsRrLeaseManager(default_ttl_s=args.lease_ttl_s, clock=orch.clock)
    orch.recompose_now()
    if registry.composition is None:
        raise InfeasibleError(f"{method}: no composition for {args.cluster}: {registry.error}")
    dht = start_dht([], [f"/ip4/{args.host}/tcp/0"])
    orch.dht_info = {"initial_peers": dht.visible_maddrs, "dht_prefix": model.name.replace(".", "-").replace(" ", "-")}

    def ready(host: str, port: int) -> None:
        """Print the address (the driver waits for this line)."""
        h = orch.health()
        print(f"orchestrator listening on http://{host}:{port} (method {method}; {h['chains']} chains, "
              f"capacity {h['capacity']}, c={h['c']})", flush=True)

    try:
        await serve(build_app(orch), args.host, args.port, on_ready=ready)
    finally:
        dht.shutdown()


def _run_dht(host: str) -> int:
    """A DHT bootstrap node on ``host``: prints 'ready MADDRS', serves until SIGTERM/SIGINT."""
    from petals_chain.orchestrator.dht import start_dht

    dht = start_dht([], [f"/ip4/{host}/tcp/0"])
    print(f"ready {' '.join(dht.visible_maddrs)}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    dht.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``methods dht --host H`` or ``methods orchestrator --method M --cluster F ...`` (helpers of LiveMethod)."""
    p = argparse.ArgumentParser(prog="python -m petals_chain.launch.methods", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dht", help="a DHT bootstrap node")
    d.add_argument("--host", required=True)
    o = sub.add_parser("orchestrator", help="the orchestrator of an orchestrated method")
    o.add_argument("--method", required=True, choices=ORCHESTRATED)
    o.add_argument("--cluster", required=True, help="cluster file with the fitted τ (written by the profiler)")
    o.add_argument("--model-dir", required=True)
    o.add_argument("--max-length", type=int, required=True)
    o.add_argument("--dtype", default=DEFAULT_DTYPE)
    o.add_argument("--model-name", required=True)
    o.add_argument("--host", default="127.0.0.1")
    o.add_argument("--port", type=int, default=0)
    o.add_argument("--lease-ttl-s", type=float, default=defaults.LEASE_TTL_S)
    o.add_argument("--heartbeat-timeout-s", type=float, default=60.0)
    args = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.cmd == "dht":
        return _run_dht(args.host)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from petals_chain.orchestrator.cli import run_service

    return run_service(_run_orchestrator(args))


if __name__ == "__main__":
    sys.exit(main())
