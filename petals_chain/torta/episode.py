"""One simulated episode of a method on a scenario: the per-slot macro decision, pool sizing and dispatch.

docs/torta.md, "Simulator" and "Methods". Every method runs on the same :class:`Scenario` (same tasks, same
servers, same warm-ups), so differences come from the decisions alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from petals_chain.torta import baselines
from petals_chain.torta.cluster_sim import Cluster, Scenario
from petals_chain.torta.metrics import horizon_load_balance, slot_load_balance, switching_cost
from petals_chain.torta.micro import pool_target, reactive_target
from petals_chain.torta.params import TortaParams
from petals_chain.torta.ppo import anchor_of, within_trust
from petals_chain.torta.topology import load_regions
from petals_chain.torta.transport import cost_matrix, ot_plan, row_normalise
from petals_chain.torta.workload import make_tasks

# OT-unbalanced: the OT-only ablation with the relaxed-capacity plan (the price term can move mass; docs/torta.md)
MACRO_METHODS = ("TORTA", "OT-only", "OT-unbalanced", "RL-no-OT")
BASELINES = {"SkyLB": baselines.skylb, "SDIB": baselines.sdib, "RR": baselines.round_robin}
METHODS = MACRO_METHODS + tuple(BASELINES)
DRAIN_SLOTS = 48
Forecast = Callable[[np.ndarray, int], np.ndarray]
Policy = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (observation, anchor) -> A_t


def make_scenario(topology: str, params: TortaParams, seed: int, slots: int | None = None,
                  arrivals_seed: int | None = None) -> Scenario:
    """The seeded scenario: regions (GPUs, prices), tasks and warm-ups from one SeedSequence; with
    ``arrivals_seed`` the same system (regions, GPUs, prices, warm-ups) sees the arrivals of that other seed."""
    s_reg, s_tasks, s_warm = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))
    if arrivals_seed is not None:
        s_tasks = np.random.default_rng(np.random.SeedSequence(arrivals_seed).spawn(3)[1])
    slots = slots or params.slots
    regions = load_regions(topology, params, s_reg)
    tasks = make_tasks(regions, params, s_tasks, slots)
    warm = s_warm.uniform(params.warmup_min_s, params.warmup_max_s, size=regions.n_servers)
    return Scenario(regions, tasks, warm, params, slots)


def observation(util: np.ndarray, queue_ratio: np.ndarray, forecast: np.ndarray, load_ratio: float, t: int,
                slots_per_day: float, prob: np.ndarray, a_prev: np.ndarray) -> np.ndarray:
    """The MDP state s_t as one vector: U, Q/capacity, forecast shares, load, time of day, Prob, A_{t−1}."""
    f = forecast / max(forecast.sum(), 1e-9)
    ang = 2 * np.pi * t / slots_per_day
    return np.concatenate([util, np.minimum(queue_ratio, 5.0), f, [load_ratio, np.sin(ang), np.cos(ang)],
                           prob.ravel(), a_prev.ravel()]).astype(np.float32)


def macro_plan(forecast: np.ndarray, capacity: np.ndarray, queue: np.ndarray, cost: np.ndarray,
               params: TortaParams) -> np.ndarray:
    """Prob_t: row-normalised OT plan from forecast origin shares onto residual capacity shares."""
    nu = capacity if params.nu_total else residual_capacity(capacity, queue, float(forecast.sum()))
    return row_normalise(ot_plan(forecast + 1e-6 * capacity.mean(), nu, cost, params))


def residual_capacity(capacity: np.ndarray, queue: np.ndarray, demand: float) -> np.ndarray:
    """ν with ``nu_total=False``: what each region can take of ``demand`` once its queue is served, water-filled so
    that every region that gets work ends at the same backlog per capacity, ν_r = max(0, c_r·L − Q_r) with
    Σ ν_r = demand (⚑; the former ``max(0.05·c, c − Q)`` flattened to capacity shares once every queue exceeded one
    slot's capacity). A 1e−9·c floor keeps every column in the plan, below μ's 1e−6 floor, so that an origin
    with no forecast is planned onto residual capacity too."""
    c = np.maximum(np.asarray(capacity, dtype=np.float64), 1e-12)
    q = np.maximum(np.asarray(queue, dtype=np.float64), 0.0)
    demand = max(demand, 1e-9 * c.sum())
    level = q / c  # L at which region r starts taking work; fill regions in that order
    order = np.argsort(level, kind="stable")
    for k in range(1, c.size + 1):
        head = order[:k]
        fill = (demand + q[head].sum()) / c[head].sum()
        if k == c.size or fill <= level[order[k]]:
            break
    return np.maximum(c * fill - q, 0.0) + 1e-9 * c


class Router:
    """Stratified draw of each task's region from A_t[origin] (credits: the row's largest accumulated share)."""

    def __init__(self, regions: int) -> None:
        self.credit = np.zeros((regions, regions))

    def pick(self, origin: int, row: np.ndarray) -> int:
        """Region for the next task of ``origin`` under allocation row ``row``."""
        c = self.credit[origin]
        c += row
        r = int(c.argmax())
        c[r] -= 1.0
        return r


@dataclass
class EpisodeResult:
    """Per-task times and the episode's aggregate metrics."""

    metrics: dict[str, float]
    wait_s: np.ndarray
    response_s: np.ndarray
    cluster: Cluster
    on_slot: np.ndarray  # (servers, slots): on for the whole slot, the servers load balance (11) counts


def run_episode(sc: Scenario, method: str, forecast: Forecast, policy: Policy | None = None) -> EpisodeResult:
    """Simulate ``method`` over the scenario's slots (plus a drain) and return its metrics."""
    if method not in METHODS:
        raise ValueError(f"method: unknown {method!r}; known: {', '.join(METHODS)}")
    if method in ("TORTA", "RL-no-OT") and policy is None:
        raise ValueError(f"policy: method {method} needs a trained policy")
    p, reg, tasks = sc.params, sc.regions, sc.tasks
    c = Cluster(sc)
    n_r, dt = reg.n_regions, p.slot_s
    spd = p.slots_per_day
    counts = tasks.counts(sc.slots, n_r)
    bounds = np.searchsorted(tasks.slot, np.arange(sc.slots + 1))
    cost = cost_matrix(reg.latency_s, reg.price_per_kwh, p)
    sizes = reg.servers_per_region()
    router = Router(n_r)
    a_prev = np.full((n_r, n_r), 1.0 / n_r)
    emp_prev = np.eye(n_r)
    routed_last = np.zeros(n_r)
    switching, macro_a_switch = [], []
    on_slot = np.zeros((reg.n_servers, sc.slots), dtype=bool)  # on for the whole slot (switch-offs: slot starts)
    is_macro = method in MACRO_METHODS
    for t in range(sc.slots + DRAIN_SLOTS):
        now = t * dt
        util_prev = c.utilisation(t - 1) if t > 0 else np.zeros(reg.n_servers)
        queue = c.region_queue(now)
        a_t = None
        if is_macro:
            f = forecast(counts, t) if t < sc.slots else np.zeros(n_r)
            prob = macro_plan(f, c.cap_region, queue, cost, p)
            if method == "OT-only":
                a_t = prob
            elif method == "OT-unbalanced":
                a_t = macro_plan(f, c.cap_region, queue, cost, p.with_(ot_mode="unbalanced"))
            else:
                on = np.isfinite(c.ready_at)
                ureg = np.bincount(c.region, weights=util_prev, minlength=n_r) / np.maximum(
                    1, np.bincount(c.region, weights=on, minlength=n_r))
                obs = observation(ureg, queue / c.cap_region, f, f.sum() / c.cap_region.sum(), t, spd, prob, a_prev)
                anchor = anchor_of(a_prev, prob, p)
                a_t = policy(obs, anchor)
                if method == "TORTA":  # RL-no-OT has no anchor to stay near
                    a_t = within_trust(a_t, anchor, p)
            macro_a_switch.append(switching_cost(a_t, a_prev))
            inflow = f @ a_t
            for r in range(n_r) if t >= p.warm_start_slots else ():
                c.resize(r, pool_target(queue[r], inflow[r], int(sizes[r]), c.per_server[r] * p.util_target, p), now,
                         util_prev)
            a_prev = a_t
        else:
            for r in range(n_r) if t >= p.warm_start_slots else ():
                c.resize(r, reactive_target(routed_last[r] + queue[r], int(sizes[r]), c.per_server[r] * p.util_target,
                                            p), now, util_prev)
        c.charge_idle(now)
        c.on_servers = np.flatnonzero(c.ready_at <= now)
        routed = np.zeros((n_r, n_r))
        _retry(c, method, now)
        next_retry = now + p.retry_s
        lo, hi = (bounds[t], bounds[t + 1]) if t < sc.slots else (0, 0)
        for i in range(lo, hi):
            while tasks.arrival_s[i] >= next_retry:
                _retry(c, method, next_retry)
                next_retry += p.retry_s
            o = int(tasks.origin[i])
            r = router.pick(o, a_t[o]) if is_macro else -1
            got = _dispatch(c, method, i, float(tasks.arrival_s[i]), r)
            routed[o, got if got >= 0 else -got - 1] += 1
        routed_last = routed.sum(0)
        if t < sc.slots:
            rows = routed.sum(1, keepdims=True)
            emp = np.where(rows > 0, routed / np.maximum(rows, 1), emp_prev)
            if t > 0:
                switching.append(switching_cost(emp, emp_prev))
            emp_prev = emp
            on_slot[c.on_servers, t] = True
    done = ~np.isnan(c.wait_s)
    util = c.utilisation(slice(0, sc.slots))
    resp = c.wait_s + c.service_s + c.network_s
    metrics = {"mean_response_s": float(np.nanmean(resp)), "p95_response_s": float(np.nanpercentile(resp, 95)),
               "mean_wait_s": float(np.nanmean(c.wait_s)), "mean_service_s": float(np.nanmean(c.service_s)),
               "mean_network_s": float(np.nanmean(c.network_s)), "power_cost": c.cost,
               "switching": float(np.mean(switching)), "load_balance": slot_load_balance(util, on_slot),
               "load_balance_horizon": horizon_load_balance(util, on_slot),
               "activations": float(c.activations), "unserved": float((~done).sum()), "tasks": float(tasks.n),
               "macro_switching": float(np.mean(macro_a_switch)) if macro_a_switch else float("nan")}
    return EpisodeResult(metrics, c.wait_s, resp, c, on_slot)


def _retry(c: Cluster, method: str, now_s: float) -> None:
    """Offer every buffered task again at ``now_s``, most urgent first; those that still fit nowhere stay."""
    if not any(c.buffers):
        return
    pending = [(r, i) for r, b in enumerate(c.buffers) for i in b]
    c.buffers = [[] for _ in c.buffers]
    pending.sort(key=lambda x: c.sc.tasks.deadline_s[x[1]])
    full: set[int] = set()
    stop = False
    for r, i in pending:
        # a baseline that failed once finds nothing anywhere; a macro method's region that failed stays full
        if stop or r in full:
            c.buffers[r].append(i)
            continue
        if _dispatch(c, method, i, now_s, r, grow=False) < 0:
            stop = method not in MACRO_METHODS
            full.add(r)


def _dispatch(c: Cluster, method: str, i: int, now_s: float, region: int, grow: bool = True) -> int:
    """Place task i (at ``now_s``) by ``method``; buffer it if nothing fits. Returns the region decided, or −1
    −(region + 1) if buffered. A macro method's region whose buffer outgrows its warming servers' lanes
    switches one more server on (§V-C: full buffer ⇒ activate)."""
    if method in MACRO_METHODS:
        s = baselines.greedy_in_region(c, i, region, now_s)
        buf = region
    else:
        s, buf = BASELINES[method](c, i, now_s)
    if s < 0:
        c.buffers[buf].append(i)
        if grow and method in MACRO_METHODS:
            c.grow_if_buffer_full(buf, now_s)
        return -(buf + 1)
    c.assign(i, s, now_s)
    return int(c.region[s])


def oracle_forecast(counts: np.ndarray, t: int) -> np.ndarray:
    """The actual arrivals of slot t (a perfect forecast)."""
    return counts[t].astype(float)
