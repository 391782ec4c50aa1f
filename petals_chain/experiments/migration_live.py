"""What the live migration experiments share: a loopback swarm with servers of set speeds, and an open-loop replay
of Poisson arrivals through leased sessions that records each request's timing, chain, moves and tokens.

Servers slower than the machine run under :mod:`petals_chain.launch.slowdown` (each block's compute stretched by
1/speed), so chains of different speed exist on one CPU, and the orchestrator measures them as such.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain.experiments.checkpoints import append_record, read_records
from petals_chain.experiments.common import REPO
from petals_chain.launch.slowdown import SPEED_ENV
from petals_chain.loopback.swarm import LocalSwarm, ServerPlan, write_tiny_llama
from petals_chain.protocol.blocking import request_json

SMOLLM2_DIR = REPO / ".cache" / "models" / "SmolLM2-135M-Instruct"


class SpeedSwarm(LocalSwarm):
    """A LocalSwarm whose servers named in ``speeds`` run slower (launch/slowdown.py), under ``--migration``."""

    def __init__(self, *args: Any, speeds: dict[str, float] | None = None, migration: str = "none",
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.speeds = dict(speeds or {})
        self.migration = migration

    def orchestrator_args(self) -> list[str]:
        """LocalSwarm's orchestrator with the migration policy."""
        return [*super().orchestrator_args(), "--migration", self.migration]

    def server_command(self, plan: ServerPlan) -> list[str]:
        """A slowed server runs through the slowdown entry point."""
        cmd = super().server_command(plan)
        if plan.name in self.speeds:
            return ["-m", "petals_chain.launch.slowdown", "orchestrated", *cmd[2:]]
        return cmd

    def start_server(self, plan: ServerPlan) -> Any:
        """Start one server, with its speed factor in its environment."""
        old = os.environ.get(SPEED_ENV)
        os.environ[SPEED_ENV] = str(self.speeds.get(plan.name, 1.0))
        try:
            return super().start_server(plan)
        finally:
            if old is None:
                os.environ.pop(SPEED_ENV, None)
            else:
                os.environ[SPEED_ENV] = old

    def start(self, timeout_s: float = 300.0) -> SpeedSwarm:
        """The orchestrator and the full-speed servers first; then each slowed server, told its per-block time as
        the full-speed servers measured theirs divided by its speed (its own measurement would run before the
        slowdown applies), so the orchestrator ranks the chains as they will run."""
        self.start_orchestrator()
        plain = [p for p in self.plans if p.name not in self.speeds]
        for plan in plain:
            self.start_server(plan)
        self.wait_ready([p.name for p in plain], timeout_s)
        taus = [r["tau_p_s"] for r in self.get("/servers")["servers"] if r["name"] not in self.speeds]
        tau = float(np.mean(taus))
        for plan in self.plans:
            if plan.name in self.speeds:
                extra = (*plan.extra_args, "--tau-p", f"{tau / self.speeds[plan.name]:.6f}")
                self.start_server(ServerPlan(plan.name, plan.memory_budget, extra))
        self.wait_ready([p.name for p in self.plans], timeout_s)
        return self

    def set_policy(self, policy: str) -> dict[str, Any]:
        """Switch the orchestrator's migration policy (POST /migrations)."""
        assert self.url is not None
        return request_json(self.url + "/migrations", data={"policy": policy})


def model_dir(quick: bool, tmp: Path) -> tuple[Path, str]:
    """SmolLM2-135M when it is prepared (the demo's checkpoint), else a tiny random LLaMA; with its name."""
    if SMOLLM2_DIR.is_dir():
        return SMOLLM2_DIR, "SmolLM2-135M-Instruct"
    return write_tiny_llama(tmp / "tiny-llama", seed=0), "tiny-llama (SmolLM2 not prepared)"


@contextlib.contextmanager
def replay_swarm(name: str, quick: bool, plans: list[ServerPlan], new_tokens: int,
                 speeds: dict[str, float] | None = None) -> Iterator[tuple[SpeedSwarm, Any, str]]:
    """The swarm the live replay experiments run on: whole-model servers (``plans``; those in ``speeds`` slowed) of
    two cache slots each under the orchestrator, and a client that leases from it; yields (swarm, client model,
    model name) and stops both after."""
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        mdir, mname = model_dir(quick, Path(tmp))
        sw = SpeedSwarm(mdir, plans, log_dir=Path(tmp) / "logs", model_name="smollm2", max_length=128,
                        arrival_rate=1.0, c=2, lease_ttl_s=30.0, heartbeat_timeout_s=60.0,
                        job_output_tokens=new_tokens, job_input_tokens=8, speeds=speeds)
        with sw:
            slow = "".join(f"; {n} at speed {v}" for n, v in (speeds or {}).items())
            print(f"[{name}] starting the swarm ({mname}, {len(plans)} whole-model servers{slow})", flush=True)
            sw.start(timeout_s=600)
            from petals_chain import AutoDistributedModelForCausalLM

            model = AutoDistributedModelForCausalLM.from_pretrained(str(mdir), orchestrator=sw.url,
                                                                   lease_timeout_s=600.0, lease_ttl_s=30.0)
            try:
                yield sw, model, mname
            finally:
                model.orchestrator.close()


@dataclass
class Request:
    """One replayed request: when it arrived (s from the start), its lease wait, service, chain, moves, tokens."""

    policy: str
    request: int
    arrival_s: float
    end_s: float = float("nan")
    waited_s: float = float("nan")
    service_s: float = float("nan")
    first_chain: str = ""
    last_chain: str = ""
    moves: int = 0
    move_downtime_s: float = 0.0
    move_modes: tuple[str, ...] = ()  # the mode of each completed move ("kv", "token")
    tokens: tuple[int, ...] = ()
    error: str = ""
    segments: tuple[tuple[str, float, float], ...] = ()  # (chain, from, to): where it ran, moves overlapping

    def busy_segments(self, rec: Any, t0: float) -> tuple[tuple[str, float, float], ...]:
        """Where the session held a chain's cache: its first chain from the grant to its first move's end, and so
        on (during a move both chains hold it), the last until it closed; seconds from ``t0``."""
        granted = rec.requested_s + (rec.waited_s or 0.0) - t0
        out, chain, start = [], None, granted
        for m in rec.migrations:
            if m.error is not None:
                continue
            chain = chain or m.from_chain
            out.append((chain, start, m.done_s - t0))
            chain, start = m.to_chain, m.started_s - t0
        out.append((chain or rec.chain_id, start, self.end_s))
        return tuple(out)

    @property
    def response_s(self) -> float:
        """Arrival to the last token."""
        return self.end_s - self.arrival_s

    def row(self) -> dict[str, Any]:
        """A CSV row."""
        return {"policy": self.policy, "request": self.request, "arrival_s": self.arrival_s,
                "response_s": self.response_s, "waited_s": self.waited_s, "service_s": self.service_s,
                "first_chain": self.first_chain, "last_chain": self.last_chain, "moves": self.moves,
                "move_downtime_s": self.move_downtime_s, "error": self.error}


def server_seconds(reqs: list[Request]) -> dict[str, float]:
    """Per chain, the length of the union of the intervals any session held it: the time it could not be
    released."""
    by_chain: dict[str, list[tuple[float, float]]] = {}
    for r in reqs:
        for chain, a, b in r.segments:
            by_chain.setdefault(chain, []).append((a, b))
    out = {}
    for chain, spans in by_chain.items():
        total, end = 0.0, -float("inf")
        for a, b in sorted(spans):
            if b > end:
                total += b - max(a, end)
                end = b
        out[chain] = total
    return out


def poisson_arrivals(n: int, rate_per_s: float, rng: np.random.Generator) -> np.ndarray:
    """n Poisson arrival times (s), the first at 0."""
    gaps = rng.exponential(1.0 / rate_per_s, n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def replay(model: Any, policy: str, arrivals: np.ndarray, prompts: list[list[int]], new_tokens: list[int],
           max_length: int, timeout_s: float) -> list[Request]:
    """Each request in its own thread at its arrival time: a leased session generating greedily; wait for all."""
    import torch

    reqs = [Request(policy, i, float(a)) for i, a in enumerate(arrivals)]
    t0 = time.monotonic() + 0.5

    def one(r: Request) -> None:
        """Serve one request; errors are recorded."""
        try:
            with model.inference_session(max_length=max_length) as s:
                out = model.generate(torch.tensor([prompts[r.request]]), max_new_tokens=new_tokens[r.request],
                                     do_sample=False, session=s)
            r.end_s = time.monotonic() - t0
            rec = s.record
            r.tokens = tuple(out[0].tolist())
            r.waited_s, r.service_s = rec.waited_s, rec.service_s
            done = [m for m in rec.migrations if m.error is None]
            r.first_chain = done[0].from_chain if done else rec.chain_id
            r.last_chain, r.moves = rec.chain_id, len(done)
            r.move_downtime_s = float(sum(m.downtime_s for m in done))
            r.move_modes = tuple(m.mode for m in done)
            r.segments = r.busy_segments(rec, t0)
        except Exception as exc:  # recorded in the table, never dropped
            r.error = f"{type(exc).__name__}: {exc}"[:300]

    threads = []
    for r in reqs:
        wait = t0 + r.arrival_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        th = threading.Thread(target=one, args=(r,), daemon=True)
        th.start()
        threads.append(th)
    deadline = time.monotonic() + timeout_s
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    for r, th in zip(reqs, threads):
        if th.is_alive() and not r.error:
            r.error = f"not finished {timeout_s:g} s after the last arrival"
    return reqs


def prompts_for(n: int, vocab: int, rng: np.random.Generator, length: int = 8) -> list[list[int]]:
    """Random prompts of ``length`` tokens (token 1 first, as a BOS)."""
    return [[1, *rng.integers(3, vocab, length - 1).tolist()] for _ in range(n)]


def wait_idle(sw: LocalSwarm, timeout_s: float = 120.0) -> None:
    """Until no lease is held (a policy is switched only while nothing runs)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and sw.get("/health")["active_leases"]:
        time.sleep(0.2)


def save_replication(path: Path | None, rep: dict[str, Any]) -> None:
    """Append one finished replication (its ``runs``: policy → list of :class:`Request`) to a checkpoint file, one
    JSON line; nothing without a path (a --quick run keeps none)."""
    append_record(path, {**rep, "runs": {p: [dataclasses.asdict(r) for r in rs] for p, rs in rep["runs"].items()}})


def load_replications(path: Path | None, key: Callable[[dict[str, Any]], Hashable]) -> dict[Hashable, dict[str, Any]]:
    """The replications a checkpoint holds, by ``key(replication)``, their requests as :class:`Request` again
    (none without a file)."""
    out = {}
    for d in read_records(path):
        d["runs"] = {p: [Request(**{**r, "move_modes": tuple(r["move_modes"]), "tokens": tuple(r["tokens"]),
                                    "segments": tuple(tuple(s) for s in r["segments"])}) for r in rs]
                     for p, rs in d["runs"].items()}
        out[key(d)] = d
    return out
