"""Every tunable of the TORTA model in one place: the paper's stated values and our defaults for its open points.

Each field marked ⚑ is a choice the paper leaves open; docs/torta.md says why, section by section.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any


class TortaParamError(ValueError):
    """A TORTA parameter is out of range; the message names the field."""


@dataclass(frozen=True)
class GpuKind:
    """One GPU model: speed relative to an A100, memory, idle/peak power and the task type it suits."""

    name: str
    speed: float
    memory_bytes: float
    idle_w: float
    peak_w: float
    suits: int  # task type it matches (0 compute, 1 memory, 2 lightweight)
    count_range: tuple[int, int]  # system-wide count range of Table I(b)


# Table I(b) counts; speeds, memory and power are datasheet-level figures (⚑ speeds/power not in the paper)
GPU_KINDS: tuple[GpuKind, ...] = (
    GpuKind("A100", 1.0, 40e9, 60.0, 400.0, 0, (40, 60)),
    GpuKind("H100", 1.6, 80e9, 100.0, 700.0, 0, (20, 40)),
    GpuKind("RTX4090", 0.8, 24e9, 30.0, 450.0, 2, (40, 60)),
    GpuKind("V100", 0.6, 32e9, 40.0, 300.0, 1, (60, 80)),
    GpuKind("T4", 0.35, 16e9, 10.0, 70.0, 2, (40, 60)),
)

# Table I(a): diameter latency per topology (ms) that shortest-path km are scaled to (⚑ scaling rule)
OT_MODES = ("balanced", "sinkhorn", "unbalanced")  # docs/torta.md, "Macro layer: optimal transport"
LOAD_COUNTS = ("slot", "held")  # (9)'s load count, docs/torta.md, "Micro layer"

DIAMETER_MS = {"abilene": 25.0, "polska": 45.0, "gabriel25": 80.0, "cost266": 150.0}


@dataclass(frozen=True)
class TortaParams:
    """The model's parameters; ``with_(**kw)`` returns a checked copy with some overridden."""

    # time (§V-A): 480 slots of 45 s = 6 h
    slot_s: float = 45.0
    slots: int = 480
    # workload (⚑ processing time range, load, diurnal shape, surge)
    proc_min_s: float = 10.0
    proc_max_s: float = 25.0
    target_load: float = 0.5
    diurnal_amplitude: float = 0.5
    start_utc_h: float = 12.0
    # the diurnal factor's period: a day of 24 h; scaled() compresses it with the horizon, so that a short run spans
    # the same fraction of a day as the full one (docs/torta.md, "Quick and full settings")
    diurnal_period_s: float = 86400.0
    surge_factor: float = 2.5
    surge_start_slot: int = 240  # one surge, at a random origin, over slots [start, start + surge_slots) (⚑ time)
    surge_slots: int = 40
    n_models: int = 3
    model_switch_s: float = 5.6  # Fig 3: loading a model on a V100 (⚑ warm-cache speed-up not modelled)
    deadline_factor: float = 3.0
    # electricity price range, €/kWh (⚑ seeded draw; Eurostat non-household 2023-H2 min/max)
    price_min: float = 0.089
    price_max: float = 0.276
    # OT (2): C = w1·price + w2·(latency + bandwidth cost)
    ot_w1: float = 100.0
    ot_w2: float = 1.0
    ot_mode: str = "balanced"  # or "unbalanced" (⚑)
    # ν = capacity minus queue (⚑): with total capacity shares (True) a region's backlog never moves the plan, and
    # a forecast error piles requests on one region for the whole episode (docs/torta.md, "Why TORTA lagged SkyLB")
    nu_total: bool = False
    ot_sinkhorn_reg: float = 0.05  # ``ot_mode="sinkhorn"``: entropic weight on the per-column-relative cost (⚑)
    ot_unbalanced_reg: float = 0.05
    ot_unbalanced_tau: float = 0.5
    # predictor (§V-B)
    history_k: int = 5
    anchor_mix: float = 0.3  # η of the policy's anchor (1 − η)·A_{t−1} + η·Prob_t (⚑)
    # ⚑ decision-time bound on the policy's move away from its anchor, ‖A − anchor‖_F ≤ policy_trust (constraint (5)'s
    # ε enforced when acting; inf: off). A 15-episode policy overloaded one region on some seeds without it
    # (docs/torta.md, "Why TORTA lagged SkyLB")
    policy_trust: float = 0.15
    # reward (3) (⚑ λ1, λ2, Q_max)
    lambda1: float = 0.5
    lambda2: float = 0.5
    policy_hidden: tuple[int, ...] = (256, 512, 256)  # §V-B; --quick runs use a smaller trunk (⚑)
    # PPO (⚑ clip, γ, GAE, epochs, minibatch)
    lr: float = 3e-4
    lr_decay: float = 0.995
    lr_decay_every: int = 100
    clip: float = 0.2
    entropy_coef: float = 0.0
    # a slot's reward is dominated by its own action (OT distance, switching): a short horizon keeps the returns'
    # variance low enough for PPO to learn in tens of episodes (0.99 / 0.95 learned 3 %; docs/torta.md)
    gamma: float = 0.5
    gae: float = 0.9
    reward_norm: bool = False  # divide rewards by the running std of the discounted return (⚑ not in the paper)
    epochs: int = 10
    minibatch: int = 64
    rollouts_per_update: int = 1  # episodes collected (same policy) before each PPO update (⚑)
    # constrained loss (5) and Algorithm 2 (⚑ γ0, δ0, a_γ, a_δ, ε0, s0, E)
    eps_target: float = 0.15
    s_target: float = 2.5
    gamma0: float = 10.0  # L_ε's initial weight: with 1.0 the mean action ended 0.55 from Prob after 40 episodes
    delta0: float = 1.0
    a_gamma: float = 1.0
    a_delta: float = 1.0
    eps0: float = 0.15
    s0: float = 2.5
    s_update_every: int = 10
    alpha: float = 1.0
    beta: float = 1.0
    # micro layer (6)-(10) (⚑ σ, weights, λ of locality, slots per server)
    sigma: float = 1.5
    # (7)'s weights (⚑ unstated): load first, so that an idle server beats one running a task even when that one
    # served the same model a moment ago, w_load·(1 − e^(−1/2)) > w_locality; with 1/3 each load never overrode
    # locality (quick run: load balance 8–14 % below SkyLB's, now 3–10 %; docs/torta.md, "Load balance against SkyLB")
    w_hw: float = 0.2
    w_load: float = 0.6
    w_locality: float = 0.2
    locality_decay_per_s: float = 1.0 / 300
    server_slots: int = 2  # concurrent tasks per GPU (⚑)
    # (9)'s Util + Queue over Capacity (⚑): "slot" = tasks the server started this slot + tasks it holds, over the
    # tasks it finishes per slot (Algorithm 1 adds to Util[s] and Queue[s] with every task of the slot); "held" =
    # tasks it holds now over its lanes (docs/torta.md, "Micro layer")
    load_count: str = "slot"
    retry_s: float = 5.0  # buffered tasks are retried this often (⚑)
    min_active: int = 1
    # every server stays on for the first slots, until the predictor has history (⚑); scaled() keeps >= 1, as slot 0
    # has no history to size a pool on
    warm_start_slots: int = 5
    util_target: float = 0.8  # pool sizing aims at this utilisation, for every method (⚑)
    warmup_min_s: float = 60.0
    warmup_max_s: float = 180.0
    # baselines (⚑ SDIB weight; SkyLB max concurrency = server_slots)
    sdib_w: float = 0.5

    def __post_init__(self) -> None:
        for name in ("ot_w1", "ot_w2", "lambda1", "lambda2", "sigma"):
            if not getattr(self, name) >= 0:
                raise TortaParamError(f"{name}: must be >= 0, got {getattr(self, name)!r}")
        positive = ("slot_s", "proc_min_s", "target_load", "lr", "eps_target", "s_target",
                    "eps0", "s0", "policy_trust", "slots", "server_slots", "history_k", "minibatch", "epochs",
                    "rollouts_per_update")
        for name in positive:
            if not getattr(self, name) > 0:
                raise TortaParamError(f"{name}: must be > 0, got {getattr(self, name)!r}")
        if self.proc_max_s < self.proc_min_s:
            raise TortaParamError(f"proc_max_s: must be >= proc_min_s ({self.proc_min_s}), got {self.proc_max_s}")
        if self.load_count not in LOAD_COUNTS:
            raise TortaParamError(f"load_count: must be one of {', '.join(LOAD_COUNTS)}, got {self.load_count!r}")
        if self.ot_mode not in OT_MODES:
            raise TortaParamError(f"ot_mode: must be one of {', '.join(OT_MODES)}, got {self.ot_mode!r}")
        if not 0 <= self.diurnal_amplitude < 1:
            raise TortaParamError(f"diurnal_amplitude: must be in [0, 1), got {self.diurnal_amplitude}")
        if self.price_max < self.price_min or self.price_min <= 0:
            raise TortaParamError(f"price_max: need 0 < price_min <= price_max, got {self.price_min}, {self.price_max}")
        if not 0 < self.diurnal_period_s < math.inf:
            raise TortaParamError(f"diurnal_period_s: must be > 0 and finite, got {self.diurnal_period_s!r}")
        if self.surge_slots < 0 or self.surge_start_slot < 0 or self.warm_start_slots < 0:
            raise TortaParamError(f"surge_start_slot, surge_slots, warm_start_slots: must be >= 0, got "
                                  f"{self.surge_start_slot}, {self.surge_slots}, {self.warm_start_slots}")
        self.surge_window()  # the surge lies strictly inside the horizon (scaled() keeps it so)

    @property
    def slots_per_day(self) -> float:
        """Slots in one period of the diurnal cycle (the time-of-day features of the predictor and the policy)."""
        return self.diurnal_period_s / self.slot_s

    def surge_window(self, slots: int | None = None) -> tuple[int, int]:
        """The surge's slots [start, end) within a horizon of ``slots`` (default ``self.slots``), ValueError (one
        line) unless the surge starts and ends strictly inside it (no surge: (0, 0))."""
        slots = self.slots if slots is None else slots
        if self.surge_factor <= 1 or self.surge_slots == 0:
            return 0, 0
        start, end = self.surge_start_slot, self.surge_start_slot + self.surge_slots
        if not 0 < start < end < slots:
            raise TortaParamError(f"surge: slots [{start}, {end}) must lie strictly inside a horizon of {slots} slots")
        return start, end

    def with_(self, **overrides: Any) -> TortaParams:
        """A copy with ``overrides`` applied (TortaParamError for an unknown field)."""
        known = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TortaParamError(f"{unknown[0]}: unknown parameter")
        return replace(self, **overrides)


DEFAULT = TortaParams()
FULL_EPISODES = 150  # PPO episodes per policy of a full run (the paper's setting)
QUICK_EPISODES = 15  # of a --quick run
# --quick: the full day shrunk 15-fold, 32 of the full 480 slots (24 min of 6 h); see scaled()
QUICK_SCALE = 1 / 15


def scaled(params: TortaParams, scale: float) -> TortaParams:
    """``params`` on a horizon ``scale`` times as long, with the same shape of day: the slot length stays, while the
    horizon, the surge's start and length, the diurnal period and the warm start shrink (or grow) with it, so the
    surge and the daily cycle fall at the same relative times (docs/torta.md, "Quick and full settings").

    Counts are rounded to whole slots, and relative times kept against the rounded horizon (within half a slot; the
    surge and the warm start keep at least one slot); TortaParamError (one line)
    for a scale that is not a positive finite number or a horizon too short to hold the surge strictly inside it.
    """
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
        raise TortaParamError(f"scale: must be a positive finite number, got {scale!r}")
    slots = round(params.slots * scale)
    if slots < 1:
        raise TortaParamError(f"scale: {scale!r} leaves no slot of the {params.slots}-slot horizon")
    ratio = slots / params.slots  # the horizon's actual ratio, whole slots: relative times are kept against it
    start = round(params.surge_start_slot * ratio)
    surge = 0 if params.surge_slots == 0 else max(1, round((params.surge_start_slot + params.surge_slots) * ratio)
                                                   - start)
    warm = 0 if params.warm_start_slots == 0 else max(1, round(params.warm_start_slots * ratio))
    try:
        return params.with_(slots=slots, surge_start_slot=start, surge_slots=surge,
                            diurnal_period_s=params.diurnal_period_s * ratio, warm_start_slots=warm)
    except TortaParamError as exc:
        raise TortaParamError(f"scale {scale!r}: {slots} slots are too short to hold the surge ({exc})") from None


# ``train --quick``: a small trunk and 15 episodes, for which the paper's Adam 3e-4 barely moves the policy
# (mean reward +14 % on Abilene, seed 1); 1e-3 gives +44 % (⚑ quick runs only; the full settings keep 3e-4)
QUICK_TRAINING = DEFAULT.with_(policy_hidden=(64, 128, 64), epochs=4, lr=1e-3)
