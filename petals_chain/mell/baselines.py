"""The baselines Mell is compared with (docs/mell.md, "Baselines"): best fit, worst fit, first fit, and
Llumnix-style load balancing by KV migration. Same ``step`` interface and results as the Mell scheduler.

None of them moves a running request except LB's balancing. Growth is handled one of two ways
(``reserve``): with ``reserve=True`` (our default) a request is admitted only where its final size fits,
so no GPU ever overflows (what a system that can neither migrate nor preempt must do; the simulator
knows the final size); with ``reserve=False`` a GPU that outgrows C preempts its most recently admitted
request (vLLM's recompute preemption), re-dispatched with its current size and counted as a preemption.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from petals_chain.mell.scheduler import OpRecord, StepResult
from petals_chain.mell.state import Move, PackingState


class FitScheduler:
    """Dispatch each arrival to a GPU it fits by ``rule``: 'best' (least free), 'worst' (most free), 'first'."""

    def __init__(self, capacity_tokens: int, rule: str = "best", *, reserve: bool = True) -> None:
        if rule not in ("best", "worst", "first"):
            raise ValueError(f"rule must be 'best', 'worst' or 'first', got {rule!r}")
        self.st = PackingState(capacity_tokens)
        self.C = self.st.C
        self.rule = rule
        self.name = {"best": "BF", "worst": "WF", "first": "FF"}[rule]
        self._admitted: dict[int, int] = {}
        self._clock = 0
        self.reserve = reserve
        self._final: dict[int, int] = {}
        self._reserved: dict[int, int] = {}
        self._res_arr = np.zeros(64, dtype=np.int64)
        self._step_tokens = 0  # the most tokens a request grew by in one slot so far (what the next slot needs)

    def _room(self, g: int) -> int:
        """Tokens still free on GPU g: against reservations (final sizes) or against actual sizes."""
        return self.C - (self._reserved.get(g, 0) if self.reserve else self.st.gpus[g].used)

    def _add_reserved(self, g: int, delta: int) -> None:
        self._reserved[g] = self._reserved.get(g, 0) + delta
        self._grow_res(g + 1)
        self._res_arr[g] += delta

    def _grow_res(self, n: int) -> None:
        """Make the reservation mirror hold at least n GPUs (new entries zero)."""
        if n > self._res_arr.size:
            self._res_arr = np.concatenate([self._res_arr, np.zeros(max(n, 2 * self._res_arr.size)
                                                                    - self._res_arr.size, np.int64)])

    def _fitting(self, size: int, exclude: int = -1) -> tuple[np.ndarray, np.ndarray]:
        """(which GPU ids have room for ``size``, every GPU's room), vectorised over the ids in use; ``exclude`` never
        fits. Room is against reservations when the baseline reserves, else against the tokens held."""
        st = self.st
        n = st._next_gpu
        if self.reserve:
            self._grow_res(n)
            room = self.C - self._res_arr[:n]
        else:
            room = self.C - st.used_arr[:n]
        ok = (st.label_arr[:n] != -9) & (room >= size)
        if 0 <= exclude < n:
            ok[exclude] = False
        return ok, room

    def _choose(self, size: int, exclude: int = -1) -> int:
        """The GPU the rule picks among those with room for ``size`` (vectorised over GPU ids), or a new one."""
        ok, room = self._fitting(size, exclude)
        if not ok.any():
            return self.st.new_gpu()
        ids = np.flatnonzero(ok)
        if self.rule == "best":
            return int(ids[np.argmin(room[ids])])
        if self.rule == "worst":
            return int(ids[np.argmax(room[ids])])
        return int(ids[0])

    def _admit(self, r: int, size: int, src: int = -1) -> None:
        st = self.st
        if src < 0:
            st.size[r] = size
            it = st.new_item([r], bundle=False)
        else:
            it = st.items[st.item_of[r]]
        g = self._choose(self._final[r] if self.reserve else size, exclude=src)
        st.place(it, g)
        self._add_reserved(g, self._final[r])
        self._admitted[r] = self._clock
        self._clock += 1

    def step(self, arrivals: Mapping[int, int], departures: Iterable[int],
             growth: Mapping[int, int] | None = None, final_sizes: Mapping[int, int] | None = None) -> StepResult:
        """Departures, growth (preempting on overflow), arrivals; then the policy's own migrations.

        ``final_sizes`` (request → size when done) is needed for arrivals when ``reserve`` is on.
        """
        st = self.st
        for r, s in arrivals.items():
            f = (final_sizes or {}).get(r)
            if self.reserve and f is None:
                raise ValueError(f"request {r}: final_sizes needed when reserve=True")
            if f is not None and not s <= f <= self.C:
                raise ValueError(f"request {r}: final size {f} must lie in [{s}, C={self.C}]")
            self._final[r] = f if f is not None else s
        st.log = []
        ops = []
        for r in sorted(set(departures)):
            if r not in st.size:
                raise KeyError(f"departure of unknown request {r}")
            g = st.remove_request(r)
            self._admitted.pop(r, None)
            self._add_reserved(g, -self._final.pop(r))
            st.drop_gpu_if_empty(g)
            ops.append(OpRecord("depart", r, 0))
        for r, s in (growth or {}).items():
            if r in st.size:
                if s > self.C:
                    raise ValueError(f"request {r}: size {s} exceeds the capacity C={self.C}")
                self._step_tokens = max(self._step_tokens, s - st.size[r])
                st.grow(r, s)
        preempted: list[int] = []
        n = st._next_gpu
        for g in np.flatnonzero((st.used_arr[:n] > self.C) & (st.label_arr[:n] != -9)).tolist():
            while st.gpus[g].used > self.C:
                victim = max((st.items[i].members[0] for i in st.gpus[g].items), key=self._admitted.__getitem__)
                it = st.items[st.item_of[victim]]
                st.take(it)
                self._add_reserved(g, -self._final[victim])
                self._final[victim] = max(self._final[victim], st.size[victim])
                self._admit(victim, st.size[victim], src=g)
                preempted.append(victim)
            st.drop_gpu_if_empty(g)
        for r in sorted(arrivals):
            s = arrivals[r]
            if r in st.size:
                raise ValueError(f"arrival of request {r} which is already live")
            if not 0 < s <= self.C:
                raise ValueError(f"request {r}: size_tokens must be in (0, C={self.C}], got {s}")
            self._admit(r, s)
            ops.append(OpRecord("allocate", r, 0))
        moves = self._rebalance()
        return StepResult(tuple(moves), tuple(ops), len(moves), len(preempted), tuple(preempted))

    def _rebalance(self) -> list[Move]:
        return []

    def placement(self) -> dict[int, int]:
        return {r: self.st.gpu_of(r) for r in self.st.size}

    def num_gpus(self) -> int:
        return len(self.st.gpus)


class LoadBalanceScheduler(FitScheduler):
    """Load balancing by KV migration as Llumnix does it (docs/mell.md, "Baselines").

    Freeness of a GPU = (free tokens − tokens its requests need for the next slot) / (requests + 1), on the
    tokens actually held (Llumnix's free blocks), never on reservations. An arrival goes to the GPU of highest
    freeness where it fits (Llumnix's load-aware dispatch; ``reserve`` decides what "fits" means, as for the
    fit baselines). Every slot, GPUs below the freeness threshold (the mean, unless ``threshold`` is given) are
    sources, the others destinations; the most loaded source is paired with the freest destination, the second
    with the second, and so on, and each pair moves the source's shortest request while that narrows the
    pair's freeness gap without reversing it and leaves the destination at or above the threshold
    (Llumnix's "balanced" pair policy, repeated until the pair is balanced).

    ``variant="v0"`` is our first reading, kept reachable: worst-fit dispatch, freeness on reservations
    (free / requests), at most one move per pair per slot.
    """

    def __init__(self, capacity_tokens: int, *, reserve: bool = True, variant: str = "llumnix",
                 threshold: float | None = None) -> None:
        if variant not in ("llumnix", "v0"):
            raise ValueError(f"variant must be 'llumnix' or 'v0', got {variant!r}")
        super().__init__(capacity_tokens, rule="worst", reserve=reserve)
        self.name = "LB" if variant == "llumnix" else "LB-v0"
        self.variant = variant
        self.threshold = threshold

    def _freeness(self, g: int, d_tokens: int = 0, d_requests: int = 0) -> float:
        """Freeness of GPU g if it gained ``d_tokens`` held tokens and ``d_requests`` requests."""
        st = self.st
        n = st.n_requests(g) + d_requests
        if self.variant == "v0":
            return (self._room(g) - d_tokens) / max(n, 1)
        return (self.C - st.gpus[g].used - d_tokens - n * self._step_tokens) / (n + 1)

    def _choose(self, size: int, exclude: int = -1) -> int:
        """Dispatch: the fitting GPU of highest freeness (Llumnix), or worst fit for ``v0``."""
        if self.variant == "v0":
            return super()._choose(size, exclude)
        st = self.st
        n = st._next_gpu
        ok, _ = self._fitting(size, exclude)
        if not ok.any():
            return st.new_gpu()
        nreq = st.nreq_arr[:n]
        free = (self.C - st.used_arr[:n] - nreq * self._step_tokens) / (nreq + 1)
        return int(np.argmax(np.where(ok, free, -np.inf)))

    def _shift(self, r: int, dst: int) -> None:
        """Move request r to GPU dst, carrying its reservation."""
        it = self.st.items[self.st.item_of[r]]
        self._add_reserved(it.gpu, -self._final[r])
        self.st.move(it, dst)
        self._add_reserved(dst, self._final[r])

    def _rebalance(self) -> list[Move]:
        self.st.log = []
        if self.variant == "v0":
            self._rebalance_v0()
        else:
            self._rebalance_llumnix()
        return list(self.st.log)

    def _rebalance_llumnix(self) -> None:
        st = self.st
        if len(st.gpus) < 2:
            return
        free = {g: self._freeness(g) for g in st.gpus}
        cut = self.threshold if self.threshold is not None else float(np.mean(list(free.values())))
        srcs = sorted((g for g in free if free[g] < cut), key=lambda g: (free[g], g))
        dsts = sorted((g for g in free if free[g] >= cut), key=lambda g: (-free[g], g))
        for src, dst in zip(srcs, dsts):
            while st.n_requests(src) > 0:
                r = min((q for i in st.gpus[src].items for q in st.items[i].members), key=lambda q: (st.size[q], q))
                s = st.size[r]
                if self._room(dst) < (self._final[r] if self.reserve else s):
                    break
                before = self._freeness(dst) - self._freeness(src)
                dst_after = self._freeness(dst, s, 1)
                after = dst_after - self._freeness(src, -s, -1)
                if not 0 < after < before or dst_after < cut:
                    break
                self._shift(r, dst)

    def _rebalance_v0(self) -> None:
        st = self.st
        order = sorted(st.gpus, key=self._freeness)
        half = len(order) // 2
        for src, dst in zip(order[:half], reversed(order[half:])):
            gap = self._freeness(dst) - self._freeness(src)
            if gap <= 0 or st.n_requests(src) < 2:
                continue
            r = min((st.items[i].members[0] for i in st.gpus[src].items), key=lambda q: (st.size[q], q))
            need = self._final[r] if self.reserve else st.size[r]
            if self._room(dst) < need:
                continue
            n0 = len(st.log)
            self._shift(r, dst)
            after = self._freeness(dst) - self._freeness(src)
            if not 0 < after < gap:
                self._shift(r, src)
                del st.log[n0:]
