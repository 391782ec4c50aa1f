"""Arrivals of a TORTA scenario: the Azure LLM 2023 traces tiled to the horizon, spread over origin regions.

docs/torta.md, "Workload": per slot, the trace's request count (scaled to the target load) is split over
origins by demand share × a diurnal factor of local time (longitude / 15 h), plus one surge at a random origin, at
the same relative time of every horizon (docs/torta.md, "Quick and full settings").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from petals_chain.data import data_dir
from petals_chain.data.azure import CODE_TRACE, CONVERSATION_TRACE, read_azure_trace
from petals_chain.torta.params import GPU_KINDS, TortaParams
from petals_chain.torta.topology import Regions

TASK_TYPES = ("compute", "memory", "lightweight")
COMPUTE_NEED = np.array([1.0, 0.6, 0.3])  # c_i in A100 units per type (⚑)
MEMORY_NEED_BYTES = np.array([20e9, 30e9, 8e9])  # m_i per type (⚑)


@dataclass(frozen=True)
class Tasks:
    """All tasks of an episode, in arrival order (arrays of equal length)."""

    arrival_s: np.ndarray
    slot: np.ndarray
    origin: np.ndarray
    kind: np.ndarray  # task type index into TASK_TYPES
    model: np.ndarray
    work_s: np.ndarray  # processing time on an A100
    deadline_s: np.ndarray

    @property
    def n(self) -> int:
        return int(self.arrival_s.size)

    def counts(self, slots: int, regions: int) -> np.ndarray:
        """(slots, regions) arrivals per slot per origin."""
        out = np.zeros((slots, regions), dtype=np.int64)
        np.add.at(out, (self.slot, self.origin), 1)
        return out


def trace_rate_per_slot(slot_s: float, slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Both Azure traces merged and tiled over ``slots``: requests per slot, and the token pools to draw from."""
    folder = data_dir()
    traces = [read_azure_trace(folder / f) for f in (CONVERSATION_TRACE, CODE_TRACE)]
    period_s = max(t.arrival_s[-1] for t in traces) + 1.0
    times = np.concatenate([t.arrival_s for t in traces])
    horizon_s = slot_s * slots
    reps = int(np.ceil(horizon_s / period_s))
    tiled = (times[None, :] + period_s * np.arange(reps)[:, None]).ravel()
    counts = np.bincount((tiled[tiled < horizon_s] // slot_s).astype(np.int64), minlength=slots)[:slots]
    ins = np.concatenate([t.input_tokens for t in traces])
    outs = np.concatenate([t.output_tokens for t in traces])
    return counts.astype(float), ins, outs


def system_capacity_per_slot(regions: Regions, params: TortaParams) -> float:
    """Tasks the whole system finishes per slot with every server on, all lanes busy (mean A100 work time)."""
    speed = np.array([GPU_KINDS[k].speed for k in regions.server_kind])
    return float(speed.sum() * params.slot_s * params.server_slots / (0.5 * (params.proc_min_s + params.proc_max_s)))


def origin_weights(regions: Regions, params: TortaParams, slots: int, rng: np.random.Generator) -> np.ndarray:
    """(slots, R) relative request intensity per origin: demand share × diurnal(local time) × surge.

    The day runs ``diurnal_period_s`` long (24 h in the full setting, compressed with the horizon by
    :func:`~petals_chain.torta.params.scaled`); the surge hits one random origin over ``params.surge_window()``, the
    same slots in every episode. A horizon shorter than ``params.slots`` is the first ``slots`` of that day.
    """
    t_h = params.start_utc_h + np.arange(slots) * 24.0 / params.slots_per_day
    local_h = t_h[:, None] + regions.longitude_deg[None, :] / 15.0
    diurnal = 1.0 + params.diurnal_amplitude * np.sin(2 * np.pi * (local_h - 9.0) / 24.0)
    w = regions.demand_share[None, :] * diurnal
    start, end = params.surge_window()
    if end > start:
        r = rng.choice(regions.n_regions, p=regions.demand_share)
        w[start:end, r] *= params.surge_factor
    return w


def make_tasks(regions: Regions, params: TortaParams, rng: np.random.Generator, slots: int | None = None) -> Tasks:
    """Draw an episode's tasks: counts follow the tiled trace scaled to ``target_load``, origins the weights."""
    slots = slots or params.slots
    counts, ins, outs = trace_rate_per_slot(params.slot_s, slots)
    w = origin_weights(regions, params, slots, rng)
    scale = params.target_load * system_capacity_per_slot(regions, params) / counts.mean()
    per_slot = rng.poisson(counts * scale * w.sum(1) / w.sum(1).mean())
    slot = np.repeat(np.arange(slots), per_slot)
    n = slot.size
    probs = w / w.sum(1, keepdims=True)
    cum = probs.cumsum(1)[slot]
    origin = np.minimum((cum < rng.random(n)[:, None]).sum(1), regions.n_regions - 1)
    arrival = (slot + rng.random(n)) * params.slot_s
    order = np.argsort(arrival, kind="stable")
    pick = rng.integers(0, ins.size, size=n)
    i_tok, o_tok = ins[pick], outs[pick]
    # type from the trace's tokens: long prompts → memory, long outputs → compute, else lightweight (⚑)
    kind = np.where(i_tok > np.quantile(ins, 0.7), 1, np.where(o_tok > np.quantile(outs, 0.6), 0, 2))
    work = rng.uniform(params.proc_min_s, params.proc_max_s, size=n)
    model = rng.integers(0, params.n_models, size=n)
    arrival, slot, origin = arrival[order], slot[order], origin[order]
    kind, work, model = kind[order], work[order], model[order]
    return Tasks(arrival, slot, origin, kind, model, work, arrival + params.deadline_factor * work)
