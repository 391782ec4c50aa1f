"""The serving methods, live on a launched testbed: real PETALS servers in its namespaces, real clients in root.

Every live method of :data:`petals_chain.compose.method_table.METHODS` runs here. Servers run behind
the testbed's delays, each as a slower device per its speed factor
(:mod:`petals_chain.launch.slowdown`); clients in the root namespace call ``generate()``
(:mod:`petals_chain.launch.live_clients`):

* PETALS' own routing (``petals``): plain PETALS servers that choose their own blocks
  (``--num_blocks m_j``, PETALS' own sizing with its attention cache for ``DEFAULT_CACHE_JOBS``
  full-length sessions; no ``--block_indices``) and announce the per-block speeds the profiler
  measured (PETALS' throughput cache, read by ``--throughput auto``); the plain PETALS client routes
  every session itself (``min_latency`` with the 10 s alloc penalty) and retries a full server with
  PETALS' backoff. Nothing of PETALS is patched.
* Orchestrated methods (``proposed``, ``jffc_only``: JFFC leases over fixed chains; ``bprr``: a WS-RR
  route per request): ``python -m petals_chain.orchestrator --method M`` composes from the profiler's
  cluster file with the servers' τp/τc pinned to the fitted values (a server's own RTT to the
  orchestrator does not cross the emulated delays) and runs the DHT; orchestrated servers take the
  blocks it assigns; the leasing client leases before every session.

Every session of every method reserves cache for the static job length (the paper's s_c).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from petals_chain import defaults
from petals_chain.compose.capacity import blocks_array
from petals_chain.compose.method_table import Method, live_method
from petals_chain.compose.petals_default import DEFAULT_CACHE_JOBS
from petals_chain.launch.live_clients import LeasingClient, PetalsClient
from petals_chain.launch.live_setup import FittedServer, write_cluster
from petals_chain.launch.swarm_procs import (
    READY_LINE,
    MethodError,
    TestbedSwarm,
    wait_orchestrated,
    wait_petals_servers,
)
from petals_chain.model import Composition, InfeasibleError, ModelSpec, ServerSpec

NETWORK_RPS = 1e9  # PETALS' measured network throughput; the emulated links have no bandwidth limit
ORCHESTRATOR_HEARTBEAT_TIMEOUT_S = 60.0  # servers on 2 busy cores can be slow to heartbeat


def petals_num_blocks(servers: Sequence[ServerSpec], model: ModelSpec,
                      cache_jobs: int = DEFAULT_CACHE_JOBS) -> list[int]:
    """PETALS' own server sizing on a budget: m_j = min(⌊M_j / (s_m + cache_jobs·s_c)⌋, L) (its GPU rule)."""
    return [int(m) for m in blocks_array(servers, model, cache_jobs)]


def petals_throughput_cache(model_dir: Path, dtype: str, inference_rps: float, forward_rps: float) -> dict[str, Any]:
    """PETALS' throughput cache entry (``throughput_v5.json``) for a CPU server, as its own measurement writes it."""
    key = f"model_{model_dir}_device_CPU_dtype_{dtype}"
    return {key: {"inference_rps": float(inference_rps), "forward_rps": float(forward_rps),
                  "network_rps": NETWORK_RPS}}


@dataclass
class MethodInfo:
    """What a started method looks like: placement (name -> [start, end)), chains and notes for the report."""

    method: str
    placement: dict[str, tuple[int, int]] = field(default_factory=dict)
    chains: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)
    startup_s: float = 0.0


def plan_method(method: str, servers: Sequence[FittedServer], model: ModelSpec, arrival_rate: float,
                target_load: float = defaults.TARGET_LOAD, c: int | None = None) -> Composition | None:
    """The composition an orchestrated method will use (None for PETALS, which places its blocks itself);
    InfeasibleError if it cannot serve, SpecError if it does not run live."""
    entry = live_method(method)
    if not entry.orchestrated:
        return None
    return entry.compose([s.spec for s in servers], model, arrival_rate, target_load,
                         c=c if entry.tunes_c else None)


class LiveMethod:
    """One method brought up on a launched testbed: servers (+ orchestrator or DHT) and its client."""

    def __init__(self, method: str, swarm: TestbedSwarm, servers: Sequence[FittedServer], *, arrival_rate: float,
                 target_load: float = defaults.TARGET_LOAD, job: tuple[int, int] = (64, 24),
                 ready_timeout_s: float = 300.0, c: int | None = None) -> None:
        self.entry: Method = live_method(method)
        self.method = method
        self.swarm = swarm
        self.servers = list(servers)
        self.arrival_rate = arrival_rate
        self.target_load = target_load
        self.job = job
        self.ready_timeout_s = ready_timeout_s
        self.c = c  # a fixed reserved concurrency for a method that tunes c (orchestrator --c); None: tuned
        self.client: PetalsClient | LeasingClient | None = None
        self.info = MethodInfo(method)
        self.url: str | None = None

    def start(self) -> MethodInfo:
        """Start everything and wait until the method can serve; the client is then ``self.client``."""
        t0 = time.monotonic()
        try:
            if self.entry.orchestrated:
                self._start_orchestrated()
            else:
                self._start_petals()
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
        self.client = PetalsClient(setup, peers, self.swarm.launch.testbed.time_dilation)
        uids = [f"{setup.dht_prefix}.{i}" for i in range(setup.num_blocks)]
        found = wait_petals_servers(self.client.model.transformer.h.sequence_manager.dht, uids, started, self.swarm,
                                    self.ready_timeout_s)
        self.client.names = {peer: name for name, (peer, _, _) in found.items()}
        self.info.placement = {n: (a, b) for n, (_, a, b) in found.items()}
        self.info.notes = {"attn_cache_tokens": DEFAULT_CACHE_JOBS * setup.max_length,
                           "sessions_per_server": DEFAULT_CACHE_JOBS, "num_blocks": dict(zip(started, m))}

    def _start_orchestrated(self) -> None:
        """The orchestrator of this method (pinned fitted τ) with its DHT, orchestrated servers, the leasing client."""
        setup = self.swarm.setup
        c = self.c if self.entry.tunes_c else None
        comp = self.entry.compose([s.spec for s in self.servers], setup.spec, self.arrival_rate,
                                  self.target_load, c=c)  # fails here, before anything starts, if it cannot serve
        cluster = write_cluster(self.swarm.log_dir / f"cluster-{self.method}.yaml", setup, self.servers,
                                self.arrival_rate, self.target_load, self.job)
        host = self.swarm.host
        argv = [self.swarm.python, "-m", "petals_chain.orchestrator", "--method", self.method,
                "--cluster", str(cluster), "--pin-cluster-times", "--model-blocks", str(setup.num_blocks),
                "--block-bytes", repr(float(setup.block_bytes)), "--cache-bytes", repr(float(setup.cache_bytes)),
                "--host", host, "--port", "0", "--start-dht", "--dht-host-maddrs", f"/ip4/{host}/tcp/0",
                "--heartbeat-timeout-s", repr(ORCHESTRATOR_HEARTBEAT_TIMEOUT_S), "--log-level", "WARNING"]
        if c is not None:
            argv += ["--c", str(c)]
        self.swarm.spawn_root("orchestrator", argv)
        self.url = self.swarm.wait_line("orchestrator", READY_LINE, 120.0).group(1)
        from petals_chain.protocol.blocking import request_json

        index = {s.name: j for j, s in enumerate(self.swarm.launch.testbed.servers)}
        holding = [r["name"] for r in request_json(self.url + "/servers")["servers"]
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
