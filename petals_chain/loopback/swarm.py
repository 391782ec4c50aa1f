"""Start an orchestrated PETALS swarm on loopback (orchestrator + its DHT + servers) and tear it down cleanly.

Every process is started in its own session (``setsid``), so each is the leader of a
process group holding its children (p2pd, DHT, connection handlers); teardown
sends SIGTERM to each group, waits, then SIGKILLs what is left, and checks that no
live process remains in any of the groups. ``LocalSwarm`` is a context manager, so
teardown also runs on errors and Ctrl-C.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from petals_chain import defaults
from petals_chain.model import SpecError
from petals_chain.checkpoint.sizing import BlockSizes, block_sizes
from petals_chain.protocol.blocking import request_json
from petals_chain.protocol.http_client import OrchestratorError

READY_RE = re.compile(r"orchestrator listening on (http://\S+)")


class SwarmStartError(RuntimeError):
    """A swarm process exited or did not become ready in time; the message quotes its log."""


@dataclass(frozen=True)
class ServerPlan:
    """One server to start: its name, memory budget (e.g. '300MB'), extra CLI arguments, and the round trip that
    everything reaching it sees on top of loopback (``rtt_s`` > 0: a delaying relay in front of it, the testbed's
    method on kernels without netem; clients and the other servers reach it only through the relay)."""

    name: str
    memory_budget: str
    extra_args: tuple[str, ...] = ()
    rtt_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.rtt_s >= 0:
            raise SpecError(f"server {self.name!r}: rtt_s must be >= 0, got {self.rtt_s!r}")


@dataclass
class SwarmProcess:
    """A started process: the leader of its own process group (pgid == pid)."""

    name: str
    popen: subprocess.Popen
    log_path: Path
    pgid: int = field(init=False)

    def __post_init__(self) -> None:
        self.pgid = self.popen.pid

    def log_tail(self, lines: int = 25) -> str:
        """The last lines of its log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def free_port() -> int:
    """A TCP port free on this machine right now."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return int(s.getsockname()[1])


def group_members(pgid: int) -> list[tuple[int, str]]:
    """Live (non-zombie) processes whose process group is pgid, as (pid, state), read from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # Fields after the command (which may hold spaces) start after the last ')'.
        rest = stat[stat.rfind(")") + 2:].split()
        state, pgrp = rest[0], int(rest[2])
        if pgrp == pgid and state not in ("Z", "X"):
            out.append((int(entry), state))
    return out


def write_tiny_llama(path: str | Path, *, num_blocks: int = 4, hidden: int = 128, vocab: int = 512,
                     seed: int = 0) -> Path:
    """Write a small random LLaMA checkpoint (safetensors) for tests: starts in seconds, same code paths."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    if (path / "config.json").is_file() and list(path.glob("*.safetensors")):
        return path
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_blocks,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.2,
        tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


class LocalSwarm:
    """The orchestrator (with a DHT) and PETALS servers on 127.0.0.1, each in its own process group."""

    def __init__(
        self,
        model_dir: str | Path,
        servers: list[ServerPlan],
        *,
        log_dir: str | Path,
        model_name: str = "model",
        max_length: int = 512,
        torch_dtype: str = "float32",
        arrival_rate: float = 0.5,
        target_load: float = defaults.TARGET_LOAD,
        c: int | None = None,
        lease_ttl_s: float = 30.0,
        heartbeat_timeout_s: float = 20.0,
        job_input_tokens: int = 32,
        job_output_tokens: int = 16,
        python: str = sys.executable,
        server_args: tuple[str, ...] = (),
        orchestrator_extra: tuple[str, ...] = (),
        api_token: str | None = None,
        size_from_model: bool = False,
        token: str | None = None,
        orchestrator_args: tuple[str, ...] = (),
        port: int = 0,
    ) -> None:
        names = [s.name for s in servers]
        if len(set(names)) != len(names):
            raise SpecError(f"server names must be unique, got {names}")
        self.model_dir = Path(model_dir)
        self.sizes: BlockSizes = block_sizes(self.model_dir, torch_dtype, max_length)
        self.plans = list(servers)
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.model_name = model_name
        self.torch_dtype = torch_dtype
        self.arrival_rate, self.target_load, self.c = arrival_rate, target_load, c
        self.lease_ttl_s, self.heartbeat_timeout_s = lease_ttl_s, heartbeat_timeout_s
        self.job_input_tokens, self.job_output_tokens = job_input_tokens, job_output_tokens
        self.python = python
        self.server_args = tuple(server_args)
        # more orchestrator options (credentials, timeouts, --state-dir)
        self.orchestrator_extra = tuple(orchestrator_extra) + tuple(orchestrator_args)
        self.api_token = api_token  # what get() sends (the operator's token when the orchestrator has roles)
        self.size_from_model = size_from_model  # the orchestrator sizes the model itself (--model), as users run it
        self.token = token  # the swarm's processes read it from their environment (PETALS_CHAIN_ORCH_TOKEN)
        self.port = port  # 0: a free one (a restart with the same arguments needs a fixed one)
        self.procs: list[SwarmProcess] = []
        self.url: str | None = None
        self.started_pgids: list[int] = []

    # ---- processes ------------------------------------------------------------------------------

    def _spawn(self, name: str, args: list[str]) -> SwarmProcess:
        """Start ``python args...`` in a new session (setsid), output to log_dir/name.log."""
        log_path = self.log_dir / f"{name}.log"
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
        if self.token:
            env["PETALS_CHAIN_ORCH_TOKEN"] = self.token
        with open(log_path, "wb") as log:
            popen = subprocess.Popen([self.python, *args], stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        proc = SwarmProcess(name, popen, log_path)
        self.procs.append(proc)
        self.started_pgids.append(proc.pgid)
        return proc

    def orchestrator_args(self) -> list[str]:
        """Arguments of ``python -m petals_chain.orchestrator`` for this swarm (port 0: a free one)."""
        model = (["--model", str(self.model_dir), "--torch_dtype", self.torch_dtype, "--max-length",
                  str(self.sizes.max_length)] if self.size_from_model else
                 ["--model-blocks", str(self.sizes.num_blocks), "--block-bytes", str(self.sizes.block_bytes),
                  "--cache-bytes", str(self.sizes.cache_bytes)])
        args = [
            "-m", "petals_chain.orchestrator", "--start-dht", "--port", str(self.port),
            "--model-name", self.model_name, *model,
            "--arrival-rate", str(self.arrival_rate), "--target-load", str(self.target_load),
            "--lease-ttl-s", str(self.lease_ttl_s), "--heartbeat-timeout-s", str(self.heartbeat_timeout_s),
        ]
        if self.c is not None:
            args += ["--c", str(self.c)]
        return args + list(self.orchestrator_extra)

    def server_command(self, plan: ServerPlan) -> list[str]:
        """Arguments of ``python -m petals_chain.server`` for one planned server."""
        assert self.url is not None, "start the orchestrator first"
        return [
            "-m", "petals_chain.server", str(self.model_dir), "--orchestrator", self.url,
            "--memory-budget", plan.memory_budget, "--name", plan.name,
            "--max-length", str(self.sizes.max_length), "--torch-dtype", self.torch_dtype,
            "--job-input-tokens", str(self.job_input_tokens), "--job-output-tokens", str(self.job_output_tokens),
            "--num-handlers", "1", "--heartbeat-period-s", "1", "--settle-s", "2.5",
            *self.server_args, *plan.extra_args,
        ]

    def start_orchestrator(self, timeout_s: float = 90.0) -> str:
        """Start the orchestrator and its DHT; return its URL once it prints that it listens."""
        proc = self._spawn("orchestrator", self.orchestrator_args())
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = READY_RE.search(proc.log_path.read_text(errors="replace"))
            if m:
                self.url = m.group(1)
                return self.url
            if proc.popen.poll() is not None:
                raise SwarmStartError(f"the orchestrator exited with code {proc.popen.returncode}:\n{proc.log_tail()}")
            time.sleep(0.2)
        raise SwarmStartError(f"the orchestrator did not start within {timeout_s:g} s:\n{proc.log_tail()}")

    def start_server(self, plan: ServerPlan) -> SwarmProcess:
        """Start one server process (it registers and loads its span on its own); with ``plan.rtt_s``, first its
        relay: the server listens on a loopback port and announces the relay's, which holds each direction's bytes
        for half the round trip."""
        args = self.server_command(plan)
        if plan.rtt_s > 0:
            port, relay_port = free_port(), free_port()
            self._spawn(f"relay-{plan.name}", [
                "-m", "petals_chain.launch.relay", "--listen", f"127.0.0.1:{relay_port}",
                "--target", f"127.0.0.1:{port}", "--delay-ms", f"{plan.rtt_s * 500:.3f}",
                "--owner-pid", str(os.getpid())])
            args += ["--host-maddrs", f"/ip4/127.0.0.1/tcp/{port}",
                     "--announce-maddrs", f"/ip4/127.0.0.1/tcp/{relay_port}"]
        return self._spawn(plan.name, args)

    def start(self, timeout_s: float = 300.0) -> LocalSwarm:
        """Orchestrator, then all servers at once; wait until every assigned span is served."""
        self.start_orchestrator()
        for plan in self.plans:
            self.start_server(plan)
        self.wait_ready([p.name for p in self.plans], timeout_s)
        return self

    # ---- readiness ------------------------------------------------------------------------------

    def get(self, path: str, timeout_s: float = 10.0) -> Any:
        """GET a JSON route of the orchestrator."""
        assert self.url is not None
        return request_json(self.url + path, timeout_s, token=self.api_token or self.token)

    def wait_ready(self, names: list[str], timeout_s: float = 300.0, stable_s: float = 3.0) -> dict[str, Any]:
        """Until the named servers are registered and alive, a composition exists, and every server with
        blocks serves exactly its assignment, unchanged for stable_s; returns GET /servers."""
        deadline = time.monotonic() + timeout_s
        ok_since = None
        last: Any = None
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.name in names and p.popen.poll() is not None:
                    raise SwarmStartError(f"server {p.name!r} exited with code {p.popen.returncode}:\n{p.log_tail()}")
            try:
                servers = self.get("/servers")
                health = self.get("/health")
            except (OrchestratorError, OSError, ValueError):  # an error status, unreachable, not JSON yet
                time.sleep(0.5)
                continue
            recs = {r["name"]: r for r in servers["servers"]}
            offered = health["chains"] == health["chains_composed"]  # every chain checked and offered
            ready = health["composition"] and offered and all(n in recs and recs[n]["alive"] for n in names) and all(
                r["serving"] == {"start": r["assignment"]["start"], "end": r["assignment"]["end"]}
                for r in recs.values()
                if r["alive"] and r["assignment"] and r["assignment"]["num_blocks"] > 0
            )
            state = (servers["version"], ready)
            if ready and state == last:
                if ok_since is not None and time.monotonic() - ok_since >= stable_s:
                    return servers
            else:
                ok_since = time.monotonic() if ready else None
            last = state
            time.sleep(0.5)
        tails = "\n".join(f"--- {p.name}\n{p.log_tail(8)}" for p in self.procs)
        raise SwarmStartError(f"swarm not ready within {timeout_s:g} s; last /servers: {last}\n{tails}")

    # ---- teardown -------------------------------------------------------------------------------

    def _wait_gone(self, procs: list[SwarmProcess], wait_s: float) -> list[SwarmProcess]:
        """Wait up to wait_s for the processes and their groups to end; return those still running."""
        deadline = time.monotonic() + wait_s
        left = list(procs)
        while left:
            left = [p for p in left if p.popen.poll() is None or group_members(p.pgid)]
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        return left

    @staticmethod
    def _signal(procs: list[SwarmProcess], sig: int, group: bool) -> None:
        """Send sig to each leader (group=False) or to each whole process group."""
        for p in procs:
            try:
                if group:
                    os.killpg(p.pgid, sig)
                elif p.popen.poll() is None:
                    p.popen.send_signal(sig)
            except ProcessLookupError:
                pass

    def stop_processes(self, procs: list[SwarmProcess], grace_s: float = 8.0) -> None:
        """SIGTERM the leaders (a server then leaves the orchestrator and stops its children), wait; then
        SIGTERM the whole groups, wait; then SIGKILL whatever is left."""
        left = list(procs)
        for sig, group, wait_s in ((signal.SIGTERM, False, grace_s), (signal.SIGTERM, True, 3.0),
                                   (signal.SIGKILL, True, 5.0)):
            if not left:
                return
            self._signal(left, sig, group)
            left = self._wait_gone(left, wait_s)

    def stop_process(self, proc: SwarmProcess, grace_s: float = 8.0) -> None:
        """Stop one process group (a server leaving mid-run)."""
        self.stop_processes([proc], grace_s)

    def stop(self, grace_s: float = 8.0) -> list[int]:
        """Stop every process group (all servers at once, then the orchestrator); return pgids still alive."""
        self.stop_processes([p for p in self.procs if p.name != "orchestrator"], grace_s)
        self.stop_processes([p for p in self.procs if p.name == "orchestrator"], grace_s)
        return [pg for pg in self.started_pgids if group_members(pg)]

    def __enter__(self) -> LocalSwarm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
