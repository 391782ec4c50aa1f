"""Bring a testbed up (MIG instances, one namespace per server, delays), run processes in it, tear it all down.

``Launch`` is the one object experiments use: ``up()`` creates everything (recording each
resource *before* creating it, see :mod:`petals_chain.launch.state`), ``start_server(j, argv)``
runs a server's command line inside namespace j in its own session (``CUDA_VISIBLE_DEVICES``
set to its MIG UUID, or empty for CPU stand-ins), ``measure()`` checks the achieved RTTs, and
``down()`` removes everything; it also runs on exit, on SIGINT/SIGTERM/SIGHUP, and via
``python -m petals_chain.launch --teardown`` after a crash.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from petals_chain.launch import latency, mig, mig_smi, netns, state
from petals_chain.launch.commands import run
from petals_chain.launch.testbed import Testbed
from petals_chain.launch.testbed_format import REPO_ROOT

READY_TIMEOUT_S = 20.0


class LaunchError(RuntimeError):
    """The testbed cannot be brought up here (address clash, a helper process failed, no MIG GPU, ...)."""


def host_addresses() -> list[str]:
    """IPv4 addresses (with prefix) configured in the root namespace (other launches' veth ends included)."""
    out = run(["ip", "-o", "-4", "addr", "show"], check=False).stdout
    return [parts[3] for line in out.splitlines() if len(parts := line.split()) >= 4 and parts[2] == "inet"]


def _child_env(tag: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of every process we start: the launch tag (teardown finds it by that) and our package path."""
    env = dict(os.environ)
    env[state.TAG_ENV] = tag
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.update(extra or {})
    return env


class Launch:
    """A testbed brought up on this machine; use as a context manager or call ``up()`` / ``down()``."""

    def __init__(self, testbed: Testbed, *, method: str | None = None, smi: mig_smi.NvidiaSmi | None = None,
                 python: str = sys.executable, log: Callable[[str], None] = print, keep: bool = False) -> None:
        """Nothing is created until ``detect()`` or ``up()``; ``method`` overrides the file's latency.method."""
        self.testbed = testbed
        self.requested = method or testbed.delay_method
        self.smi = smi or mig_smi.NvidiaSmi()
        self.python = python
        self.log = log
        self.keep = keep  # helpers outlive this process (no owner watchdog), for --keep
        self.record: state.Record | None = None
        self.method: str | None = None
        self.probe: latency.NetemProbe | None = None
        self.endpoints: list[netns.Endpoint] = []
        self.mig_uuids: dict[str, str] = {}
        self.processes: list[subprocess.Popen] = []
        self._old_handlers: dict[int, object] = {}
        self._down = False

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def _ensure_record(self) -> state.Record:
        """Create the state record (and install the teardown hooks) on first use."""
        if self.record is None:
            self.record = state.new_record()
            atexit.register(self.down)
            if threading.current_thread() is threading.main_thread():
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                    self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        return self.record

    def _on_signal(self, signum: int, frame: object) -> None:
        """Turn a termination signal into an exception so ``finally``/``__exit__`` run the teardown."""
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    @property
    def tag(self) -> str:
        """This launch's tag (creates the state record on first use)."""
        return self._ensure_record().tag

    def detect(self) -> str:
        """Detect netem in a throwaway namespace and choose the delay method (printed by the caller)."""
        if self.method is None:
            probe_ns = state.ns_name(self.tag, "probe")
            self.record.add("netns", probe_ns)
            self.probe = latency.detect_netem(probe_ns)
            self.method = latency.choose_method(self.requested, self.probe)
        return self.method

    def up(self, *, with_mig: bool = False) -> None:
        """Create MIG instances (if ``with_mig``), namespaces and veth pairs, and the delays."""
        rec = self._ensure_record()
        clash = netns.host_conflicts(self.testbed.subnet, host_addresses())
        if clash:
            raise LaunchError(f"network.subnet {self.testbed.subnet} overlaps addresses already on this host "
                              f"({', '.join(clash)}): another launch is using it (or crashed: python -m "
                              f"petals_chain.launch --teardown), or choose another subnet in the testbed file")
        method = self.detect()
        self.log(f"delay method: {method} ({self.probe.detail})")
        self.endpoints = netns.plan_endpoints(self.testbed, rec.tag, method)
        if with_mig:
            self._up_mig()
        for ep in self.endpoints:
            rec.add("netns", ep.netns)
            rec.add("links", ep.root_link)
            for cmd in netns.setup_commands(ep, self.testbed.subnet):
                run(cmd)
        if method == "netem":
            for ep in self.endpoints:
                for cmd in latency.netem_commands(ep):
                    run(cmd)
        else:
            procs = [self._spawn(ep, [self.python, "-m", "petals_chain.launch.relay", *latency.relay_args(ep),
                                      *self._owner_args()], f"relay-{ep.name}") for ep in self.endpoints]
            for ep, p in zip(self.endpoints, procs):
                self._wait_ready(p, f"relay of {ep.name}")

    def _up_mig(self) -> None:
        """Apply the MIG plan GPU by GPU (recording each step), then read back every server's MIG UUID."""
        gpus, why = mig.probe_gpus(self.smi)
        if not gpus:
            raise LaunchError(f"no MIG-capable GPU: {why}")
        plan = mig.plan_mig(self.testbed, gpus)
        for g in plan.gpus:
            entry = {"gpu": g.index, "gis": [], "enabled_mig": False}
            self.record.mig.append(entry)
            self.record.save()

            def enabled(entry: dict = entry) -> None:
                """Record that we turned MIG on (so teardown turns it off)."""
                entry["enabled_mig"] = True
                self.record.save()

            def created(gis: list[int], entry: dict = entry) -> None:
                """Record the GPU instances we made (so teardown destroys exactly those)."""
                entry["gis"] = list(gis)
                self.record.save()

            self.log(f"GPU {g.index}: creating {', '.join(g.profiles)}")
            mig.apply_gpu(g, self.smi, enabled, created)
        self.mig_uuids = mig.read_back(self.testbed, self.smi)

    def down(self) -> list[str]:
        """Tear everything down (idempotent); returns the problems that remain (empty: all clean)."""
        if self._down or self.record is None:
            return []
        self._down = True
        old_int = signal.getsignal(signal.SIGINT) if threading.current_thread() is threading.main_thread() else None
        if old_int is not None:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the cleanup
        try:
            problems = state.teardown_record(self.record, lambda entries: mig.teardown_entries(entries, self.smi))
        finally:
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)
            self._old_handlers.clear()
            atexit.unregister(self.down)
        for p in self.processes:
            if p.poll() is None:
                p.wait(timeout=5)
        return problems

    def detach(self) -> str:
        """Leave everything up after this process exits (``--keep``); returns the tag for ``--teardown --tag``."""
        tag = self.tag
        self._down = True
        atexit.unregister(self.down)
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self.record.owner_start = None  # no live owner: a plain --teardown may clean it
        self.record.save()
        return tag

    def __enter__(self) -> Launch:
        """Use as ``with Launch(tb) as launch: launch.up(); ...``."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Tear down, reporting what could not be removed."""
        problems = self.down()
        for p in problems:
            self.log(f"teardown: {p}")

    # ---- processes ---------------------------------------------------------------------------------------------
    def _owner_args(self) -> list[str]:
        """Helpers exit when this process is gone (a crash leaves no relay running), unless kept on purpose."""
        return [] if self.keep else ["--owner-pid", str(os.getpid())]

    def _spawn(self, ep: netns.Endpoint, argv: Sequence[str], label: str, env: dict[str, str] | None = None,
               log_path: Path | None = None) -> subprocess.Popen:
        """Start ``argv`` inside ``ep``'s namespace in a new session (its own process group), tagged and recorded."""
        log_path = log_path or state.state_dir() / f"{self.tag}-{label}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as err:
            proc = subprocess.Popen(["ip", "netns", "exec", ep.netns, *argv], stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL, env=_child_env(self.tag, env), start_new_session=True)
        self.record.add("pgids", proc.pid)
        self.processes.append(proc)
        return proc

    def _wait_ready(self, proc: subprocess.Popen, what: str, timeout_s: float = READY_TIMEOUT_S) -> str:
        """Wait for the helper's 'ready' line on stdout; LaunchError (with its log) if it dies or stays silent."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 0.1)
            if ready:
                line = proc.stdout.readline().decode(errors="replace").strip()
                if line.startswith("ready"):
                    return line
            if proc.poll() is not None:
                break
        logs = sorted(state.state_dir().glob(f"{self.tag}-*.log"))
        tail = " | ".join(p.read_text(errors="replace").strip()[-300:] for p in logs if p.stat().st_size)
        raise LaunchError(f"{what} did not start (exit {proc.poll()}): {tail or 'no output'}")

    def endpoint(self, index: int) -> netns.Endpoint:
        """Server ``index``'s namespace and addresses (after ``up()``)."""
        if not self.endpoints:
            raise LaunchError("the testbed is not up: call up() first")
        return self.endpoints[index]

    def server_env(self, index: int) -> dict[str, str]:
        """What a server process needs to know about its slot: its GPU (MIG UUID or none), budget, speed, name."""
        srv = self.testbed.servers[index]
        env = {"CUDA_VISIBLE_DEVICES": self.mig_uuids.get(srv.name, ""),
               "PETALS_CHAIN_SERVER_NAME": srv.name,
               "PETALS_CHAIN_MEMORY_BUDGET_BYTES": str(int(srv.memory_bytes)),
               "PETALS_CHAIN_SPEED_FACTOR": repr(srv.speed_factor)}
        if srv.device is not None:  # server/device_clock.py keeps this device's time, × the testbed's dilation
            env.update({"PETALS_CHAIN_DEVICE": srv.device,
                        "PETALS_CHAIN_TIME_DILATION": repr(float(self.testbed.time_dilation))})
        return env

    def start_server(self, index: int, argv: Sequence[str], *, env: dict[str, str] | None = None,
                     log_path: Path | None = None) -> subprocess.Popen:
        """The hook experiments use: run a server's command line in namespace ``index`` (see ``endpoint`` for the
        address to bind, ``listen_host``:port, and to announce, ``address``:port). Stopped by ``down()``."""
        ep = self.endpoint(index)
        return self._spawn(ep, argv, f"server-{ep.name}", {**self.server_env(index), **(env or {})}, log_path)

    # ---- measurement -------------------------------------------------------------------------------------------
    def measure(self, count: int = 20, pairs: Sequence[tuple[int, int]] = ()) -> list[latency.RttResult]:
        """Echo servers on every server's port; RTT from the root namespace to each, and between ``pairs`` (i→j)."""
        echoes = [self._spawn(ep, [self.python, "-m", "petals_chain.launch.echo", "serve", "--listen",
                                   f"{ep.listen_host}:{ep.port}", *self._owner_args()], f"echo-{ep.name}")
                  for ep in self.endpoints]
        try:
            for ep, p in zip(self.endpoints, echoes):
                self._wait_ready(p, f"echo server of {ep.name}")
            from petals_chain.launch import echo

            results = []
            for ep in self.endpoints:
                rtts = echo.probe(ep.address, ep.port, count=count)
                results.append(latency.summarize(ep.name, "client", latency.expected_rtt_s(ep), rtts))
            for i, j in pairs:
                src, dst = self.endpoints[i], self.endpoints[j]
                out = run(["ip", "netns", "exec", src.netns, self.python, "-m", "petals_chain.launch.echo", "probe",
                           "--target", f"{dst.address}:{dst.port}", "--count", str(count)],
                          check=False, env=_child_env(self.tag), timeout_s=120)
                try:
                    got = json.loads(out.stdout.strip().splitlines()[-1])
                except (ValueError, IndexError):
                    got = {"error": (out.stderr or out.stdout).strip()[-300:]}
                if "error" in got:
                    raise LaunchError(f"probe {src.name} -> {dst.name} failed: {got['error']}")
                results.append(latency.summarize(dst.name, src.name, latency.expected_rtt_s(dst, src), got["rtt_s"]))
            return results
        finally:
            state.kill_groups({p.pid for p in echoes})
            for p in echoes:
                p.wait(timeout=5)
                if p.pid in self.record.pgids:
                    self.record.pgids.remove(p.pid)
            self.record.save()
