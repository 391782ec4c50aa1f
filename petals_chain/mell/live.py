"""Consolidation: sessions packed onto chains by Mell's scheduler so that idle servers can be released.

Each chain is one bin (a "GPU" of docs/mell.md) of ``c`` session slots (the smallest chain capacity when they
differ): PETALS gives every session a cache of its ``max_length`` tokens when it opens, so on a swarm whose
sessions share one max_length all items are the same size, ``C / c``. The scheduler
(:class:`~petals_chain.mell.scheduler.MellScheduler`, or worst fit as the baseline) decides where an arrival goes
and, on a departure, which running sessions move (its moves, returned as data); this policy maps its GPU ids onto
chains (a new GPU takes the lowest-indexed idle chain; a terminated one frees its chain) and turns each move into
``Start(job, chain, migrated_from=...)``, which the lease manager carries out as a migration.
An arrival that would need a GPU no chain is left for waits in one FIFO queue. docs/migration.md, "Consolidation".
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from petals_chain.dispatch.base import Start, check_chains
from petals_chain.mell.baselines import FitScheduler
from petals_chain.mell.scheduler import MellScheduler
from petals_chain.model import SpecError

UNIT_TOKENS = 64  # one session's size in the scheduler's units (any value > 0 gives the same decisions)
PACKERS = ("mell", "worst-fit")


class PackingPolicy:
    """Sessions on chains placed by a bin-packing scheduler (Mell or worst fit); the lease manager's policy object."""

    def __init__(self, rates: Sequence[float], capacities: Sequence[int], packer: str = "mell") -> None:
        self.rates, self.capacities = check_chains(rates, capacities)
        if packer not in PACKERS:
            raise SpecError(f"packing: field 'packer' must be one of {PACKERS}, got {packer!r}")
        self.packer = packer
        cap = min(self.capacities) * UNIT_TOKENS  # one bin size: a chain with more slots leaves the rest unused
        self.sched = MellScheduler(cap) if packer == "mell" else FitScheduler(cap, "worst")
        self._chain_of: dict[int, int] = {}  # scheduler GPU id -> chain
        self._where: dict[int, int] = {}  # job -> chain (the scheduler's view: a moving job is at its target)
        self._queue: deque[int] = deque()
        self._held: dict[int, int] = {}  # chain -> sessions moving away that still hold their cache there

    # ---- the scheduler, one operation at a time ----------------------------------------------------------------

    def _apply(self, arrivals: dict[int, int], departures: list[int], must: bool) -> list[Start] | None:
        """Run one scheduler step on a copy; commit it if its GPUs map onto chains (always when ``must``)."""
        trial = copy.deepcopy(self.sched)
        final = {j: s for j, s in arrivals.items()}
        res = trial.step(arrivals, departures, final_sizes=final)
        live = set(trial.st.gpus)
        kept = {g: k for g, k in self._chain_of.items() if g in live}
        new = sorted(live - set(kept))
        idle = [k for k in range(len(self.rates)) if k not in kept.values()]
        if len(new) > len(idle) and not must:
            return None
        if not must:  # an arrival goes only where the cache is free now, not still held by a session moving away
            cnt: dict[int, int] = {}
            for g in trial.placement().values():
                k = kept.get(g, idle[new.index(g)] if g in new else None)
                cnt[k] = cnt.get(k, 0) + 1
            if any(k is not None and c + self._held.get(k, 0) > self.capacities[k] for k, c in cnt.items()):
                return None
        self.sched = trial
        for g, k in zip(new, idle):
            kept[g] = k
        self._chain_of = kept
        before = dict(self._where)
        placement = trial.placement()
        self._where = {j: kept[g] for j, g in placement.items() if g in kept}
        starts = [Start(j, self._where[j]) for j in arrivals if j in self._where]
        for mv in res.moves:
            j = mv.request
            if j in before and j in self._where and before[j] != self._where[j]:
                starts.append(Start(j, self._where[j], migrated_from=before[j]))
        return starts

    # ---- the lease manager's policy interface ------------------------------------------------------------------

    def on_arrival(self, job: int, now: float = 0.0) -> list[Start]:
        """Place the job where the scheduler says, or queue it when that would need a server no chain is left for."""
        if self._queue:
            self._queue.append(job)
            return []
        starts = self._apply({job: UNIT_TOKENS}, [], must=False)
        if starts is None:
            self._queue.append(job)
            return []
        return starts

    def on_resume(self, job: int, now: float = 0.0) -> list[Start]:
        """A job whose chain broke asks again: ahead of later arrivals."""
        if job in self._where:
            raise ValueError(f"packing: job {job} resumes while it is still placed")
        starts = self._apply({job: UNIT_TOKENS}, [], must=False)
        if starts is None:
            pos = next((i for i, q in enumerate(self._queue) if q > job), len(self._queue))
            self._queue.insert(pos, job)
            return []
        return starts

    def on_departure(self, job: int, chain: int, now: float = 0.0) -> list[Start]:
        """The job ended (wherever it is): the scheduler settles its GPU (moves), then the queue is served."""
        if job not in self._where:
            return []  # already gone (a moved job's old lease ended after its new one, or vice versa)
        starts = self._apply({}, [job], must=True) or []
        return starts + self._serve_queue()

    def hold(self, chain: int) -> None:
        """A session moving away from ``chain`` still holds its cache there until its move ends."""
        self._held[chain] = self._held.get(chain, 0) + 1

    def unhold(self, chain: int) -> list[Start]:
        """A move off ``chain`` ended (done, failed or dropped): its cache is free; waiting arrivals may fit now."""
        if self._held.get(chain, 0) > 0:
            self._held[chain] -= 1
        return self._serve_queue()

    def _serve_queue(self) -> list[Start]:
        """Place waiting arrivals, head first, while the head fits."""
        starts: list[Start] = []
        while self._queue:
            more = self._apply({self._queue[0]: UNIT_TOKENS}, [], must=False)
            if more is None:
                break
            self._queue.popleft()
            starts += more
        return starts

    def room(self, chain: int) -> int:
        """Sessions ``chain`` can still take physically (its slots less the scheduler's and the moving-away ones)."""
        return self.capacities[chain] - self.occupancy()[chain] - self._held.get(chain, 0)

    def pin(self, job: int, chain: int) -> None:
        """A move the scheduler decided did not happen: record ``job`` back on ``chain`` (its GPU, or a fresh one
        mapped to that chain if the scheduler had terminated it)."""
        st = self.sched.st
        if job not in st.size:
            return
        gpu = next((g for g, k in self._chain_of.items() if k == chain), None)
        if gpu is None:
            gpu = st.new_gpu()
            self._chain_of[gpu] = chain
        it = st.items[st.item_of[job]]
        if it.gpu != gpu:
            src = st.take(it)
            st.place(it, gpu)
            if st.drop_gpu_if_empty(src):
                self._chain_of.pop(src, None)
        self._where[job] = chain

    def cancel(self, job: int) -> bool:
        """Withdraw a waiting job; True if it was queued."""
        try:
            self._queue.remove(job)
        except ValueError:
            return False
        return True

    def occupy(self, chain: int, job: int | None = None) -> bool:
        """A lease carried over from an earlier composition keeps its chain (placed there as is)."""
        if job is None or job in self._where:
            return False
        st = self.sched.st
        gpu = next((g for g, k in self._chain_of.items() if k == chain), None)
        if gpu is None:
            gpu = st.new_gpu()
            self._chain_of[gpu] = chain
        if st.gpus[gpu].used + UNIT_TOKENS > st.C:
            return False
        st.size[job] = UNIT_TOKENS
        st.place(st.new_item([job], bundle=False), gpu)
        if isinstance(self.sched, FitScheduler):
            self.sched._final[job] = UNIT_TOKENS
            self.sched._add_reserved(gpu, UNIT_TOKENS)
            self.sched._admitted[job] = 0
        self._where[job] = chain
        return True

    def queue_length(self) -> int:
        return len(self._queue)

    def queued_jobs(self) -> list[int]:
        """Waiting jobs, head first."""
        return list(self._queue)

    def occupancy(self) -> list[int]:
        """Sessions per chain (the scheduler's view)."""
        out = [0] * len(self.rates)
        for k in self._where.values():
            out[k] += 1
        return out

    def servers_in_use(self) -> int:
        """Chains holding at least one session: the scheduler's GPUs."""
        return len(set(self._where.values()))


@dataclass(frozen=True)
class PackingLeasePolicy:
    """A lease policy (``orchestrator.lease_policy.LeasePolicy``, satisfied structurally): the packer ``name``
    decides which chain each waiting session starts on, and may move running ones."""

    name: str
    """The packer (one of :data:`PACKERS`)."""

    def dispatcher(self, rates: Sequence[float], capacities: Sequence[int]) -> PackingPolicy:
        """The packer's books over chains with these rates and capacities."""
        return PackingPolicy(rates, capacities, self.name)


def packing_policy(packer: str) -> PackingLeasePolicy:
    """The lease policy of ``packer`` (SpecError naming the field if unknown)."""
    if packer not in PACKERS:
        raise SpecError(f"packing: field 'packer' must be one of {PACKERS}, got {packer!r}")
    return PackingLeasePolicy(packer)
