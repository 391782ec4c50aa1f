"""BPRR's WS-RR routing (Sun et al., Performance Evaluation 2025) as one clock-agnostic policy over arrays.

Written once; the simulator (:func:`petals_chain.sim.baselines.simulate_bprr`) and the live orchestrator
(:class:`petals_chain.orchestrator.leasing.ws_rr.WsRrLeaseManager`) both drive :class:`WsRr`. Like the chain
policies of this package, it sees only job ids, a placement's route graph and clock values handed in by
the caller, and every event returns the jobs that *start* because of it; the caller decides what service
means (a simulated end time, or a lease a client holds).

The policy, exactly:

* every server j of the placement has M̃_j cache slots; the scheduler keeps a *believed calendar*: slot q
  of server j is believed free from time F_jq on (0 at first);
* **routing decision** (per request, on arrival, :func:`ws_rr_route`): Dijkstra over the placement's
  feasible-edge DAG (:class:`~petals_chain.compose.routes.RouteGraph`) with edge cost
  w_j(m) + τc_j + τp_j·m, where w_j(m) = (m-th smallest F_jq − now)⁺ is the believed wait until m slots of
  j are free; the believed start is S = max(now, max over hops of the m_ij-th smallest F_jq);
* **commit**: the request is committed to that route at once; at each hop it reserves the m_ij slots
  believed free latest but by S (best fit, :func:`best_fit_slots`) and sets them to S + T_route: the
  scheduler does not know job sizes and believes every job has the mean size (1), i.e. ends T_route =
  Σ_hops (τc_j + τp_j m_ij) after it starts;
* **start rule** (:meth:`WsRr.start_ready`): committed requests wait in one FIFO in commit order; one
  starts when it heads the FIFO at each of its servers (no committed request of any of its servers is
  still waiting ahead of it) and each of them has m_ij free slots; its slots are taken only then;
* **learning**: when a job really starts, its reserved slots are set to now + T_route; when it really
  ends (or a waiting request is withdrawn), to now.

The oracle variant of the simulator (``estimate="exact"``, told every job's size, starting every job at
its calendar start S) shares the routing decision and best fit (:func:`ws_rr_route`,
:func:`best_fit_slots`); only its start rule differs, and it exists in the simulator only.
"""

from __future__ import annotations

import numpy as np

from petals_chain.compose.paths import route_dp
from petals_chain.compose.routes import Route, RouteGraph
from petals_chain.model import InfeasibleError

try:  # routing runs once per request: numba makes the route + best fit cheap next to the calendar sort
    from numba import njit as _njit
except ImportError:  # pragma: no cover - exercised only where numba is missing
    _njit = None


def _ws_rr_route_py(first, end, tau_c, tau_p, slots, order, starts, num_blocks, no_penalty, calendar, now,
                    dist, best_server, best_prev, out_servers, out_blocks):
    """WS-RR's routing decision: (hops, believed start S, route time T_route); hops == 0 if no route fits.

    ``calendar[j]`` is local server j's believed free times sorted ascending (so ``calendar[j, m-1]`` is the
    m-th smallest); the route is written to ``out_servers``/``out_blocks`` (local server, blocks) per hop.
    """
    hops = route_dp(first, end, tau_c, tau_p, slots, order, starts, num_blocks, no_penalty, calendar, now, True,
                    dist, best_server, best_prev, out_servers, out_blocks)
    s = now
    t_route = 0.0
    for h in range(hops):
        j = out_servers[h]
        m = out_blocks[h]
        if calendar[j, m - 1] > s:
            s = calendar[j, m - 1]
        t_route += tau_c[j] + tau_p[j] * m
    return hops, s, t_route


def _best_fit_slots_py(row, num_slots, start, m, out):
    """Best fit: out[:m] = the m slots of row[:num_slots] believed free latest but by ``start``.

    Slots are ordered by (believed free time, slot index); the m greatest of those free by ``start`` are
    taken (so among equal times the higher index). Needs at least m slots free by ``start``.
    """
    o = np.argsort(row[:num_slots], kind="mergesort")
    cnt = 0
    while cnt < num_slots and row[o[cnt]] <= start:
        cnt += 1
    for x in range(m):
        out[x] = o[cnt - m + x]


if _njit is not None:
    ws_rr_route = _njit(cache=True)(_ws_rr_route_py)
    best_fit_slots = _njit(cache=True)(_best_fit_slots_py)
else:  # pragma: no cover
    ws_rr_route = _ws_rr_route_py
    best_fit_slots = _best_fit_slots_py


class WsRr:
    """WS-RR with mean-size beliefs over one placement (see the module docstring); clock-agnostic.

    Jobs are any distinct ints; ``now`` is the caller's clock. Per local server q (``graph.index[q]`` in the
    placement): ``belief[q, :M̃_q]`` is the believed calendar, ``owner`` the job that last reserved each slot
    and ``free[q]`` the slots really free. A job is *waiting* from :meth:`commit` until it is returned by
    :meth:`start_ready` and *in service* until :meth:`on_departure`; the policy forgets it then.
    """

    name = "WS-RR"

    def __init__(self, graph: RouteGraph) -> None:
        self.graph = graph
        k = graph.num_local
        width = int(max(graph.local_slots.max(initial=0), 1))
        self.belief = np.full((k, width), np.inf)
        self.owner = np.full((k, width), -1, dtype=np.int64)
        for q in range(k):
            self.belief[q, : graph.local_slots[q]] = 0.0
        self.free = graph.local_slots.copy()
        self._hops: dict[int, list[tuple[int, int]]] = {}  # waiting or in service: (local server, blocks)
        self._reserved: dict[int, list[np.ndarray]] = {}  # the slots it reserved at each hop
        self._route_s: dict[int, float] = {}
        self._fifo: list[int] = []  # committed, not started, in commit order
        self._in_service: set[int] = set()
        L1 = graph.model.num_blocks + 1
        self._dist = np.empty(L1 + 1)
        self._best_server = np.empty(L1 + 1, dtype=np.int64)
        self._best_prev = np.empty(L1 + 1, dtype=np.int64)
        self._hs = np.empty(graph.max_hops, dtype=np.int64)
        self._hb = np.empty(graph.max_hops, dtype=np.int64)
        self._no_penalty = np.zeros(k)
        self._pick = np.empty(width, dtype=np.int64)

    # ---- decisions ------------------------------------------------------------------------------------------

    def commit(self, job: int, now: float) -> list[tuple[int, int]]:
        """Route ``job`` now and commit it: best-fit believed slots at every hop, last in the FIFO.

        Returns its hops (local server, blocks). InfeasibleError if no route fits; ValueError if ``job`` is known.
        """
        if job in self._hops:
            raise ValueError(f"WS-RR: job {job} is already committed")
        g = self.graph
        calendar = np.sort(self.belief, axis=1)
        nh, s_believed, t_route = ws_rr_route(g.first, g.end, g.tau_c, g.tau_p, g.local_slots, g.order, g.starts,
                                              g.model.num_blocks, self._no_penalty, calendar, float(now), self._dist,
                                              self._best_server, self._best_prev, self._hs, self._hb)
        if nh == 0:
            raise InfeasibleError(f"WS-RR: no route through the placement fits job {job}")
        hops = [(int(self._hs[h]), int(self._hb[h])) for h in range(nh)]
        reserved = []
        for q, m in hops:
            best_fit_slots(self.belief[q], g.local_slots[q], s_believed, m, self._pick)
            idx = self._pick[:m].copy()
            self.belief[q, idx] = s_believed + t_route
            self.owner[q, idx] = job
            reserved.append(idx)
        self._hops[job] = hops
        self._reserved[job] = reserved
        self._route_s[job] = t_route
        self._fifo.append(job)
        return hops

    def start_ready(self, now: float) -> list[int]:
        """The start rule: committed jobs that start now, in FIFO order (their free slots are taken)."""
        blocked: set[int] = set()
        still: list[int] = []
        started: list[int] = []
        for job in self._fifo:
            hops = self._hops[job]
            if any(q in blocked or self.free[q] < m for q, m in hops):
                blocked.update(q for q, _ in hops)
                still.append(job)
                continue
            for q, m in hops:
                self.free[q] -= m
            self._set_belief(job, now + self._route_s[job])
            self._in_service.add(job)
            started.append(job)
        self._fifo[:] = still
        return started

    def on_arrival(self, job: int, now: float) -> list[int]:
        """A request arrives: commit it, then start whoever can (it may be among them)."""
        self.commit(job, now)
        return self.start_ready(now)

    def on_departure(self, job: int, now: float) -> list[int]:
        """``job`` ends: its slots are free again and believed free from now; returns the jobs that start."""
        if job not in self._in_service:
            raise ValueError(f"WS-RR: job {job} departs but is not in service")
        self._in_service.discard(job)
        for q, m in self._hops[job]:
            self.free[q] += m
        self._set_belief(job, now)
        self._forget(job)
        return self.start_ready(now)

    def cancel(self, job: int, now: float) -> list[int]:
        """A waiting job leaves (its client gave up): its reserved slots are believed free from now; returns
        the jobs that start because of it. ValueError if it is not waiting."""
        if job not in self._hops or job in self._in_service:
            raise ValueError(f"WS-RR: job {job} is not waiting")
        self._fifo.remove(job)
        self._set_belief(job, now)
        self._forget(job)
        return self.start_ready(now)

    def withdraw_all(self, now: float) -> list[int]:
        """Every waiting job leaves at once (a shutdown): as :meth:`cancel` for each, and nobody starts.

        Returns the withdrawn jobs in commit order."""
        gone = list(self._fifo)
        self._fifo.clear()
        for job in gone:
            self._set_belief(job, now)
            self._forget(job)
        return gone

    def _set_belief(self, job: int, value: float) -> None:
        """Believed end of ``job``, on the reserved slots no later job has reserved since."""
        for (q, _), idx in zip(self._hops[job], self._reserved[job]):
            mine = self.owner[q, idx] == job
            self.belief[q, idx[mine]] = value

    def _forget(self, job: int) -> None:
        del self._hops[job], self._reserved[job], self._route_s[job]

    # ---- views ----------------------------------------------------------------------------------------------

    def hops(self, job: int) -> list[tuple[int, int]]:
        """(local server, blocks) per hop of a waiting or in-service job."""
        return list(self._hops[job])

    def route(self, job: int) -> Route:
        """(server index in the placement, blocks) per hop of a waiting or in-service job."""
        return self.graph.to_global(self._hops[job])

    def route_time_s(self, job: int) -> float:
        """T_route of a waiting or in-service job: its service time at size 1."""
        return self._route_s[job]

    def is_waiting(self, job: int) -> bool:
        return job in self._hops and job not in self._in_service

    def queued_jobs(self) -> list[int]:
        """Committed jobs not started, in commit order."""
        return list(self._fifo)

    def queue_length(self) -> int:
        return len(self._fifo)

    def occupancy(self) -> list[int]:
        """Slots in use per local server."""
        return [int(c - f) for c, f in zip(self.graph.local_slots, self.free)]
