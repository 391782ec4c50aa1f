"""Server choice of every method, given the cluster state: TORTA's greedy, SkyLB, SDIB and round robin.

docs/torta.md, "Methods". Each chooser returns a server index, or −1 when the task must wait in
the buffer of the region the method names.
"""

from __future__ import annotations

import numpy as np

from petals_chain.torta.cluster_sim import Cluster
from petals_chain.torta.micro import greedy_score


def greedy_in_region(c: Cluster, i: int, region: int, now_s: float) -> int:
    """TORTA's micro layer: the free server of ``region`` with the highest score (7), else −1."""
    cand = c.free(c.members[region], now_s)
    if cand.size == 0:
        return -1
    t = c.sc.tasks
    load, cap = c.outstanding(cand, now_s), c.p.server_slots
    if c.p.load_count == "slot":  # (9) as in Algorithm 1: Util and Queue grow with every task the slot assigns
        load, cap = load + c.taken_in_slot(cand, now_s), c.slot_cap[cand]
    score = greedy_score(c.hw[t.kind[i], cand], int(t.model[i]), now_s, load, cap, c.last_model[cand],
                         c.last_ts[cand], c.p)
    return int(cand[score.argmax()])


def _least_loaded_affine(c: Cluster, cand: np.ndarray, model: int, now_s: float) -> int:
    """SkyLB's replica choice: a replica that last served the same model (prefix affinity), least loaded."""
    load = c.outstanding(cand, now_s) - c.speed[cand] * 1e-3  # ties → faster GPU
    same = c.last_model[cand] == model
    if same.any():
        cand, load = cand[same], load[same]
    return int(cand[load.argmin()])


def skylb(c: Cluster, i: int, now_s: float) -> tuple[int, int]:
    """SkyLB: a free local replica (selective pushing: only below max concurrency), else the nearest remote
    region with a free replica; otherwise wait in the origin's LB queue. Returns (server, buffer region)."""
    t = c.sc.tasks
    o = int(t.origin[i])
    for r in c.sc_nearest[o]:
        cand = c.free(c.members[r], now_s)
        if cand.size:
            return _least_loaded_affine(c, cand, int(t.model[i]), now_s), o
    return -1, o


def sdib(c: Cluster, i: int, now_s: float) -> tuple[int, int]:
    """SDIB (scalarised): the free server minimising w·std(U after) + (1 − w)·mean idle time after."""
    o = int(c.sc.tasks.origin[i])
    on = c.on_servers
    cand = c.free(on, now_s)
    if cand.size == 0:
        return -1, o
    u = c.outstanding(on, now_s) / c.p.server_slots
    idle = np.maximum(0.0, now_s - c.busy_until[on]) / c.p.slot_s
    pos = np.searchsorted(on, cand)
    n = on.size
    du = 1.0 / c.p.server_slots
    s1, s2 = u.sum(), (u * u).sum()
    new_s1 = s1 + du
    new_s2 = s2 + 2 * u[pos] * du + du * du
    std_after = np.sqrt(np.maximum(new_s2 / n - (new_s1 / n) ** 2, 0.0))
    idle_after = (idle.sum() - idle[pos]) / n
    obj = c.p.sdib_w * std_after + (1 - c.p.sdib_w) * idle_after
    return int(cand[obj.argmin()]), o


def round_robin(c: Cluster, i: int, now_s: float) -> tuple[int, int]:
    """Round robin over regions, then over each region's servers, skipping full or powered-off ones."""
    o = int(c.sc.tasks.origin[i])
    n_r = len(c.members)
    for k in range(n_r):
        r = (c.rr_region + k) % n_r
        m = c.members[r]
        cand = c.free(m, now_s)
        if cand.size:
            c.rr_region = (r + 1) % n_r
            start = c.rr_server[r]
            pos = np.searchsorted(m, cand)
            nxt = cand[np.argmin((pos - start) % m.size)]
            c.rr_server[r] = (int(np.searchsorted(m, nxt)) + 1) % m.size
            return int(nxt), o
    return -1, o
