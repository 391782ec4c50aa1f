"""A multi-region swarm on one machine: the region-aware orchestrator and PETALS servers in the root network
namespace, and one network namespace per client origin that sees every server behind the testbed's delaying relay.

docs/torta.md, "On the swarm: regions". Server j announces a virtual address ``10.231.0.(j+1)`` (on the root
namespace's loopback, so servers and the orchestrator reach it directly). Inside origin o's namespace the same
address belongs to a relay (:mod:`petals_chain.launch.relay`, the testbed's method where the kernel has no netem)
that forwards to the server through o's veth pair after the one-way delay from o to the server's region: a client
in o sees RTT = 2 · latency[o, region(j)] to every server of that region, whoever else connects to it. Needs
root; every process runs in its own process group and everything is undone by :meth:`RegionalSwarm.stop`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import numpy as np

from petals_chain.loopback.swarm import LocalSwarm, ServerPlan, SwarmProcess, free_port

VIP_NET = "10.231.0"  # servers' announced addresses
ORIGIN_NET = "10.232"  # origin k's veth pair: 10.232.k.1 (root end) ↔ 10.232.k.2 (namespace end)


def _ip(*args: str, check: bool = True) -> None:
    """Run one ``ip`` command; CalledProcessError (with its stderr) when ``check`` and it fails."""
    subprocess.run(["ip", *args], check=check, capture_output=True, text=True)


class RegionalSwarm(LocalSwarm):
    """Region-aware orchestrator + servers per region (root namespace) + one delayed namespace per origin."""

    def __init__(self, model_dir: str | Path, regions: dict[str, list[ServerPlan]], latency_s: np.ndarray,
                 origins: list[str], *, log_dir: str | Path, policy: str = "torta", slot_s: float = 2.0,
                 anchor_delay_ms: dict[str, float] | None = None, **kw: object) -> None:
        plans = [p for ps in regions.values() for p in ps]
        super().__init__(model_dir, plans, log_dir=log_dir, **kw)  # type: ignore[arg-type]
        self.region_names = list(regions)
        self.region_of = {p.name: r for r, ps in regions.items() for p in ps}
        self.latency_s = np.asarray(latency_s, dtype=float)
        unknown = [o for o in origins if o not in self.region_names]
        if unknown:
            raise ValueError(f"origins: {unknown[0]!r} is not a region ({', '.join(self.region_names)})")
        self.origins = list(origins)
        self.policy, self.slot_s = policy, slot_s
        self.tag = np.base_repr(os.getpid(), 36).lower()
        self.ports = {p.name: free_port() for p in plans}
        self.vip = {p.name: f"{VIP_NET}.{j + 1}" for j, p in enumerate(plans)}
        self.dht_port = free_port()
        self._net_made: list[tuple[str, ...]] = []  # undo commands, run in reverse order
        # per region, an anchor: a delaying relay in front of the orchestrator's /regions/NAME/health, for servers
        # placed by RTT (--region auto); the orchestrator then needs a port known before it starts
        self.anchor_delay_ms = dict(anchor_delay_ms or {})
        self.anchor_ports = {r: free_port() for r in self.anchor_delay_ms}
        if self.anchor_delay_ms and self.port == 0:
            self.port = free_port()

    # ---- network ---------------------------------------------------------------------------------

    def netns(self, origin: str) -> str:
        """The namespace of an origin's clients."""
        return f"pcr-{self.tag}-{self.origins.index(origin)}"

    def gateway(self, origin: str) -> str:
        """How an origin's namespace reaches the root namespace (the orchestrator, the DHT, the relays' target)."""
        return f"{ORIGIN_NET}.{self.origins.index(origin)}.1"

    def setup_network(self) -> None:
        """Server addresses on the root loopback; per origin a namespace, a veth pair and the same addresses
        (nothing without origins: then every client runs in the root namespace, undelayed)."""
        if not self.origins:
            return
        for name, vip in self.vip.items():
            _ip("addr", "add", f"{vip}/32", "dev", "lo")
            self._net_made.append(("addr", "del", f"{vip}/32", "dev", "lo"))
        for k, origin in enumerate(self.origins):
            ns, root_link, ns_link = self.netns(origin), f"pcr{self.tag}{k}", f"pcr{self.tag}{k}n"
            _ip("netns", "add", ns)
            self._net_made.append(("netns", "del", ns))
            _ip("link", "add", root_link, "type", "veth", "peer", "name", ns_link, "netns", ns)
            self._net_made.append(("link", "del", root_link))
            _ip("addr", "add", f"{ORIGIN_NET}.{k}.1/24", "dev", root_link)
            _ip("link", "set", root_link, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{ORIGIN_NET}.{k}.2/24", "dev", ns_link)
            _ip("-n", ns, "link", "set", ns_link, "up")
            for vip in self.vip.values():
                _ip("-n", ns, "addr", "add", f"{vip}/32", "dev", "lo")

    def start_relays(self) -> None:
        """In each origin's namespace, one delaying relay per server (one-way delay = latency[origin, region])."""
        for origin in self.origins:
            o = self.region_names.index(origin)
            for name, vip in self.vip.items():
                delay_ms = 1e3 * self.latency_s[o, self.region_names.index(self.region_of[name])]
                self._spawn_in(self.netns(origin), f"relay-{origin}-{name}", [
                    "-m", "petals_chain.launch.relay", "--listen", f"{vip}:{self.ports[name]}",
                    "--target", f"{self.gateway(origin)}:{self.ports[name]}", "--delay-ms", f"{delay_ms:.3f}",
                    "--owner-pid", str(os.getpid())])

    def _spawn_in(self, netns: str, name: str, args: list[str]) -> SwarmProcess:
        """Start ``python args`` inside ``netns`` in its own session."""
        log_path = self.log_dir / f"{name}.log"
        env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
        with open(log_path, "wb") as log:
            popen = subprocess.Popen(["ip", "netns", "exec", netns, self.python, *args], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                     env=env)
        proc = SwarmProcess(name, popen, log_path)
        self.procs.append(proc)
        self.started_pgids.append(proc.pgid)
        return proc

    def run_in(self, origin: str, name: str, args: list[str]) -> SwarmProcess:
        """Start a client process (``python args``) in an origin's namespace."""
        return self._spawn_in(self.netns(origin), name, args)

    # ---- processes -------------------------------------------------------------------------------

    def orchestrator_args(self) -> list[str]:
        """The region-aware orchestrator on every address (origins reach it at their gateway), with its DHT."""
        lat_ms = ";".join(",".join(f"{1e3 * x:g}" for x in row) for row in self.latency_s)
        args = ["-m", "petals_chain.orchestrator.regions", "--regions", ",".join(self.region_names),
                "--latency-ms", lat_ms, "--policy", self.policy, "--slot-s", str(self.slot_s),
                "--host", "0.0.0.0", "--port", str(self.port), "--start-dht", "--dht-host-maddrs",
                f"/ip4/0.0.0.0/tcp/{self.dht_port}", "--model-name", self.model_name,
                "--model-blocks", str(self.sizes.num_blocks), "--block-bytes", str(self.sizes.block_bytes),
                "--cache-bytes", str(self.sizes.cache_bytes), "--arrival-rate", str(self.arrival_rate),
                "--target-load", str(self.target_load), "--lease-ttl-s", str(self.lease_ttl_s),
                "--heartbeat-timeout-s", str(self.heartbeat_timeout_s)]
        if self.c is not None:
            args += ["--c", str(self.c)]
        if self.anchor_delay_ms:
            args += ["--anchors", ",".join(f"{r}=http://127.0.0.1:{p}/regions/{r}/health"
                                           for r, p in self.anchor_ports.items())]
        return args + list(self.orchestrator_extra)

    def start_anchors(self) -> None:
        """One delaying relay per anchored region (root namespace), forwarding to the orchestrator's port."""
        for region, delay_ms in self.anchor_delay_ms.items():
            self._spawn(f"anchor-{region}", [
                "-m", "petals_chain.launch.relay", "--listen", f"127.0.0.1:{self.anchor_ports[region]}",
                "--target", f"127.0.0.1:{self.port}", "--delay-ms", f"{delay_ms:.3f}",
                "--owner-pid", str(os.getpid())])

    def server_command(self, plan: ServerPlan) -> list[str]:
        """A server names its region to the front (``--region``, unless its plan says ``--region auto``) and
        announces its virtual address."""
        args = super().server_command(plan)
        if "--region" not in plan.extra_args:
            args += ["--region", self.region_of[plan.name]]
        if not self.origins:  # no delayed origins: plain loopback, as LocalSwarm's servers
            return args
        port = self.ports[plan.name]
        return args + ["--host-maddrs", f"/ip4/0.0.0.0/tcp/{port}",
                       "--announce-maddrs", f"/ip4/{self.vip[plan.name]}/tcp/{port}"]

    def start_orchestrator(self, timeout_s: float = 90.0) -> str:
        """As LocalSwarm's, but the URL servers use is loopback (it listens on every address)."""
        url = super().start_orchestrator(timeout_s)
        self.url = url.replace("0.0.0.0", "127.0.0.1")
        return self.url

    def origin_url(self, origin: str) -> str:
        """The orchestrator URL a client of ``origin`` uses from inside its namespace."""
        assert self.url is not None
        return f"http://{self.gateway(origin)}:{self.url.rsplit(':', 1)[1]}/origins/{origin}"

    def initial_peers(self, origin: str) -> list[str]:
        """The DHT's address as an origin's namespace reaches it."""
        peer = self.get("/health")["dht"]["initial_peers"][0].rsplit("/p2p/", 1)[1]
        return [f"/ip4/{self.gateway(origin)}/tcp/{self.dht_port}/p2p/{peer}"]

    def start(self, timeout_s: float = 300.0) -> RegionalSwarm:
        """Network, orchestrator, relays, servers; wait until every region serves its composition."""
        self.setup_network()
        self.start_anchors()
        super().start(timeout_s)
        self.start_relays()
        return self

    def stop(self, grace_s: float = 8.0) -> list[int]:
        """Every process group, then the namespaces, veth pairs and addresses."""
        left = super().stop(grace_s)
        for cmd in reversed(self._net_made):
            with contextlib.suppress(subprocess.CalledProcessError):
                _ip(*cmd)
        self._net_made.clear()
        time.sleep(0.1)
        return left
