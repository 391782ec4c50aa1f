"""Task-level simulator of the geo-distributed GPU system: servers, warm-up, queues, power, per-slot metrics.

docs/torta.md, "Simulator". A server holds at most ``server_slots`` tasks
running concurrently (⚑ concurrency without slowdown, as SkyLB's max_concurrent); a task that fits nowhere waits
in a buffer and is retried every ``retry_s`` (it starts when the lane it takes became free, never before arrival).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from petals_chain.torta.params import GPU_KINDS, TortaParams
from petals_chain.torta.topology import Regions
from petals_chain.torta.workload import Tasks


@dataclass(frozen=True)
class Scenario:
    """Everything an episode's methods share: regions, tasks and per-server warm-up times (all seeded)."""

    regions: Regions
    tasks: Tasks
    warmup_s: np.ndarray
    params: TortaParams
    slots: int


class Cluster:
    """Mutable state of one episode; dispatch policies read it and call :meth:`assign`."""

    def __init__(self, sc: Scenario) -> None:
        p, reg = sc.params, sc.regions
        self.sc, self.p = sc, p
        kinds = [GPU_KINDS[k] for k in reg.server_kind]
        self.region = reg.server_region
        self.speed = np.array([k.speed for k in kinds])
        self.memory = np.array([k.memory_bytes for k in kinds])
        self.idle_w = np.array([k.idle_w for k in kinds])
        self.peak_w = np.array([k.peak_w for k in kinds])
        self.suits = np.array([k.suits for k in kinds])
        self.price = reg.price_per_kwh[self.region]
        n, r = reg.n_servers, reg.n_regions
        self.members = [np.flatnonzero(self.region == i) for i in range(r)]
        self.ready_at = np.full(n, np.inf)
        self.finish = np.zeros((n, p.server_slots))
        self.lane_free = np.zeros(n)  # earliest end of a lane per server (= finish.min(1)): free iff ≤ now
        self.busy_until = np.zeros(n)
        self.last_model = np.full(n, -1)
        self.last_ts = np.zeros(n)
        self.busy = np.zeros((n, sc.slots + 64))
        self.buffers: list[list[int]] = [[] for _ in range(r)]
        self.cost = 0.0
        self.sc_nearest = [np.argsort(reg.latency_s[o], kind="stable") for o in range(r)]
        self.on_servers = np.arange(n)
        self.rr_region = 0
        from petals_chain.torta.micro import hw_fit

        self.hw = np.stack([hw_fit(k, self.speed, self.memory, self.suits) for k in range(3)])  # (type, server)
        self.rr_server = np.zeros(r, dtype=np.int64)
        self.activations = 0
        t = sc.tasks
        self.served_region = np.full(t.n, -1)
        self.served_server = np.full(t.n, -1)
        self.wait_s = np.full(t.n, np.nan)
        self.service_s = np.full(t.n, np.nan)
        self.network_s = np.full(t.n, np.nan)
        self.slot_cap = self.speed * p.slot_s * p.server_slots / (0.5 * (p.proc_min_s + p.proc_max_s))  # tasks/slot
        self.cap_region = np.array([self.slot_cap[m].sum() for m in self.members])
        self.taken = np.zeros(n)  # tasks each server started in slot ``taken_slot``
        self.taken_slot = 0
        self.per_server = self.cap_region / np.maximum(1, np.array([m.size for m in self.members]))
        self.ready_at[:] = 0.0  # every server starts on; pool sizing trims them from the first slot

    # --- queries -----------------------------------------------------------------------------------
    def free(self, servers: np.ndarray, now_s: float) -> np.ndarray:
        """The subset of ``servers`` that are on and hold fewer than ``server_slots`` tasks at ``now_s``."""
        return servers[(self.ready_at[servers] <= now_s) & (self.lane_free[servers] <= now_s)]

    def outstanding(self, servers: np.ndarray, now_s: float) -> np.ndarray:
        """Tasks held (running + queued) by each of ``servers`` at ``now_s``."""
        return (self.finish[servers] > now_s).sum(1)

    def taken_in_slot(self, servers: np.ndarray, now_s: float) -> np.ndarray:
        """Tasks each of ``servers`` has started in the slot holding ``now_s`` (the paper's per-slot Util[s])."""
        self._roll_slot(now_s)
        return self.taken[servers]

    def _roll_slot(self, now_s: float) -> None:
        """Reset the per-slot task counts when ``now_s`` is in a later slot than the last one counted."""
        k = int(now_s // self.p.slot_s)
        if k != self.taken_slot:
            self.taken[:] = 0
            self.taken_slot = k

    def region_queue(self, now_s: float) -> np.ndarray:
        """Q_t per region: buffered tasks + tasks held by servers."""
        held = (self.finish > now_s).sum(1)
        return np.bincount(self.region, weights=held, minlength=len(self.members)) + np.array(
            [len(b) for b in self.buffers])

    def utilisation(self, t: int | slice) -> np.ndarray:
        """Busy fraction of each server during slot t (a slice of slots: one column per slot)."""
        return self.busy[:, t] / (self.p.slot_s * self.p.server_slots)

    # --- actions -----------------------------------------------------------------------------------
    def assign(self, i: int, s: int, now_s: float) -> None:
        """Give task i to server s at ``now_s`` (the caller checked it fits); books wait, service, power."""
        t, p = self.sc.tasks, self.p
        row = self.finish[s]
        lane = int(row.argmin())
        start = max(float(t.arrival_s[i]), row[lane], self.ready_at[s])
        dur = t.work_s[i] / self.speed[s]
        if self.last_model[s] >= 0 and self.last_model[s] != t.model[i]:
            dur += p.model_switch_s
        end = start + dur
        self.busy_until[s] = max(self.busy_until[s], end)
        row[lane] = end
        self.lane_free[s] = row.min()
        self.last_model[s], self.last_ts[s] = t.model[i], end
        self._roll_slot(now_s)
        self.taken[s] += 1
        r = self.region[s]
        self.served_region[i] = r
        self.served_server[i] = s
        self.wait_s[i] = start - t.arrival_s[i]
        self.service_s[i] = dur
        self.network_s[i] = 2 * self.sc.regions.latency_s[t.origin[i], r]
        self.cost += (self.peak_w[s] - self.idle_w[s]) * dur / 3.6e6 * self.price[s]
        a, b = start / p.slot_s, end / p.slot_s
        k = int(a)
        while k < b and k < self.busy.shape[1]:
            self.busy[s, k] += (min(b, k + 1) - max(a, k)) * p.slot_s
            k += 1

    def resize(self, region: int, target: int, now_s: float, util: np.ndarray) -> None:
        """Switch servers of ``region`` on (shortest warm-up, fastest first) or off (idle, least used first)."""
        from petals_chain.torta.micro import activation_order, deactivation_order

        m = self.members[region]
        powered = m[np.isfinite(self.ready_at[m])]
        if target > powered.size:
            off = m[~np.isfinite(self.ready_at[m])]
            order = activation_order(self.sc.warmup_s[off], self.speed[off])
            for s in off[order][:target - powered.size]:
                self.ready_at[s] = now_s + self.sc.warmup_s[s]
                self.activations += 1
        elif target < powered.size:
            idle = powered[(self.busy_until[powered] <= now_s) & (self.ready_at[powered] <= now_s)]
            order = deactivation_order(util[idle], now_s - self.busy_until[idle])
            for s in idle[order][:powered.size - target]:
                self.ready_at[s] = np.inf

    def grow_if_buffer_full(self, region: int, now_s: float) -> None:
        """Switch one more server of ``region`` on when its buffer exceeds the lanes of the servers warming up."""
        m = self.members[region]
        warming = int(((self.ready_at[m] > now_s) & np.isfinite(self.ready_at[m])).sum())
        if len(self.buffers[region]) > warming * self.p.server_slots:
            powered = int(np.isfinite(self.ready_at[m]).sum())
            if powered < m.size:
                self.resize(region, powered + 1, now_s, np.zeros(self.ready_at.size))

    def charge_idle(self, now_s: float) -> None:
        """Idle power of every powered (on or warming) server over one slot."""
        on = np.isfinite(self.ready_at)
        self.cost += float((self.idle_w[on] * self.p.slot_s / 3.6e6 * self.price[on]).sum())
