"""Figs 9-10 from a testbed profile's timed steps (pure): computation and communication points, the model, the errors.

The profiler (petals_chain.launch.profile_live) times whole client-side steps: a prefill step is one round trip
plus the prefill of m blocks, a decode step one round trip plus one token through m blocks. PETALS does not
report the server's compute time to the client, so the split is inferred from the per-server fit of
petals_chain.launch.profile_fit: computation = step time − fitted round trip (r_j, and s_j for the session's
first step); communication = step time − fitted computation (m·(t_o + t_in·l_in) for a prefill, m·t_out for
a decode step). The fitted round trip is identified by timing the same steps over different block counts
(the intercept at m = 0), so it is measured, not assumed; what is inferred is that it does not depend on the
tokens. Model lines: the fit's (docs/table1.md, "Profiler") and, for communication, the paper's
``l_out·(RTT + 18 ms)`` (docs/model.md, "Service time").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from petals_chain.launch.profile_fit import ServerFit, StepSample
from petals_chain.model import SpecError
from petals_chain.service_time import PER_TOKEN_OVERHEAD_S

JobKey = tuple[str, int, int, int, int]  # (server, m, l_in, l_out, repeat)


@dataclass(frozen=True)
class Point:
    """One measured figure (s) at abscissa x for a server, with what a model predicts for it."""

    server: str
    x: float
    measured_s: float
    model_s: float


@dataclass(frozen=True)
class PanelError:
    """How far a model is from the points of one panel: relative RMSE, largest relative error, bias and where."""

    n: int
    rel_rmse: float  # sqrt(mean((model − measured)²)) / mean(|measured|)
    max_rel_error: float  # max |model − measured| / mean(|measured|) (a point's own value can be near 0)
    bias: float  # mean(model − measured) / mean(|measured|): > 0 the model over-estimates on average
    over_at: tuple[float, ...]  # abscissae where the model's mean is above the measured mean
    under_at: tuple[float, ...]

    def describe(self) -> str:
        """One line: the errors and where the model over- or under-estimates."""
        if self.n == 0:
            return "no points"
        side = "over" if self.bias > 0 else "under"

        def xs(v: tuple[float, ...]) -> str:
            return ", ".join(f"{x:g}" for x in v) if v else "none"

        return (f"relative RMSE {100 * self.rel_rmse:.1f} %, max error {100 * self.max_rel_error:.1f} % of the mean, "
                f"{side}-estimates by {100 * abs(self.bias):.1f} % on average (over at x = {xs(self.over_at)}; "
                f"under at x = {xs(self.under_at)}; n = {self.n})")


def panel_error(points: Sequence[Point]) -> PanelError:
    """The model's error over a panel's points (x groups for where it over/under-estimates)."""
    if not points:
        return PanelError(0, math.nan, math.nan, math.nan, (), ())
    meas = np.array([p.measured_s for p in points])
    model = np.array([p.model_s for p in points])
    scale = float(np.mean(np.abs(meas)))
    if not scale > 0:
        raise SpecError("panel error: the measured figures are all zero")
    diff = model - meas
    rel = np.abs(diff) / scale
    over, under = [], []
    for x in sorted({p.x for p in points}):
        sel = [i for i, p in enumerate(points) if p.x == x]
        (over if float(np.mean(diff[sel])) > 0 else under).append(x)
    return PanelError(len(points), float(np.sqrt(np.mean(diff ** 2)) / scale), float(rel.max()),
                      float(np.mean(diff) / scale), tuple(over), tuple(under))


def group_jobs(samples: Sequence[StepSample]) -> dict[JobKey, list[StepSample]]:
    """Steps grouped by job (server, m, l_in, l_out, repeat), in step order."""
    out: dict[JobKey, list[StepSample]] = {}
    for s in samples:
        out.setdefault((s.server, s.blocks, s.input_tokens, s.output_tokens, s.repeat), []).append(s)
    for steps in out.values():
        steps.sort(key=lambda s: s.step)
    return out


def _fit(fits: Mapping[str, ServerFit], name: str) -> ServerFit:
    """The server's fit; SpecError if the profile has none."""
    if name not in fits:
        raise SpecError(f"step samples of server {name!r} but no fit for it in the profile")
    return fits[name]


def _select(jobs: Mapping[JobKey, list[StepSample]], want: Callable[[JobKey], bool]) -> list[tuple[JobKey, list]]:
    """Jobs whose key passes ``want``, sorted."""
    return sorted((k, v) for k, v in jobs.items() if want(k))


# ---- Fig 9: computation ------------------------------------------------------------------------------------------


def computation_vs_blocks(samples: Sequence[StepSample], fits: Mapping[str, ServerFit], base: tuple[int, int]
                          ) -> list[Point]:
    """Per job at the base (l_in, l_out): Σ steps − fitted τc, against m; model m·τp."""
    out = []
    for (name, m, li, lo, _), steps in _select(group_jobs(samples), lambda k: (k[2], k[3]) == base):
        f = _fit(fits, name)
        out.append(Point(name, m, sum(s.time_s for s in steps) - f.tau_c_s(lo), m * f.tau_p_s(li, lo)))
    return out


def prefill_vs_input(samples: Sequence[StepSample], fits: Mapping[str, ServerFit], num_blocks: int,
                     base_output: int) -> list[Point]:
    """Per prefill step on all L blocks (base l_out): step − r − s, against l_in; model L·(t_o + t_in·l_in)."""
    out = []
    for s in samples:
        if s.kind == "prefill" and s.blocks == num_blocks and s.output_tokens == base_output:
            f = _fit(fits, s.server)
            out.append(Point(s.server, s.tokens, s.time_s - f.round_trip_s - f.session_s,
                             s.blocks * (f.t_o_s + f.t_in_s * s.tokens)))
    return out


def decode_vs_output(samples: Sequence[StepSample], fits: Mapping[str, ServerFit], num_blocks: int,
                     base_input: int) -> list[Point]:
    """Per job on all L blocks (base l_in): Σ decode steps − (l_out − 1)·r, against l_out; model L·t_out·(l_out − 1)."""
    out = []
    for (name, m, li, lo, _), steps in _select(group_jobs(samples),
                                               lambda k: k[1] == num_blocks and k[2] == base_input):
        f = _fit(fits, name)
        dec = [s for s in steps if s.kind == "decode"]
        out.append(Point(name, lo, sum(s.time_s - f.round_trip_s for s in dec), m * f.t_out_s * len(dec)))
    return out


# ---- Fig 10: communication ---------------------------------------------------------------------------------------


def first_token_comm(samples: Sequence[StepSample], fits: Mapping[str, ServerFit], *, num_blocks: int, axis: str,
                     base: tuple[int, int], paper_model: bool = False) -> list[Point]:
    """Communication of the first token (prefill step − fitted prefill computation) on all L blocks, against
    ``axis`` ('input' or 'output' length, the other at its base); model r + s (fit) or RTT + 18 ms (paper)."""
    out = []
    for s in samples:
        if s.kind != "prefill" or s.blocks != num_blocks or not _on_axis(s, axis, base):
            continue
        f = _fit(fits, s.server)
        model = f.rtt_s + PER_TOKEN_OVERHEAD_S if paper_model else f.round_trip_s + f.session_s
        out.append(Point(s.server, _x(s, axis), s.time_s - s.blocks * (f.t_o_s + f.t_in_s * s.tokens), model))
    return out


def rest_comm(samples: Sequence[StepSample], fits: Mapping[str, ServerFit], *, num_blocks: int, axis: str,
              base: tuple[int, int], paper_model: bool = False) -> list[Point]:
    """Communication after the first token of a job (Σ decode steps − fitted decode computation) on all L
    blocks, against ``axis``; model (l_out − 1)·r (fit) or (l_out − 1)·(RTT + 18 ms) (paper)."""
    out = []
    for (name, m, li, lo, _), steps in _select(group_jobs(samples), lambda k: k[1] == num_blocks):
        first = steps[0]
        if not _on_axis(first, axis, base):
            continue
        f = _fit(fits, name)
        dec = [s for s in steps if s.kind == "decode"]
        per = f.rtt_s + PER_TOKEN_OVERHEAD_S if paper_model else f.round_trip_s
        out.append(Point(name, _x(first, axis), sum(s.time_s - m * f.t_out_s for s in dec), per * len(dec)))
    return out


def comm_vs_blocks(samples: Sequence[StepSample], fits: Mapping[str, ServerFit], base: tuple[int, int]
                   ) -> list[Point]:
    """Communication of a whole job at the base (l_in, l_out) against m (the paper: independent of m)."""
    out = []
    for (name, m, li, lo, _), steps in _select(group_jobs(samples), lambda k: (k[2], k[3]) == base):
        f = _fit(fits, name)
        comp = sum(m * (f.t_o_s + f.t_in_s * s.tokens) if s.kind == "prefill" else m * f.t_out_s for s in steps)
        out.append(Point(name, m, sum(s.time_s for s in steps) - comp, f.tau_c_s(lo)))
    return out


def _on_axis(s: StepSample, axis: str, base: tuple[int, int]) -> bool:
    """Whether a job varies only along ``axis`` (the other length at its base)."""
    if axis == "input":
        return s.output_tokens == base[1]
    if axis == "output":
        return s.input_tokens == base[0]
    raise SpecError(f"axis must be 'input' or 'output', got {axis!r}")


def _x(s: StepSample, axis: str) -> float:
    """The job's input or output length."""
    return float(s.input_tokens if axis == "input" else s.output_tokens)


def slope(points: Sequence[Point]) -> float:
    """Least-squares slope of the measured figure against x (s per unit of x)."""
    if len({p.x for p in points}) < 2:
        return math.nan
    return float(np.polyfit([p.x for p in points], [p.measured_s for p in points], 1)[0])


def line_r2(points: Sequence[Point]) -> float:
    """R² of a straight line through the measured figures against x (how linear the measurement is)."""
    if len({p.x for p in points}) < 2:
        return math.nan
    return float(np.corrcoef([p.x for p in points], [p.measured_s for p in points])[0, 1] ** 2)


def decode_comm_share(samples: Sequence[StepSample], fits: Mapping[str, ServerFit], num_blocks: int) -> float:
    """Fitted round trip over the mean measured decode step on all L blocks (how much of a step is communication)."""
    steps = [s for s in samples if s.kind == "decode" and s.blocks == num_blocks]
    if not steps:
        return math.nan
    return float(np.mean([fits[s.server].round_trip_s for s in steps]) / np.mean([s.time_s for s in steps]))


def kind_of(fits: Mapping[str, ServerFit]) -> dict[str, str]:
    """Server -> 'high end' (the fastest speed factor) or 'low end', for colouring by the slice it stands in for."""
    top = max(f.speed_factor for f in fits.values())
    return {n: "high end" if math.isclose(f.speed_factor, top) else "low end" for n, f in fits.items()}
