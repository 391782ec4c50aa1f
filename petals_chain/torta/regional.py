"""The macro layer over live regions: each slot, which region serves which origin's requests, and per request
the region chosen by TORTA (the plan), SkyLB-style (local first) or round robin.

docs/torta.md, "On the swarm: regions". The slot's plan is the simulator's own :func:`macro_plan` (OT from the
origins' forecast onto the regions' capacity minus queue) and, with a trained policy, the simulator's
observation and anchored policy; requests follow the plan by the simulator's stratified :class:`Router`.
Pure state over numpy arrays: the orchestrator feeds it counts and loads, it never does I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from petals_chain.torta.episode import Policy, Router, macro_plan, observation
from petals_chain.torta.params import DEFAULT, TortaParams
from petals_chain.torta.ppo import anchor_of, within_trust
from petals_chain.torta.transport import cost_matrix

POLICIES = ("torta", "skylb", "rr")
# The live layer takes ν = capacity minus queue, so that a region's queue moves its share (⚑ nu_total=False).
LIVE_PARAMS = DEFAULT.with_(nu_total=False)


class RegionError(ValueError):
    """A region, an origin or a latency matrix is malformed; the message names the field."""


@dataclass(frozen=True)
class RegionLoad:
    """What each region can do in one slot and what is waiting there (arrays indexed by region)."""

    capacity_per_slot: np.ndarray  # requests its chains finish in a slot: slot_s · Σ_k c_k / T_k
    queue: np.ndarray  # requests waiting in its FIFO queue
    free: np.ndarray  # slots free right now
    busy: np.ndarray  # slots held right now


def check_latency(latency_s: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """A square, finite, non-negative latency matrix matching ``names``; RegionError naming the field otherwise."""
    lat = np.asarray(latency_s, dtype=np.float64)
    n = len(names)
    if n < 1 or len(set(names)) != n:
        raise RegionError(f"regions: need one or more distinct names, got {list(names)}")
    if lat.shape != (n, n):
        raise RegionError(f"latency_s: shape {lat.shape} does not match {n} regions")
    if not np.isfinite(lat).all() or (lat < 0).any():
        raise RegionError("latency_s: entries must be finite and >= 0")
    return lat


def nearest(rtt_s: dict[str, float], names: Sequence[str]) -> str:
    """The region with the smallest measured round trip (how an origin or a server is placed from its RTTs)."""
    known = {k: v for k, v in rtt_s.items() if k in names}
    unknown = sorted(set(rtt_s) - set(names))
    if unknown:
        raise RegionError(f"rtt_s: unknown region {unknown[0]!r} (known: {', '.join(names)})")
    if not known:
        raise RegionError("rtt_s: needs at least one region's round trip")
    bad = [k for k, v in known.items() if not (np.isfinite(v) and v >= 0)]
    if bad:
        raise RegionError(f"rtt_s.{bad[0]}: must be a finite number >= 0, got {known[bad[0]]!r}")
    return min(known, key=lambda k: (known[k], names.index(k)))


def cluster_by_rtt(rtt_s: np.ndarray, regions: int) -> np.ndarray:
    """Group servers into ``regions`` regions from their pairwise RTT matrix (average-linkage clustering);
    returns a region label 0..regions−1 per server, numbered in order of first appearance."""
    from scipy.cluster.hierarchy import cut_tree, linkage
    from scipy.spatial.distance import squareform

    m = np.asarray(rtt_s, dtype=np.float64)
    if m.ndim != 2 or m.shape[0] != m.shape[1] or not np.isfinite(m).all() or (m < 0).any():
        raise RegionError("rtt_s: must be a square matrix of finite round trips >= 0")
    if not 1 <= regions <= m.shape[0]:
        raise RegionError(f"regions: must be in [1, {m.shape[0]}], got {regions}")
    if m.shape[0] == 1:
        return np.zeros(1, dtype=int)
    sym = (m + m.T) / 2
    np.fill_diagonal(sym, 0.0)
    raw = cut_tree(linkage(squareform(sym, checks=False), "average"), n_clusters=regions).ravel()
    order = {lab: i for i, lab in enumerate(dict.fromkeys(raw))}
    return np.array([order[x] for x in raw], dtype=int)


class RegionalMacro:
    """Per-slot plan A_t over live regions and the per-request region choice of each policy."""

    def __init__(self, names: Sequence[str], latency_s: np.ndarray, *, slot_s: float,
                 params: TortaParams = LIVE_PARAMS, price_per_kwh: np.ndarray | None = None,
                 policy: Policy | None = None, forecast_slots: int = 3) -> None:
        self.names = list(names)
        self.latency_s = check_latency(latency_s, self.names)
        if not slot_s > 0:
            raise RegionError(f"slot_s: must be > 0, got {slot_s}")
        if forecast_slots < 1:
            raise RegionError(f"forecast_slots: must be >= 1, got {forecast_slots}")
        n = len(self.names)
        price = np.zeros(n) if price_per_kwh is None else np.asarray(price_per_kwh, dtype=float)
        if price.shape != (n,):
            raise RegionError(f"price_per_kwh: needs {n} entries, got shape {price.shape}")
        self.slot_s, self.params, self.policy = float(slot_s), params, policy
        self.cost = cost_matrix(self.latency_s, price, params)
        self.nearest_order = np.argsort(self.latency_s, axis=1, kind="stable")
        self.history: deque[np.ndarray] = deque(maxlen=forecast_slots)
        self.counts = np.zeros(n)  # arrivals per origin in the current slot
        self.slot = 0
        self.plan = np.eye(n)  # A_t: before the first slot every origin stays at home
        self.prob = np.eye(n)
        self.router = Router(n)
        self._rr = 0

    def index(self, name: str, field: str = "region") -> int:
        """Index of a region name; RegionError naming ``field`` if unknown."""
        try:
            return self.names.index(name)
        except ValueError:
            raise RegionError(f"{field}: unknown region {name!r} (known: {', '.join(self.names)})") from None

    def forecast(self) -> np.ndarray:
        """F_t per origin: the mean arrivals of the last ``forecast_slots`` slots (⚑ the trained MLP predictor
        is per topology; live regions have no training history, so a moving average stands in)."""
        if not self.history:
            return np.zeros(len(self.names))
        return np.mean(np.stack(self.history), axis=0)

    def new_slot(self, load: RegionLoad) -> np.ndarray:
        """Close the current slot (its counts enter the history) and compute A_t for the next one."""
        self.history.append(self.counts)
        self.counts = np.zeros(len(self.names))
        self.slot += 1
        f = self.forecast()
        cap = np.asarray(load.capacity_per_slot, dtype=float)
        if not (cap > 0).any() or not f.sum() > 0:
            self.prob = np.eye(len(self.names))  # nothing to plan: every origin stays at home
            self.plan = self.prob
            return self.plan
        cap = np.maximum(cap, 1e-9)
        prob = macro_plan(f, cap, np.asarray(load.queue, dtype=float), self.cost, self.params)
        a_t = prob
        if self.policy is not None:
            total = np.maximum(load.free + load.busy, 1)
            obs = observation(load.busy / total, load.queue / cap, f, f.sum() / cap.sum(), self.slot,
                              86400.0 / self.slot_s, prob, self.plan)
            anchor = anchor_of(self.plan, prob, self.params)
            a_t = within_trust(self.policy(obs, anchor), anchor, self.params)
        self.prob, self.plan = prob, a_t
        return self.plan

    def choose(self, origin: int, policy: str, load: RegionLoad) -> int:
        """The region that serves the next request of ``origin`` under ``policy``; counts the arrival."""
        self.counts[origin] += 1
        if policy == "torta":
            return self.router.pick(origin, self.plan[origin])
        if policy == "skylb":  # a free local slot, else the nearest region with one, else the origin's queue
            for r in self.nearest_order[origin]:
                if load.free[r] > 0:
                    return int(r)
            return origin
        if policy == "rr":  # regions in turn, skipping those with no chain at all
            n = len(self.names)
            for k in range(n):
                r = (self._rr + k) % n
                if load.capacity_per_slot[r] > 0:
                    self._rr = (r + 1) % n
                    return r
            return origin
        raise RegionError(f"policy: unknown {policy!r} (known: {', '.join(POLICIES)})")
