"""Profile each server of a live testbed and fit the paper's service-time model (paper Figs 9-10).

Every server runs a plain PETALS server holding all L blocks inside its namespace (behind its
emulated delay, at its emulated speed). From the root namespace, a client pinned to one server at
a time runs inference sessions over the first ``m`` blocks with a prefill of ``l_in`` tokens and
``l_out − 1`` one-token decode steps, timing every step. A step is one round trip plus the
computation of the blocks it covers, so per server j (non-negative least squares over all steps)::

    prefill step (n = l_in tokens):  r_j + s_j + m · (t_o + t_in · n)
    decode step:                     r_j + m · t_out

with ``r_j`` the round trip (RTT + serialisation overhead) and ``s_j`` the extra of opening the
session. Hence, per job, the paper's per-block ``τp_j = t_o + t_in·l_in + t_out·(l_out − 1)`` and
per-server ``τc_j = s_j + l_out · r_j`` (one round trip for the prefill and each decode step).
A batch probe runs b = 1, 2, 4, … sessions at once on each server and reads the server's own step log
(``PETALS_CHAIN_STEP_LOG``: sessions, tokens and seconds of every batch its runtime ran), so τp(b)/τp(1) is
measured inside the server, without the round trips (``profile_fit.batch_slowdown``). The servers batch as ours
do (``batched``, the default) or run PETALS' one-session-at-a-time pool. A saturation probe (closed-loop jobs,
several per server at once) measures the testbed's capacity in jobs/s, which the Table 1 replay scales its trace
to. Outputs: the step samples (CSV), the fits
and the capacity (JSON), measured-vs-model plots (PNG) and a cluster file with the fitted τ for
the composer (``petals_chain compose`` format).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.model import SpecError
from petals_chain.launch.profile_fit import BatchStep, Capacity, ProfileGrid, StepSample, read_step_log
from petals_chain.server.batching import STEP_LOG_ENV

def _run_together(fn: Callable[[int], None], n: int) -> None:
    """``fn(0)`` … ``fn(n − 1)``, each in a thread of its own, all started before any is waited for."""
    threads = [threading.Thread(target=fn, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# ---- on a live testbed --------------------------------------------------------------------------------------


class LiveProfiler:
    """Plain PETALS servers holding the whole model on a launched testbed, and a client pinned to one at a time."""

    def __init__(self, launch: Any, setup: Any, log_dir: Path, *, servers: Sequence[str] | None = None,
                 sessions_per_server: int = 4, session_tokens: int = 512, batched: bool = True,
                 log: Callable[[str], None] = print) -> None:
        from petals_chain.launch.swarm_procs import TestbedSwarm

        self.launch = launch
        self.setup = setup
        self.swarm = TestbedSwarm(launch, setup, log_dir)
        names = [s.name for s in launch.testbed.servers]
        unknown = [n for n in (servers or []) if n not in names]
        if unknown:
            raise SpecError(f"--servers: unknown server(s) {', '.join(unknown)} (testbed has {', '.join(names)})")
        self.names = list(servers) if servers else names
        self.sessions_per_server = sessions_per_server
        self.session_tokens = session_tokens
        self.batched = batched
        self.log_dir = Path(log_dir)
        self.log = log
        self.dht: Any = None
        self.config: Any = None
        self.peers: dict[str, str] = {}
        self._managers: dict[tuple[str, int], Any] = {}

    def start(self, timeout_s: float = 300.0) -> None:
        """DHT, one whole-model server per profiled testbed server, and the client's DHT node; wait until online."""
        import dataclasses

        from hivemind.dht import DHT
        from petals.client.config import ClientConfig

        from petals_chain.launch.swarm_procs import wait_petals_servers

        peers = self.swarm.start_dht()
        index = {s.name: j for j, s in enumerate(self.launch.testbed.servers)}
        for name in self.names:
            self.step_log(name).unlink(missing_ok=True)
            self.swarm.start_petals_server(index[name], peers, block_indices=(0, self.setup.num_blocks),
                                           attn_cache_tokens=self.sessions_per_server * self.session_tokens,
                                           batched=self.batched, env={STEP_LOG_ENV: str(self.step_log(name))})
        self.dht = DHT(initial_peers=peers, client_mode=True, start=True)
        self.config = dataclasses.replace(ClientConfig(), initial_peers=tuple(peers), dht_prefix=self.setup.dht_prefix,
                                          show_route=False)
        found = wait_petals_servers(self.dht, self.uids, self.names, self.swarm, timeout_s)
        self.peers = {n: peer for n, (peer, _, _) in found.items()}

    def step_log(self, name: str) -> Path:
        """Where server ``name`` logs every batch its runtime runs (batching servers only)."""
        return self.log_dir / f"steps-{name}.csv"

    @property
    def uids(self) -> list[str]:
        """Block uids of the whole model."""
        return [f"{self.setup.dht_prefix}.{i}" for i in range(self.setup.num_blocks)]

    def manager(self, name: str, blocks: int) -> Any:
        """A sequence manager over the first ``blocks`` blocks that routes only to server ``name``."""
        import dataclasses

        from petals.client.routing.sequence_manager import RemoteSequenceManager

        key = (name, blocks)
        if key not in self._managers:
            full = self._managers.get((name, self.setup.num_blocks))
            if full is None:
                cfg = dataclasses.replace(self.config, allowed_servers=(self.peers[name],))
                full = RemoteSequenceManager(cfg, self.uids, dht=self.dht)
                self._managers[(name, self.setup.num_blocks)] = full
            self._managers[key] = full if blocks == self.setup.num_blocks else full[0:blocks]
        return self._managers[key]

    def run_job(self, name: str, blocks: int, input_tokens: int, output_tokens: int,
                rng: np.random.Generator) -> list[tuple[str, int, int, float]]:
        """One job on server ``name``: (kind, tokens, step, seconds) of its prefill and decode steps."""
        import torch
        from petals.client.inference_session import InferenceSession

        hidden = self.setup.hidden_size
        mgr = self.manager(name, blocks)
        out: list[tuple[str, int, int, float]] = []
        with torch.no_grad(), InferenceSession(mgr, max_length=input_tokens + output_tokens) as sess:
            x = torch.from_numpy(rng.standard_normal((1, input_tokens, hidden), dtype=np.float32))
            t0 = time.perf_counter()
            sess.step(x)
            out.append(("prefill", input_tokens, 0, time.perf_counter() - t0))
            for k in range(1, output_tokens):
                x = torch.from_numpy(rng.standard_normal((1, 1, hidden), dtype=np.float32))
                t0 = time.perf_counter()
                sess.step(x)
                out.append(("decode", 1, k, time.perf_counter() - t0))
        return out

    def measure(self, grid: ProfileGrid, rng: np.random.Generator,
                progress: Callable[[str, int, int], None] | None = None) -> list[StepSample]:
        """Time ``grid``'s jobs on every profiled server, one server at a time (a warm-up job first, not kept)."""
        jobs = grid.jobs(self.setup.num_blocks)
        samples: list[StepSample] = []
        for name in self.names:
            self.run_job(name, self.setup.num_blocks, grid.base_input, 2, rng)  # warm-up: first-call costs
            for i, (m, l_in, l_out) in enumerate(jobs):
                for kind, n, step, t in self.run_job(name, m, l_in, l_out, rng):
                    samples.append(StepSample(name, m, l_in, l_out, kind, n, step, t, i))
                if progress is not None:
                    progress(name, i + 1, len(jobs))
        return samples

    def batch_probe(self, sizes: Sequence[int], input_tokens: int, decode_steps: int,
                    seed: int = 0) -> dict[str, list[BatchStep]]:
        """Per profiled server, the batches its runtime ran while ``b`` sessions (each a prefill of ``input_tokens``
        and ``decode_steps`` decode steps over all blocks) ran at once, for every b in ``sizes``."""
        if not self.batched:
            raise SpecError("batch probe: the servers run PETALS' own pool (one session at a time); nothing to batch")
        if max(sizes) > self.sessions_per_server:
            raise SpecError(f"batch probe: {max(sizes)} sessions exceed the servers' cache of "
                            f"{self.sessions_per_server} sessions")
        out: dict[str, list[BatchStep]] = {}
        for name in self.names:
            seen = len(read_step_log(self.step_log(name))) if self.step_log(name).exists() else 0
            for b in sizes:
                errors: list[str] = []

                def session(k: int, b: int = b, errors: list[str] = errors) -> None:
                    """One session of the b running at once."""
                    try:
                        self.run_job(name, self.setup.num_blocks, input_tokens, decode_steps + 1,
                                     np.random.default_rng([seed, b, k]))
                    except Exception as exc:  # reported below, with the server's name
                        errors.append(f"{type(exc).__name__}: {exc}")

                _run_together(session, b)
                if errors:
                    raise RuntimeError(f"batch probe on {name} with {b} sessions: {errors[0]}")
            rows = read_step_log(self.step_log(name))
            out[name] = rows[seen:]
        return out

    def capacity(self, input_tokens: int, output_tokens: int, *, streams: int, duration_s: float,
                 warmup_s: float, seed: int = 0) -> Capacity:
        """Closed-loop jobs from ``streams`` clients (spread round-robin over the servers) for duration_s."""
        t0 = time.monotonic()
        stop_at = t0 + warmup_s + duration_s
        ends: list[tuple[float, float]] = []
        lock = threading.Lock()
        errors: list[str] = []

        def stream(k: int) -> None:
            """Jobs back to back on one server until the end of the probe."""
            name = self.names[k % len(self.names)]
            rng = np.random.default_rng([seed, k])
            while time.monotonic() < stop_at:
                start = time.monotonic()
                try:
                    self.run_job(name, self.setup.num_blocks, input_tokens, output_tokens, rng)
                except Exception as exc:  # a failed job is reported, the probe goes on
                    errors.append(f"{name}: {type(exc).__name__}: {exc}")
                    return
                with lock:
                    ends.append((start, time.monotonic()))

        _run_together(stream, streams)
        if errors:
            raise RuntimeError(f"capacity probe: {len(errors)} stream(s) failed; first: {errors[0]}")
        lo, hi = t0 + warmup_s, stop_at
        done = [(s, e) for s, e in ends if lo <= e <= hi]
        if not done:
            raise RuntimeError(f"capacity probe: no job finished within {duration_s:g} s")
        return Capacity(len(done) / (hi - lo), input_tokens, output_tokens, streams, hi - lo, len(done),
                        float(np.mean([e - s for s, e in done])), tuple(self.names))

    def stop(self) -> None:
        """Stop the routing threads, the client's DHT node and every process this profiler started."""
        for mgr in self._managers.values():
            mgr.shutdown()
        self._managers.clear()
        if self.dht is not None:
            try:
                self.dht.shutdown()
            except Exception as exc:  # already gone: nothing to stop
                self.log(f"profiler: client DHT shutdown: {exc}")
            self.dht = None
        self.swarm.stop()

    def __enter__(self) -> LiveProfiler:
        """``with LiveProfiler(...) as p:`` starts the servers."""
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop everything the profiler started."""
        self.stop()
