"""The route graph of a placement: its feasible-edge DAG as arrays, for per-request routing.

Systems that pick a path per request (PETALS' client routing and BPRR's WS-RR,
in the simulator and in the live orchestrator alike) route over the same graph
(docs/model.md, "Placement and chains"): a hop at server j covers blocks p .. a_j+m_j-1, m_ij = a_j+m_j-p
blocks, and is feasible only if m_ij ≤ M̃_j, the server's cache slots (eq. 3).
The shortest path itself is :func:`petals_chain.compose.paths.route_dp`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from petals_chain.compose.capacity import cache_slots
from petals_chain.compose.paths import group_by_end, route_dp
from petals_chain.model import InfeasibleError, ModelSpec, Placement, ServerSpec, SpecError, validate_servers

Route = tuple[tuple[int, int], ...]  # ((server index, blocks processed there), ...) in block order


@dataclass(frozen=True)
class RouteGraph:
    """The feasible-edge DAG of a placement as arrays (hosting servers only), ready for per-request routing.

    Arrays named per *local* server (``index[q]`` is local server q's index in ``servers``):
    ``first``/``end`` its block span [a_j, a_j + m_j), ``tau_c``/``tau_p`` its times, ``local_slots`` its M̃_j;
    ``order``/``starts`` group the local servers by end position (:func:`~petals_chain.compose.paths.group_by_end`).
    """

    servers: tuple[ServerSpec, ...]
    model: ModelSpec
    placement: Placement
    slots: np.ndarray  # M̃_j of every server (all servers, placement order)
    index: np.ndarray  # local id -> server index, hosting servers only
    first: np.ndarray
    end: np.ndarray
    span: np.ndarray
    tau_c: np.ndarray
    tau_p: np.ndarray
    local_slots: np.ndarray
    order: np.ndarray
    starts: np.ndarray

    @classmethod
    def build(cls, servers: Sequence[ServerSpec], model: ModelSpec, placement: Placement,
              slots: Sequence[int] | None = None) -> RouteGraph:
        """Arrays of the placement's DAG; ``slots`` defaults to M̃_j = ⌊(M_j − s_m m_j)/s_c⌋ (eq. 3)."""
        servers = validate_servers(servers)
        if placement.num_servers != len(servers):
            raise SpecError(f"placement has {placement.num_servers} servers but {len(servers)} were given")
        placement.check_for(model)
        all_slots = np.array(cache_slots(servers, model, placement) if slots is None else list(slots), dtype=np.int64)
        if all_slots.shape != (len(servers),):
            raise SpecError(f"slots: expected {len(servers)} values, got {all_slots.shape[0]}")
        if np.any(all_slots < 0):
            bad = int(np.argmax(all_slots < 0))
            raise InfeasibleError(f"server {servers[bad].name!r} holds more blocks than its memory allows")
        hosting = [j for j in range(len(servers)) if placement.num_blocks[j] > 0]
        idx = np.array(hosting, dtype=np.int64)
        first = np.array([placement.first_block[j] for j in hosting], dtype=np.int64)
        end = np.array([placement.end(j) for j in hosting], dtype=np.int64)
        covered = np.zeros(model.num_blocks + 2, dtype=bool)
        for a, e in zip(first, end):
            covered[a:e] = True
        if not covered[1:model.num_blocks + 1].all():
            missing = int(np.argmin(covered[1:model.num_blocks + 1])) + 1
            raise InfeasibleError(f"placement leaves block {missing} of {model.num_blocks} on no server")
        order, starts = group_by_end(end, model.num_blocks)
        return cls(servers, model, placement, all_slots, idx, first, end, end - first,
                   np.array([servers[j].tau_c_s for j in hosting], dtype=np.float64),
                   np.array([servers[j].tau_p_s for j in hosting], dtype=np.float64),
                   all_slots[idx].copy(), order, starts)

    @property
    def max_hops(self) -> int:
        return int(min(self.model.num_blocks, self.index.size))

    @property
    def num_local(self) -> int:
        """Hosting servers (the local ids 0 .. num_local-1)."""
        return int(self.index.size)

    def route(self, penalty_s: np.ndarray | None = None, free_at: np.ndarray | None = None,
              now_s: float = 0.0) -> Route | None:
        """Min-cost route (server index, blocks) per hop, or None if no path fits; arrays are per local server."""
        k = self.index.size
        pen = np.zeros(k) if penalty_s is None else np.ascontiguousarray(penalty_s, dtype=np.float64)
        use_wait = free_at is not None
        fa = np.ascontiguousarray(free_at, dtype=np.float64) if use_wait else np.zeros((1, 1))
        L1 = self.model.num_blocks + 1
        hs = np.empty(self.max_hops, dtype=np.int64)
        hb = np.empty(self.max_hops, dtype=np.int64)
        n = route_dp(self.first, self.end, self.tau_c, self.tau_p, self.local_slots, self.order, self.starts,
                     self.model.num_blocks, pen, fa, float(now_s), use_wait, np.empty(L1 + 1),
                     np.empty(L1 + 1, dtype=np.int64), np.empty(L1 + 1, dtype=np.int64), hs, hb)
        if n == 0:
            return None
        return tuple((int(self.index[hs[h]]), int(hb[h])) for h in range(n))

    def route_time_s(self, route: Route) -> float:
        """Σ_hops (τc_j + τp_j m_ij): the route's service time for a job of size 1 (eq. 2)."""
        return float(sum(self.servers[j].tau_c_s + self.servers[j].tau_p_s * m for j, m in route))

    def to_global(self, hops: Sequence[tuple[int, int]]) -> Route:
        """Hops given per local server as (server index, blocks)."""
        return tuple((int(self.index[q]), int(m)) for q, m in hops)
