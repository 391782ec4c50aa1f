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
A saturation probe (closed-loop jobs, several per server at once) measures the testbed's capacity
in jobs/s, which the Table 1 replay scales its trace to. Outputs: the step samples (CSV), the fits
and the capacity (JSON), measured-vs-model plots (PNG) and a cluster file with the fitted τ for
the composer (``petals_chain compose`` format).
"""

from __future__ import annotations

import csv
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from petals_chain import defaults
from petals_chain.model import SpecError
from petals_chain.service_time import PER_TOKEN_OVERHEAD_S

STEP_KINDS = ("prefill", "decode")
PARAMS = ("round_trip_s", "session_s", "t_o_s", "t_in_s", "t_out_s")
MIN_TIME_S = 1e-9  # a fitted time of 0 (too small to see) still gives a finite speed for PETALS to announce


# ---- measurements and the fit (pure) ------------------------------------------------------------------------


@dataclass(frozen=True)
class StepSample:
    """One timed inference step: server, blocks covered, the job's l_in/l_out, prefill or decode, tokens, seconds."""

    server: str
    blocks: int
    input_tokens: int
    output_tokens: int
    kind: str
    tokens: int
    step: int
    time_s: float
    repeat: int = 0


def design_row(s: StepSample) -> list[float]:
    """The step's features for (r, s, t_o, t_in, t_out): prefill [1, 1, m, m·n, 0], decode [1, 0, 0, 0, m]."""
    if s.kind == "prefill":
        return [1.0, 1.0, float(s.blocks), float(s.blocks * s.tokens), 0.0]
    if s.kind == "decode":
        return [1.0, 0.0, 0.0, 0.0, float(s.blocks)]
    raise SpecError(f"step sample of {s.server}: kind must be one of {STEP_KINDS}, got {s.kind!r}")


@dataclass(frozen=True)
class ServerFit:
    """Fitted per-server figures (seconds); τp/τc of any job follow from them."""

    name: str
    round_trip_s: float
    session_s: float
    t_o_s: float
    t_in_s: float
    t_out_s: float
    samples: int = 0
    r2: float = math.nan
    rtt_s: float = math.nan  # the configured RTT of the testbed (for the paper's τc model)
    speed_factor: float = 1.0

    def tau_p_s(self, input_tokens: float, output_tokens: float) -> float:
        """Per-block computation of one job: t_o + t_in·l_in + t_out·(l_out − 1)."""
        return self.t_o_s + self.t_in_s * input_tokens + self.t_out_s * (max(output_tokens, 1) - 1)

    def tau_c_s(self, output_tokens: float) -> float:
        """Communication of one job at this server: session opening + one round trip per step (l_out steps)."""
        return self.session_s + self.round_trip_s * max(output_tokens, 1)

    def job_time_s(self, blocks: int, input_tokens: float, output_tokens: float) -> float:
        """One job over ``blocks`` blocks of this server: τc + m·τp."""
        return self.tau_c_s(output_tokens) + blocks * self.tau_p_s(input_tokens, output_tokens)

    def model_tau_c_s(self, output_tokens: float, overhead_s: float = PER_TOKEN_OVERHEAD_S) -> float:
        """The paper's communication model from the configured RTT: l_out · (RTT + 18 ms)."""
        return max(output_tokens, 1) * (self.rtt_s + overhead_s)

    @property
    def inference_rps(self) -> float:
        """Decode steps per second of one block (what PETALS announces as inference_rps)."""
        return 1.0 / max(self.t_out_s, MIN_TIME_S)

    @property
    def forward_rps(self) -> float:
        """Prefill tokens per second of one block (PETALS' forward_rps)."""
        return 1.0 / max(self.t_in_s, MIN_TIME_S)


def fit_server(samples: Sequence[StepSample], name: str | None = None, *, rtt_s: float = math.nan,
               speed_factor: float = 1.0) -> ServerFit:
    """Non-negative least squares of the step model over one server's samples; SpecError if under-determined."""
    from scipy.optimize import nnls

    rows = [s for s in samples if name is None or s.server == name]
    label = name or (rows[0].server if rows else "?")
    if not rows:
        raise SpecError(f"profile of {label}: no step samples")
    bad = [s for s in rows if not (math.isfinite(s.time_s) and s.time_s > 0)]
    if bad:
        raise SpecError(f"profile of {label}: step time must be a positive number, got {bad[0].time_s!r}")
    pre = [s for s in rows if s.kind == "prefill"]
    dec = [s for s in rows if s.kind == "decode"]
    if len({s.blocks for s in dec}) < 2:
        raise SpecError(f"profile of {label}: decode steps on at least two block counts are needed to separate the "
                        f"round trip from the computation (got {sorted({s.blocks for s in dec})})")
    if len({(s.blocks, s.tokens) for s in pre}) < 2 or len({s.tokens for s in pre}) < 2:
        raise SpecError(f"profile of {label}: prefills of at least two input lengths are needed to fit t_in")
    a = np.array([design_row(s) for s in rows], dtype=float)
    y = np.array([s.time_s for s in rows], dtype=float)
    scale = np.maximum(np.abs(a).max(axis=0), 1e-12)  # columns on comparable scales for nnls
    coef, _ = nnls(a / scale, y)
    coef = coef / scale
    pred = a @ coef
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(np.sum((y - pred) ** 2)) / ss_tot if ss_tot > 0 else math.nan
    return ServerFit(label, *(float(c) for c in coef), samples=len(rows), r2=r2, rtt_s=rtt_s,
                     speed_factor=speed_factor)


def synthetic_samples(fit: ServerFit, jobs: Iterable[tuple[int, int, int]], rng: np.random.Generator,
                      noise_s: float = 0.0) -> list[StepSample]:
    """Step samples a server with exactly ``fit``'s figures would produce for ``jobs`` (m, l_in, l_out), plus noise."""
    out = []
    for rep, (m, l_in, l_out) in enumerate(jobs):
        t = fit.round_trip_s + fit.session_s + m * (fit.t_o_s + fit.t_in_s * l_in)
        out.append(StepSample(fit.name, m, l_in, l_out, "prefill", l_in, 0, t + rng.normal(0, noise_s), rep))
        for k in range(1, l_out):
            t = fit.round_trip_s + m * fit.t_out_s
            out.append(StepSample(fit.name, m, l_in, l_out, "decode", 1, k, t + rng.normal(0, noise_s), rep))
    return [s if s.time_s > 0 else StepSample(**{**asdict(s), "time_s": 1e-6}) for s in out]


# ---- what to measure ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfileGrid:
    """Jobs to time per server: block counts at the base job; input and output lengths on all L blocks."""

    blocks: tuple[float, ...] = (1, 0.25, 0.5, 0.75, 1.0)  # an int is a count, a float ≤ 1 a fraction of L
    input_tokens: tuple[int, ...] = (8, 32, 64, 128, 256)
    output_tokens: tuple[int, ...] = (2, 8, 16, 32)
    base_input: int = 32
    base_output: int = 8
    repeats: int = 2

    def jobs(self, num_blocks: int) -> list[tuple[int, int, int]]:
        """(m, l_in, l_out) of every job, each repeated ``repeats`` times, duplicates merged."""
        ms = sorted({max(1, min(num_blocks, int(b) if isinstance(b, int) else round(b * num_blocks)))
                     for b in self.blocks} | {num_blocks})
        jobs = {(m, self.base_input, self.base_output) for m in ms}
        jobs |= {(num_blocks, li, self.base_output) for li in self.input_tokens}
        jobs |= {(num_blocks, self.base_input, lo) for lo in self.output_tokens}
        return [j for j in sorted(jobs) for _ in range(self.repeats)]

    def max_length(self) -> int:
        """The longest job (tokens), for the servers' cache."""
        return max(self.input_tokens + (self.base_input,)) + max(self.output_tokens + (self.base_output,))


FULL_GRID = ProfileGrid()
QUICK_GRID = ProfileGrid(blocks=(1, 0.5, 1.0), input_tokens=(16, 64, 160), output_tokens=(2, 8, 20), repeats=1)


@dataclass(frozen=True)
class Capacity:
    """The testbed's measured throughput for one job shape: closed-loop streams over all servers."""

    jobs_per_s: float
    input_tokens: int
    output_tokens: int
    streams: int
    window_s: float
    completed: int
    mean_job_s: float


# ---- on a live testbed --------------------------------------------------------------------------------------


class LiveProfiler:
    """Plain PETALS servers holding the whole model on a launched testbed, and a client pinned to one at a time."""

    def __init__(self, launch: Any, setup: Any, log_dir: Path, *, servers: Sequence[str] | None = None,
                 sessions_per_server: int = 4, session_tokens: int = 512,
                 log: Callable[[str], None] = print) -> None:
        from petals_chain.launch.methods import TestbedSwarm

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

        from petals_chain.launch.methods import wait_petals_servers

        peers = self.swarm.start_dht()
        index = {s.name: j for j, s in enumerate(self.launch.testbed.servers)}
        for name in self.names:
            self.swarm.start_petals_server(index[name], peers, block_indices=(0, self.setup.num_blocks),
                                           attn_cache_tokens=self.sessions_per_server * self.session_tokens)
        self.dht = DHT(initial_peers=peers, client_mode=True, start=True)
        self.config = dataclasses.replace(ClientConfig(), initial_peers=tuple(peers), dht_prefix=self.setup.dht_prefix,
                                          show_route=False)
        found = wait_petals_servers(self.dht, self.uids, self.names, self.swarm, timeout_s)
        self.peers = {n: peer for n, (peer, _, _) in found.items()}

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

        threads = [threading.Thread(target=stream, args=(k,), daemon=True) for k in range(streams)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise RuntimeError(f"capacity probe: {len(errors)} stream(s) failed; first: {errors[0]}")
        lo, hi = t0 + warmup_s, stop_at
        done = [(s, e) for s, e in ends if lo <= e <= hi]
        if not done:
            raise RuntimeError(f"capacity probe: no job finished within {duration_s:g} s")
        return Capacity(len(done) / (hi - lo), input_tokens, output_tokens, streams, hi - lo, len(done),
                        float(np.mean([e - s for s, e in done])))

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


# ---- results ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Profile:
    """A profile as written to JSON: testbed, model, fits by server, the capacity and the job shape τ is given for."""

    testbed: str
    model: str
    num_blocks: int
    max_length: int
    fits: dict[str, ServerFit]
    capacity: Capacity | None
    job: tuple[int, int]
    created: str = ""
    command: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON document (fits with their τ for ``job``)."""
        li, lo = self.job
        return {"testbed": self.testbed, "model": self.model, "num_blocks": self.num_blocks,
                "max_length": self.max_length, "job": {"input_tokens": li, "output_tokens": lo},
                "created": self.created, "command": self.command,
                "servers": [{**asdict(f), "tau_p_s": f.tau_p_s(li, lo), "tau_c_s": f.tau_c_s(lo),
                             "model_tau_c_s": f.model_tau_c_s(lo)} for f in self.fits.values()],
                "capacity": asdict(self.capacity) if self.capacity is not None else None}


def load_profile(path: str | Path) -> Profile:
    """Read a profile JSON written by :func:`write_outputs`; SpecError naming the file and field if malformed."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"profile file not found: {path} (python -m petals_chain.launch.profile TESTBED.yaml)")
    try:
        doc = json.loads(path.read_text())
        names = set(ServerFit.__annotations__)
        fits = {}
        for i, s in enumerate(doc["servers"]):
            kw = {k: s[k] for k in names if k in s}
            for p in PARAMS:
                v = kw.get(p)
                if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                    raise SpecError(f"{path}: servers[{i}].{p} must be a number >= 0, got {v!r}")
            fits[s["name"]] = ServerFit(**kw)
        cap = Capacity(**doc["capacity"]) if doc.get("capacity") else None
        job = (int(doc["job"]["input_tokens"]), int(doc["job"]["output_tokens"]))
        return Profile(doc["testbed"], doc["model"], int(doc["num_blocks"]), int(doc["max_length"]), fits, cap, job,
                       doc.get("created", ""), doc.get("command", ""))
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, SpecError):
            raise
        raise SpecError(f"{path}: not a profile written by petals_chain.launch.profile ({type(exc).__name__}: "
                        f"{exc})") from None


def write_samples_csv(path: Path, samples: Sequence[StepSample]) -> Path:
    """Every timed step as a CSV row."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(StepSample.__annotations__))
        w.writeheader()
        w.writerows(asdict(s) for s in samples)
    return path


def read_samples_csv(path: Path) -> list[StepSample]:
    """Step samples back from :func:`write_samples_csv`."""
    types = {"server": str, "kind": str, "time_s": float}
    with path.open() as fh:
        return [StepSample(**{k: types.get(k, int)(v) for k, v in row.items()}) for row in csv.DictReader(fh)]


def job_times(samples: Sequence[StepSample]) -> dict[tuple[str, int, int, int, int], float]:
    """Total time of each measured job, keyed (server, m, l_in, l_out, repeat)."""
    out: dict[tuple[str, int, int, int, int], float] = {}
    for s in samples:
        key = (s.server, s.blocks, s.input_tokens, s.output_tokens, s.repeat)
        out[key] = out.get(key, 0.0) + s.time_s
    return out


def plot_profile(path: Path, samples: Sequence[StepSample], fits: dict[str, ServerFit], grid_base: tuple[int, int],
                 num_blocks: int, title: str) -> Path:
    """Measured vs model, like paper Figs 9-10: computation vs blocks / input length / output length; communication."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    jobs = job_times(samples)
    fig, ax = plt.subplots(2, 2, figsize=(12, 8.5))
    speeds = sorted({f.speed_factor for f in fits.values()}, reverse=True)
    cmaps = [plt.get_cmap(n) for n in ("Blues", "Oranges", "Greens", "Purples")]
    colors = {}
    for si, sp in enumerate(speeds):
        group = [n for n, f in fits.items() if f.speed_factor == sp]
        for gi, n in enumerate(group):
            colors[n] = cmaps[si % len(cmaps)](0.45 + 0.5 * gi / max(1, len(group)))
    b_in, b_out = grid_base
    for name, f in fits.items():
        c = colors[name]
        # (a) computation of one job vs blocks, at the base job
        pts = [(m, t - f.tau_c_s(lo)) for (s, m, li, lo, _), t in jobs.items()
               if s == name and li == b_in and lo == b_out]
        if pts:
            ms = np.array(sorted({p[0] for p in pts}))
            ax[0, 0].scatter([p[0] for p in pts], [p[1] for p in pts], s=12, color=c)
            ax[0, 0].plot(ms, ms * f.tau_p_s(b_in, b_out), color=c, lw=1, label=f"{name} (speed {f.speed_factor:g})")
        # (b) per-block prefill computation vs input length, on all blocks
        pre = [(s.tokens, (s.time_s - f.round_trip_s - f.session_s) / s.blocks) for s in samples
               if s.server == name and s.kind == "prefill" and s.blocks == num_blocks and s.output_tokens == b_out]
        if pre:
            xs = np.array(sorted({p[0] for p in pre}))
            ax[0, 1].scatter([p[0] for p in pre], [p[1] * 1e3 for p in pre], s=12, color=c)
            ax[0, 1].plot(xs, (f.t_o_s + f.t_in_s * xs) * 1e3, color=c, lw=1)
        # (c) per-block decode computation of one job vs output length, on all blocks
        dec: dict[tuple[int, int], float] = {}
        for s in samples:
            if s.server == name and s.blocks == num_blocks and s.input_tokens == b_in and s.kind == "decode":
                key = (s.output_tokens, s.repeat)
                dec[key] = dec.get(key, 0.0) + (s.time_s - f.round_trip_s) / s.blocks
        if dec:
            xs = np.array(sorted({k[0] for k in dec}))
            ax[1, 0].scatter([k[0] for k in dec], [v * 1e3 for v in dec.values()], s=12, color=c)
            ax[1, 0].plot(xs, f.t_out_s * (xs - 1) * 1e3, color=c, lw=1)
    names = list(fits)
    x = np.arange(len(names))
    meas = [fits[n].tau_c_s(b_out) for n in names]
    model = [fits[n].model_tau_c_s(b_out) for n in names]
    ax[1, 1].bar(x - 0.2, meas, 0.4, label="measured (fit: s + l_out·r)", color="tab:blue")
    ax[1, 1].bar(x + 0.2, model, 0.4, label="model: l_out·(RTT + 18 ms)", color="tab:gray")
    ax[1, 1].set_xticks(x, names)
    ax[0, 0].set(xlabel="blocks served m", ylabel="computation of one job (s)",
                 title=f"Fig 9a: computation vs blocks (l_in={b_in}, l_out={b_out})")
    ax[0, 1].set(xlabel="input length l_in (tokens)", ylabel="prefill per block (ms)",
                 title="Fig 9b: computation vs input length (t_o + t_in·l_in)")
    ax[1, 0].set(xlabel="output length l_out (tokens)", ylabel="decode per block, whole job (ms)",
                 title="Fig 9c: computation vs output length (t_out·(l_out−1))")
    ax[1, 1].set(xlabel="server", ylabel=f"communication of one job (s), l_out={b_out}",
                 title="Fig 10: communication time per server")
    ax[0, 0].legend(fontsize=7, ncol=2)
    ax[1, 1].legend(fontsize=8)
    for a in ax.flat:
        a.grid(alpha=0.3)
    fig.suptitle(f"{title}: measured (dots/bars) vs fitted model (lines)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_outputs(out_dir: Path, stem: str, profile: Profile, samples: Sequence[StepSample], setup: Any,
                  memory: dict[str, float], grid: ProfileGrid,
                  target_load: float = defaults.TARGET_LOAD) -> dict[str, Path]:
    """Samples CSV, profile JSON, the measured-vs-model PNG and the cluster file (fitted τ for ``profile.job``)."""
    from petals_chain.launch.methods import FittedServer, write_cluster

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"samples": write_samples_csv(out_dir / f"{stem}_samples.csv", samples)}
    paths["json"] = out_dir / f"{stem}.json"
    paths["json"].write_text(json.dumps(profile.to_json(), indent=1))
    paths["png"] = plot_profile(out_dir / f"{stem}.png", samples, profile.fits, (grid.base_input, grid.base_output),
                                profile.num_blocks, f"profile of {profile.testbed}")
    li, lo = profile.job
    fitted = [FittedServer(n, memory[n], f.tau_p_s(li, lo), f.tau_c_s(lo), f.inference_rps, f.forward_rps)
              for n, f in profile.fits.items()]
    rate = target_load * profile.capacity.jobs_per_s if profile.capacity is not None else defaults.ARRIVAL_RATE
    paths["cluster"] = write_cluster(out_dir / f"{stem}_cluster.yaml", setup, fitted, rate, target_load, profile.job)
    return paths
