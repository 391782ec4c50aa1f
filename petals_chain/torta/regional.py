"""The macro layer over live regions: each slot, which region serves which origin's requests, and per request
the region chosen by TORTA (the plan), SkyLB-style (local first) or round robin.

docs/torta.md, "On the swarm: regions". The slot's plan is the simulator's own :func:`macro_plan` (OT from the
origins' forecast onto the regions' capacity minus queue) and, with a trained policy, the simulator's
observation and anchored policy; requests follow the plan by the simulator's stratified :class:`Router`.
Pure state over numpy arrays: the orchestrator feeds it counts and loads, it never does I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from petals_chain.torta.episode import Policy, Router, macro_plan, observation
from petals_chain.torta.params import DEFAULT, TortaParams
from petals_chain.torta.ppo import anchor_of, within_trust
from petals_chain.torta.transport import cost_matrix

POLICIES = ("torta", "torta-ppo", "skylb", "rr")  # torta = the OT plan; torta-ppo = the plan a PPO policy refines
RTT_TIE_S = 1e-4  # round trips this close are equal when a server is placed by RTT
FORECAST_SLOTS = 3  # the live forecast is the mean arrivals of this many past slots
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


def moving_average(history: np.ndarray, regions: int) -> np.ndarray:
    """Mean arrivals per origin over the rows of ``history`` (slots × origins); zeros when it has none."""
    h = np.asarray(history, dtype=np.float64).reshape(-1, regions)
    return h.mean(0) if h.shape[0] else np.zeros(regions)


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


def rtt_vector(rtt_s: Mapping[str, float], names: Sequence[str]) -> np.ndarray:
    """A server's measured round trips to every region's anchor as a vector in region order; RegionError naming
    the field when a region is missing or unknown, or a value is not a finite number >= 0."""
    if not isinstance(rtt_s, Mapping):
        raise RegionError(f"rtt_s: must map region names to seconds, got {type(rtt_s).__name__}")
    unknown = sorted(set(rtt_s) - set(names))
    if unknown:
        raise RegionError(f"rtt_s: unknown region {unknown[0]!r} (known: {', '.join(names)})")
    missing = [n for n in names if n not in rtt_s]
    if missing:
        raise RegionError(f"rtt_s: needs a round trip to every region's anchor, missing {missing[0]!r}")
    for n in names:
        v = rtt_s[n]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (np.isfinite(v) and v >= 0):
            raise RegionError(f"rtt_s.{n}: must be a finite number >= 0, got {v!r}")
    return np.array([float(rtt_s[n]) for n in names])


def place_by_rtt(rtt: np.ndarray, anchor_rtt_s: np.ndarray, placed: Sequence[tuple[np.ndarray, int]] = ()) -> int:
    """The region of a server from its RTTs to the regions' anchors, by :func:`cluster_by_rtt` (docs/torta.md,
    "On the swarm: regions"): the anchors (their mutual RTTs ``anchor_rtt_s``), the servers placed by RTT before
    (``placed``: their RTT vectors and regions) and the new server are cut into as many clusters as regions; the
    new server takes the region with the most anchors and placed servers in its cluster, ties going to the smaller
    RTT, then to the region listed first; alone in its cluster, it takes the anchor of the smallest RTT (same ties).
    Round trips within ``RTT_TIE_S`` are equal; with no placed server in its cluster, a server as near to several
    anchors as to its cluster's goes to the region listed first of them (the linkage's own tie order is not used).
    Two servers' mutual RTT, which neither measured, is their shortest route through an anchor, min_r (rtt_i,r +
    rtt_j,r): an upper bound, so that servers never pull a newcomer toward a region they may be far from."""
    anchors = np.asarray(anchor_rtt_s, dtype=np.float64)
    n = anchors.shape[0]
    vecs = [np.asarray(v, dtype=np.float64) for v, _ in placed] + [np.asarray(rtt, dtype=np.float64)]
    m = np.zeros((n + len(vecs), n + len(vecs)))
    m[:n, :n] = anchors
    for i, v in enumerate(vecs):
        m[n + i, :n] = m[:n, n + i] = v
        for j, w in enumerate(vecs[:i]):
            m[n + i, n + j] = m[n + j, n + i] = (v + w).min()
    np.fill_diagonal(m, 0.0)
    labels = cluster_by_rtt(m, n)
    mine = labels[-1]
    votes = np.zeros(n)
    for a in range(n):
        votes[a] += labels[a] == mine
    peers = 0
    for k, (_, region) in enumerate(placed):
        votes[region] += labels[n + k] == mine
        peers += labels[n + k] == mine
    v = np.round(vecs[-1] / RTT_TIE_S)  # round trips within RTT_TIE_S are equal
    pool = np.arange(n) if not votes.any() else np.flatnonzero(votes == votes.max())
    best = min(pool, key=lambda r: (v[r], r))
    if not peers:  # anchors alone decide: the linkage breaks exact ties in its own order, this rule in region order
        best = int(np.flatnonzero(v == v[best])[0])
    return int(best)


class RegionalMacro:
    """Per-slot plan A_t over live regions and the per-request region choice of each policy."""

    def __init__(self, names: Sequence[str], latency_s: np.ndarray, *, slot_s: float,
                 params: TortaParams = LIVE_PARAMS, price_per_kwh: np.ndarray | None = None,
                 policy: Policy | None = None, forecast_slots: int = FORECAST_SLOTS) -> None:
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
        self.plan = np.eye(n)  # A_t of TORTA-OT (= Prob_t): before the first slot every origin stays at home
        self.prob = self.plan
        self.ppo_plan = np.eye(n)  # A_t of TORTA-PPO (the policy's refinement; without a policy, Prob_t)
        self.router, self.ppo_router = Router(n), Router(n)
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
        return moving_average(np.array(self.history), len(self.names))

    def new_slot(self, load: RegionLoad) -> np.ndarray:
        """Close the current slot (its counts enter the history), compute A_t for the next one (the OT plan; the
        policy's refinement goes to ``ppo_plan``) and return the OT plan."""
        self.history.append(self.counts)
        self.counts = np.zeros(len(self.names))
        self.slot += 1
        f = self.forecast()
        cap = np.asarray(load.capacity_per_slot, dtype=float)
        if not (cap > 0).any() or not f.sum() > 0:
            self.prob = np.eye(len(self.names))  # nothing to plan: every origin stays at home
            self.plan = self.ppo_plan = self.prob
            return self.plan
        cap = np.maximum(cap, 1e-9)
        prob = macro_plan(f, cap, np.asarray(load.queue, dtype=float), self.cost, self.params)
        a_t = prob
        if self.policy is not None:
            total = np.maximum(load.free + load.busy, 1)
            obs = observation(load.busy / total, load.queue / cap, f, f.sum() / cap.sum(), self.slot,
                              86400.0 / self.slot_s, prob, self.ppo_plan)
            anchor = anchor_of(self.ppo_plan, prob, self.params)
            a_t = within_trust(self.policy(obs, anchor), anchor, self.params)
        self.prob = self.plan = prob
        self.ppo_plan = a_t
        return self.plan

    def choose(self, origin: int, policy: str, load: RegionLoad) -> int:
        """The region that serves the next request of ``origin`` under ``policy``; counts the arrival."""
        self.counts[origin] += 1
        if policy == "torta":
            return self.router.pick(origin, self.plan[origin])
        if policy == "torta-ppo":
            return self.ppo_router.pick(origin, self.ppo_plan[origin])
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
