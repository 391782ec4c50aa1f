"""The paper's service-time model fitted to timed PETALS steps (pure): samples, the design matrix, the NNLS fit.

Per server j, a prefill step of n tokens over m blocks takes ``r_j + s_j + m·(t_o + t_in·n)`` and a
decode step ``r_j + m·t_out`` (``r_j`` the round trip, ``s_j`` the extra of opening a session); see
:mod:`petals_chain.launch.profile_live` for how the steps are measured.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from petals_chain.model import SpecError
from petals_chain.service_time import PER_TOKEN_OVERHEAD_S

STEP_KINDS = ("prefill", "decode")
PARAMS = ("round_trip_s", "session_s", "t_o_s", "t_in_s", "t_out_s")
MIN_TIME_S = 1e-9  # a fitted time of 0 (too small to see) still gives a finite speed for PETALS to announce


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
    batch_slowdown: tuple[float, ...] = ()  # g(b) = τp(b)/τp(1), b = 1..B, measured inside the server (batch probe)

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


# ---- sessions batched together: τp(b) from the server's own step log --------------------------------------------


@dataclass(frozen=True)
class BatchStep:
    """One runtime batch a server ran (its step log, ``PETALS_CHAIN_STEP_LOG``): sessions, tokens, seconds, and the
    bare forward that mirrored it when the server probed it (``--bare-probe-every``), else None."""

    sessions: int
    tokens: int
    seconds: float
    bare_seconds: float | None = None


def read_step_log(path: str | Path) -> list[BatchStep]:
    """The rows of a server's step log (CSV ``sessions,tokens,seconds[,bare_seconds]``, the last empty when not
    probed; logs from before the probe have three columns); SpecError naming the line if malformed."""
    rows = []
    lines = Path(path).read_text().splitlines()
    for i, line in enumerate(lines[1:], start=2):
        try:
            b, n, t, *rest = line.split(",")
            if len(rest) > 1:
                raise ValueError
            bare = float(rest[0]) if rest and rest[0] else None
            rows.append(BatchStep(int(b), int(n), float(t), bare))
        except ValueError:
            raise SpecError(f"{path}:{i}: expected 'sessions,tokens,seconds[,bare_seconds]', got {line!r}") from None
    return rows


def batch_slowdown(steps: Sequence[BatchStep], label: str = "server") -> tuple[float, ...]:
    """g(b) for b = 1..B from the decode batches (one token per session): the median step time with b sessions over
    the median with one. Sizes the probe did not see are interpolated linearly between the neighbours it did; the
    curve is made non-decreasing (a running maximum: noise, not a faster step for more sessions) and at most b."""
    times: dict[int, list[float]] = {}
    for st in steps:
        if st.tokens == st.sessions and st.seconds > 0:
            times.setdefault(st.sessions, []).append(st.seconds)
    if 1 not in times:
        raise SpecError(f"batch probe of {label}: no decode step of one session alone in the step log")
    base = float(np.median(times[1]))
    sizes = sorted(times)
    measured = np.array([float(np.median(times[b])) / base for b in sizes])
    curve = np.interp(np.arange(1, sizes[-1] + 1), sizes, measured)
    curve = np.minimum(np.maximum.accumulate(curve), np.arange(1, sizes[-1] + 1))
    curve[0] = 1.0
    return tuple(round(float(g), 6) for g in curve)


def linear_serial_fraction(curve: Sequence[float]) -> float:
    """The σ whose line 1 + σ(b − 1) fits ``curve`` best (least squares), in [0, 1]: the serial fraction that
    approximates a measured τp(b) (σ = 0 for a curve of one point)."""
    b = np.arange(len(curve), dtype=float)
    if len(curve) < 2:
        return 0.0
    sigma = float(np.dot(b, np.asarray(curve, dtype=float) - 1.0) / np.dot(b, b))
    return min(1.0, max(0.0, sigma))


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
    servers: tuple[str, ...] = ()  # the probed servers; stream k ran on servers[k % len] ("" in older profiles)

    def sessions(self) -> list[int]:
        """Closed-loop sessions each probed server had (streams dealt round-robin)."""
        n = len(self.servers)
        return [self.streams // n + (1 if k < self.streams % n else 0) for k in range(n)]
