"""Time-stepped simulator of KV-cache packing (docs/mell.md, "Simulator").

Each slot is ``tokens_per_slot`` decode steps: every running request's KV grows by that many tokens (one per
step) until its output is done; arrivals enter with their prompt's KV (prefill); the scheduler's moves are
split by the adaptive division into KV transfers and token replays, and a moved request stalls (does not
decode) for its transfer or re-prefill time. While it moves it holds its KV on both GPUs: the source stays
active and holds the copy until the transfer or replay ends (``SimConfig.charge_migration_memory``). Records
GPUs, utilisation and migrations (requests moved and scheduler moves) per slot.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from tqdm import tqdm

from petals_chain.mell.hybrid import RULES, Budgets, Mode, Speeds, hybrid_divide, machine_path
from petals_chain.mell.scheduler import PAPER_OPS
from petals_chain.mell.state import item_moves
from petals_chain.mell.workloads import Workload


@dataclass(frozen=True)
class SimConfig:
    """The simulated cluster: capacity, time per decode step, and migration costs (profiled figures [R])."""

    capacity_tokens: int
    kv_bytes_per_token: int
    tpot_s: float = 0.03
    tokens_per_slot: int = 10
    gpus_per_machine: int = 8
    intra_bytes_per_s: float = 25e9  # PCIe 4.0 x16
    inter_bytes_per_s: float = 1.25e9  # 10 Gbit/s
    prefill_tokens_per_s: float = 8000.0
    transfer_limit_s: float = 2.0  # a KV transfer must end within this (the communication boundary)
    prefill_limit_s: float = 0.5  # migration prefill per epoch that does not disturb the batch
    division_rule: str = "first"  # how hybrid_divide picks a move's mode (mell.hybrid.RULES)
    charge_migration_memory: bool = True  # a moving request holds its KV on source and destination until done

    def __post_init__(self) -> None:
        for name in ("capacity_tokens", "kv_bytes_per_token", "tpot_s", "tokens_per_slot", "gpus_per_machine",
                     "intra_bytes_per_s", "inter_bytes_per_s", "prefill_tokens_per_s", "transfer_limit_s",
                     "prefill_limit_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SimConfig.{name} must be > 0, got {getattr(self, name)!r}")
        if self.division_rule not in RULES:
            raise ValueError(f"SimConfig.division_rule must be one of {RULES}, got {self.division_rule!r}")

    @property
    def slot_s(self) -> float:
        return self.tpot_s * self.tokens_per_slot


@dataclass
class SimResult:
    """Per-slot series and totals of one run."""

    name: str
    slot_s: float
    gpus: np.ndarray
    used_tokens: np.ndarray
    capacity_tokens: int
    migrations: int
    migrations_raw: int
    preemptions: int
    completed: int
    stall_s: float
    modes: dict[str, int] = field(default_factory=dict)
    max_moves_per_op: int = 0  # requests moved by one Allocate/Depart/Update (the paper's operations)
    window: tuple[int, int] = (0, 0)
    item_migrations: int = 0  # scheduler moves executed (a multi-item counts once)
    sweep_migrations: int = 0  # requests moved by the end-of-slot sweep alone (ours, not the paper's)
    sweep_item_migrations: int = 0
    max_item_moves_per_op: int = 0  # scheduler moves of one Allocate/Depart/Update (Theorem 3's count)
    copy_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # in-flight source copies
    overfull_gpu_slots: int = 0  # (GPU, slot) pairs where the scheduler's tokens plus copies exceed C
    moves_by_kind: dict[str, int] = field(default_factory=dict)  # requests moved per operation kind, before netting

    @property
    def peak_gpus(self) -> int:
        """Eq. (3): the most GPUs active in any slot."""
        return int(self.gpus.max(initial=0))

    @property
    def mean_gpus(self) -> float:
        a, b = self.window
        return float(self.gpus[a:b].mean()) if b > a else float("nan")

    @property
    def utilisation(self) -> float:
        """Time-average share of the active GPUs' KV capacity in use, over the measurement window."""
        a, b = self.window
        g = self.gpus[a:b]
        ok = g > 0
        return float(np.mean(self.used_tokens[a:b][ok] / (g[ok] * self.capacity_tokens))) if ok.any() else math.nan

    @property
    def migrations_per_s(self) -> float:
        """Requests moved per second over the window."""
        return self.migrations / self._span_s

    @property
    def item_migrations_per_s(self) -> float:
        """Scheduler moves per second over the window."""
        return self.item_migrations / self._span_s

    @property
    def paper_migrations_per_s(self) -> float:
        """Requests moved per second without the sweep's moves (the paper has no sweep)."""
        return (self.migrations - self.sweep_migrations) / self._span_s

    @property
    def _span_s(self) -> float:
        return max(self.window[1] - self.window[0], 1) * self.slot_s


def link_bytes_per_s(cfg: SimConfig, src: int, dst: int) -> float:
    """Bandwidth of the path between two GPUs (PCIe inside a machine, the NIC across machines)."""
    return cfg.intra_bytes_per_s if src // cfg.gpus_per_machine == dst // cfg.gpus_per_machine \
        else cfg.inter_bytes_per_s


def simulate(scheduler, workload: Workload, cfg: SimConfig, *, progress: bool = False,
             warmup_frac: float = 0.1, max_slots: int | None = None) -> SimResult:
    """Run ``scheduler`` (Mell or a baseline, same ``step`` API) on ``workload`` until every request finishes."""
    if scheduler.C != cfg.capacity_tokens:
        raise ValueError(f"scheduler capacity {scheduler.C} != SimConfig.capacity_tokens {cfg.capacity_tokens}")
    if np.any(workload.prompt_tokens + workload.output_tokens > cfg.capacity_tokens):
        raise ValueError("workload: a request's prompt + output exceeds the capacity (cap it in build_workload)")
    slot_s, k = cfg.slot_s, cfg.tokens_per_slot
    arr_slot = np.floor(workload.arrival_s / slot_s).astype(np.int64)
    last_arrival = int(arr_slot.max()) if workload.n else 0
    size: dict[int, int] = {}
    left: dict[int, int] = {}
    stall: dict[int, int] = {}
    gpus, used = [], []
    nxt = 0
    migrations = raw = preempt = completed = items = swept = swept_items = 0
    inflight: list[tuple[int, int, int]] = []  # (first slot no longer held, request, source GPU)
    copies_series: list[int] = []
    overfull = 0
    stall_s = 0.0
    modes = {m.value: 0 for m in Mode}
    max_op = max_item_op = 0
    by_kind: dict[str, int] = {}
    path = machine_path(cfg.gpus_per_machine)
    t = 0
    bar = tqdm(total=workload.n, desc=f"sim {scheduler.name}", unit="req", disable=not progress, leave=False)
    while nxt < workload.n or size:
        if max_slots is not None and t >= max_slots:
            break
        departures = [r for r, x in left.items() if x <= 0]
        for r in departures:
            del size[r], left[r]
            stall.pop(r, None)
        completed += len(departures)
        growth = {}
        for r in size:
            if stall.get(r, 0) > 0:
                stall[r] -= 1
                continue
            g = min(k, left[r])
            if g:
                size[r] += g
                left[r] -= g
                growth[r] = size[r]
        arrivals = {}
        while nxt < workload.n and arr_slot[nxt] <= t:
            arrivals[nxt] = int(workload.prompt_tokens[nxt])
            size[nxt] = arrivals[nxt]
            left[nxt] = int(workload.output_tokens[nxt])
            nxt += 1
        bar.update(len(arrivals))
        final = {r: s + int(workload.output_tokens[r]) for r, s in arrivals.items()}
        res = scheduler.step(arrivals, departures, growth, final)
        for r in res.preempted:  # recompute: the request re-prefills its whole cache before decoding again
            cost = size[r] / cfg.prefill_tokens_per_s
            stall[r] = stall.get(r, 0) + math.ceil(cost / slot_s)
            stall_s += cost
        migrations += len(res.moves)
        raw += res.raw_moves
        preempt += res.preemptions
        items += item_moves(res.moves)
        swept += sum(mv.sweep for mv in res.moves)
        swept_items += item_moves([mv for mv in res.moves if mv.sweep])
        for o in res.ops:
            by_kind[o.kind] = by_kind.get(o.kind, 0) + o.moves
        paper_ops = [o for o in res.ops if o.kind in PAPER_OPS]
        max_op = max(max_op, max((o.moves for o in paper_ops), default=0))
        max_item_op = max(max_item_op, max((o.item_moves for o in paper_ops), default=0))
        if res.moves:
            bud = _slot_budgets(cfg, res.moves, path)
            speeds = Speeds({lnk: _link_rate(cfg, lnk) for lnk in bud.link_bytes}, {},
                            default_prefill_tokens_per_s=cfg.prefill_tokens_per_s)
            div = hybrid_divide(res.moves, cfg.kv_bytes_per_token, bud, path, cfg.division_rule, speeds)
            for mv, mode in zip(res.moves, div.modes):
                modes[mode.value] += 1
                kv_s = mv.size_tokens * cfg.kv_bytes_per_token / link_bytes_per_s(cfg, mv.src, mv.dst)
                cost = {Mode.KV: kv_s, Mode.TOKEN: mv.size_tokens / cfg.prefill_tokens_per_s,
                        Mode.DEFER: slot_s + kv_s}[mode]
                held = math.ceil(cost / slot_s)
                stall[mv.request] = stall.get(mv.request, 0) + held
                stall_s += cost
                if cfg.charge_migration_memory and held > 0:
                    inflight.append((t + held, mv.request, mv.src))
        inflight = [x for x in inflight if x[0] > t and x[1] in size]
        copies: dict[int, int] = {}
        for _, r, src in inflight:
            copies[src] = copies.get(src, 0) + size[r]
        active = scheduler.st.gpus
        overfull += sum(1 for g, c in copies.items() if g in active and active[g].used + c > cfg.capacity_tokens)
        gpus.append(len(active) + sum(1 for g in copies if g not in active))
        copies_series.append(sum(copies.values()))
        used.append(sum(size.values()) + copies_series[-1])
        t += 1
    bar.close()
    window = (int(warmup_frac * last_arrival), last_arrival + 1)
    return SimResult(scheduler.name, slot_s, np.asarray(gpus), np.asarray(used), cfg.capacity_tokens, migrations,
                     raw, preempt, completed, stall_s, modes, max_op, window, items, swept, swept_items, max_item_op,
                     np.asarray(copies_series, dtype=np.int64), overfull, by_kind)


def _link_rate(cfg: SimConfig, link: str) -> float:
    """Bytes per second of a link named by ``machine_path``."""
    return cfg.intra_bytes_per_s if link.startswith("pcie") else cfg.inter_bytes_per_s


def _slot_budgets(cfg: SimConfig, moves, path) -> Budgets:
    """This slot's boundaries: each link carries what it moves within the transfer limit; prefill per GPU."""
    links = {lnk for mv in moves for lnk in path(mv.src, mv.dst)}
    per = {lnk: _link_rate(cfg, lnk) * cfg.transfer_limit_s for lnk in links}
    return Budgets(per, {}, default_prefill_tokens=int(cfg.prefill_tokens_per_s * cfg.prefill_limit_s))
