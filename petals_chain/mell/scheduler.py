"""Mell's online KV-cache scheduler: Allocate, Depart and Update with operation batching (docs/mell.md, "Scheduler").

`MellScheduler.step` takes one slot's arrivals, completions and KV growth and returns every move it
decided as data. Where the paper leaves a rule open, docs/mell.md ("Our reading") says what we chose.

One module although it is long: Allocate, Depart and Update are one algorithm over the same size-class placement
rules and the same batching state of a slot; split, each file would need the others' private rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from petals_chain.mell.classes import SizeClass
from petals_chain.mell.state import Item, Move, PackingState, item_moves

L, M, S, T, X = SizeClass.L, SizeClass.M, SizeClass.S, SizeClass.T, SizeClass.X


@dataclass(frozen=True)
class Priority:
    """prio(j) = a·free_j/C − b·n_j and prio(j→j') = prio(j') + d·[same machine] (weights set by the operator)."""

    a: float = 1.0
    b: float = 0.05
    d: float = 0.1
    gpus_per_machine: int = 8


PAPER_OPS = ("depart", "update", "allocate")  # the operations Theorem 3 bounds (not overflow, refill, sweep)


@dataclass(frozen=True)
class OpRecord:
    """One operation of a slot: its kind, its request (or GPU for an overflow or a refill) and the moves it made,
    counted as requests moved (``moves``) and as scheduler moves (``item_moves``: a multi-item counts once).

    Kinds: the paper's ``depart``, ``update``, ``allocate``; ours: ``overflow`` (growth past C), ``refill``
    (a refill that batching deferred to the end of the slot) and ``sweep`` (the end-of-slot sweep).
    """

    kind: str
    subject: int
    moves: int
    item_moves: int = 0


@dataclass(frozen=True)
class StepResult:
    """What a slot decided: the moves to execute (net moves when batching), and every operation."""

    moves: tuple[Move, ...]
    ops: tuple[OpRecord, ...]
    raw_moves: int
    preemptions: int = 0
    preempted: tuple[int, ...] = ()


class MellScheduler:
    """The online scheduler over one pool of identical GPUs of ``capacity_tokens`` each.

    ``batching=True`` orders a slot's operations as departures, updates, allocations, defers the refills
    they cause to the end of the slot (so a refill an arrival made useless is never made) and executes only
    each request's net move; ``batching=False`` runs them in request order (the paper's Algorithm 1),
    refills at once and executes every move (docs/mell.md, "Scheduler").
    """

    name = "Mell"

    def __init__(self, capacity_tokens: int, *, batching: bool = True, priority: Priority = Priority(),
                 order: str | None = None) -> None:
        self.st = PackingState(capacity_tokens)
        self.C = self.st.C
        self.batching = batching
        self.prio_w = priority
        self.order = order or ("phases" if batching else "requests")
        if self.order not in ("phases", "requests"):
            raise ValueError(f"order must be 'phases' or 'requests', got {order!r}")
        self._open_bundle = -1
        self._pending: dict[int, tuple[Item, int, SizeClass]] = {}
        self._touched: set[int] = set()
        self._deferred: set[int] | None = None  # GPUs whose refill waits for the slot's end (batching only)

    # ---- priorities -------------------------------------------------------------------------------
    def prio(self, g: int) -> float:
        w = self.prio_w
        return w.a * self.st.free(g) / self.C - w.b * self.st.n_requests(g)

    def prio_to(self, j: int, g: int) -> float:
        same = j // self.prio_w.gpus_per_machine == g // self.prio_w.gpus_per_machine
        return self.prio(g) + self.prio_w.d * same

    # ---- one slot ---------------------------------------------------------------------------------
    def step(self, arrivals: Mapping[int, int], departures: Iterable[int],
             growth: Mapping[int, int] | None = None, final_sizes: Mapping[int, int] | None = None) -> StepResult:
        """Apply one slot: ``growth`` (request → new size), ``departures``, ``arrivals`` (request → size).

        ``final_sizes`` is accepted for a common interface and ignored: Mell never looks at future lengths.
        """
        st = self.st
        st.log = []
        departures = sorted(set(departures))
        for r in departures:
            if r not in st.size:
                raise KeyError(f"departure of unknown request {r}")
        for r, s in arrivals.items():
            if r in st.size:
                raise ValueError(f"arrival of request {r} which is already live")
            if not 0 < s <= self.C:
                raise ValueError(f"request {r}: size_tokens must be in (0, C={self.C}], got {s}")
        gone = set(departures)
        changed = self._apply_growth(growth or {}, gone)
        ops: list[tuple[int, int, str, int]] = []  # (phase, request, kind, subject)
        phase = {"depart": 0, "update": 1, "allocate": 2}
        for r in departures:
            ops.append((phase["depart"], r, "depart", r))
        for r in changed:
            ops.append((phase["update"], r, "update", r))
        for r in sorted(arrivals):
            ops.append((phase["allocate"], r, "allocate", r))
        ops.sort(key=(lambda o: (o[0], o[1])) if self.order == "phases" else (lambda o: (o[1], o[0])))
        records: list[OpRecord] = []
        self._deferred = set() if self.batching and self.order == "phases" else None
        for _, r, kind, _ in ops:
            n0 = len(st.log)
            if kind == "depart":
                self._depart(r)
            elif kind == "update":
                self._update(r)
            else:
                self._arrive(r, arrivals[r])
            records.append(self._record(kind, r, n0))
        n = st._next_gpu
        for g in np.flatnonzero((st.used_arr[:n] > self.C) & (st.label_arr[:n] != -9)).tolist():
            if g in st.gpus and st.gpus[g].used > self.C:
                n0 = len(st.log)
                self._overflow(g)
                records.append(self._record("overflow", g, n0))
        deferred, self._deferred = self._deferred or set(), None
        for g in sorted(deferred):  # the refills still needed once every arrival is placed
            if g in st.gpus:
                n0 = len(st.log)
                self._restore(g)
                records.append(self._record("refill", g, n0))
        n0 = len(st.log)
        self._sweep()
        if len(st.log) > n0:
            records.append(self._record("sweep", -1, n0))
        raw = len(st.log)
        moves = tuple(self._net(arrivals)) if self.batching else tuple(st.log)
        return StepResult(moves, tuple(records), raw)

    def _record(self, kind: str, subject: int, n0: int) -> OpRecord:
        """The operation that made the log's moves from index ``n0`` on, counted as requests and as items."""
        made = self.st.log[n0:]
        return OpRecord(kind, subject, len(made), item_moves(made))

    def _sweep(self) -> None:
        """End of slot: every GPU touched this slot that sits below 3C/4 takes T items if it may (properties 3, 5).

        Not in the paper: its moves are marked ``sweep`` so that they can be counted apart."""
        st = self.st
        st.sweeping = True
        try:
            self._sweep_passes()
        finally:
            st.sweeping = False

    def _sweep_passes(self) -> None:
        st = self.st
        for _ in range(3):
            touched = self._touched | {mv.src for mv in st.log} | {mv.dst for mv in st.log}
            self._touched = set()
            n0 = len(st.log)
            for g in sorted(touched):
                if g in st.gpus and st.gpus[g].used * 4 < 3 * self.C and st.gpus[g].label != S:
                    self._fill_t(g)
            if len(st.log) == n0:
                return

    def _net(self, arrivals: Mapping[int, int]) -> list[Move]:
        """Each live, not newly arrived request's first source and last destination of the slot (a chain of
        moves becomes one; the moves of requests that left, or that only arrived, vanish). The net move keeps
        the item of its last move and is a sweep move only if every move of the chain was."""
        first: dict[int, Move] = {}
        last: dict[int, Move] = {}
        swept: dict[int, bool] = {}
        for mv in self.st.log:
            first.setdefault(mv.request, mv)
            last[mv.request] = mv
            swept[mv.request] = swept.get(mv.request, True) and mv.sweep
        return [Move(r, mv.src, last[r].dst, self.st.size[r], last[r].item, swept[r]) for r, mv in first.items()
                if r in self.st.size and r not in arrivals and mv.src != last[r].dst]

    def _apply_growth(self, growth: Mapping[int, int], gone: set[int]) -> list[int]:
        """Set the new sizes; lift out every single item whose new class cannot stay on its GPU (resolved by
        its Update later in the slot); return the requests whose item must be updated."""
        st = self.st
        changed: list[int] = []
        self._pending: dict[int, tuple[Item, int, SizeClass]] = {}
        lifted: dict[int, SizeClass] = {}
        for r, s in growth.items():
            if r in gone:
                continue
            if r not in st.size:
                raise KeyError(f"growth of unknown request {r}")
            if s > self.C:
                raise ValueError(f"request {r}: size {s} exceeds the capacity C={self.C}")
            it = st.items[st.item_of[r]]
            self._touched.add(it.gpu)
            before = st.item_class(it)
            before_b = st.item_size(it) if it.bundle else 0
            st.grow(r, s)
            if it.bundle:
                if _cls(s, self.C) >= T or st.item_size(it) * 4 > self.C >= before_b * 4:
                    changed.append(r)
            elif st.item_class(it) != before:
                changed.append(r)
                g = it.gpu
                if not self._stays(it, g, st.item_class(it)):
                    lifted.setdefault(g, st.gpus[g].label)
                    st.take(it)
                    st.drop_gpu_if_empty(g)
                    self._pending[r] = (it, g, lifted[g])
                else:
                    st.relabel(g)
        return sorted(changed)

    # ---- operations -------------------------------------------------------------------------------
    def _arrive(self, r: int, size: int) -> None:
        """Allocate a new request: a tiny one joins the open multi-item if it fits, else a new item."""
        st = self.st
        st.size[r] = size
        if _cls(size, self.C) == X:
            ob = st.items.get(self._open_bundle)
            if ob is not None and ob.bundle and (st.item_size(ob) + size) * 4 <= self.C and st.free(ob.gpu) >= size:
                st.join(r, size, ob)
                return
            it = st.new_item([r], bundle=True)
            self._open_bundle = it.id
        else:
            it = st.new_item([r], bundle=False)
        self._allocate(it)

    def _depart(self, r: int) -> None:
        """Depart: remove the request, then restore the GPU it left (refill or dissolve)."""
        st = self.st
        g = st.gpu_of(r)
        old = st.gpus[g].label
        self._touched.add(g)
        st.remove_request(r)
        self._settle(g, old)

    def _update(self, r: int) -> None:
        """Update: the request's item changed class (or its multi-item outgrew C/4)."""
        st = self.st
        if r not in st.item_of:
            return
        it = st.items[st.item_of[r]]
        g = it.gpu
        if it.bundle and r not in self._pending:
            self._update_bundle(r, it)
            return
        if r in self._pending:
            it, g, old = self._pending.pop(r)
            if g in st.gpus:
                self._settle(g, old)
            self._allocate(it, src=g)
            return
        st.relabel(g)
        self._repair(g)

    def _update_bundle(self, r: int, it: Item) -> None:
        """A member reaching C/8 leaves as its own T item; a multi-item over C/4 splits; both in place."""
        st = self.st
        g = it.gpu
        gpu = st.gpus[g]
        single: Item | None = None
        if _cls(st.size[r], self.C) >= T and len(it.members) > 1:
            it.members.remove(r)
            single = st.new_item([r], bundle=False)
            single.gpu = g
            gpu.items.add(single.id)
        elif _cls(st.size[r], self.C) >= T:
            it.bundle = False
            single = it
        while it.bundle and st.item_size(it) * 4 > self.C and len(it.members) > 1:
            moved: list[int] = []
            for q in sorted(it.members, key=lambda q: -st.size[q]):
                if st.item_size(it) * 4 <= self.C:
                    break
                it.members.remove(q)
                moved.append(q)
            extra = st.new_item(moved, bundle=True)
            extra.gpu = g
            gpu.items.add(extra.id)
        st.relabel(g)
        if single is not None and st.item_class(single) > T and not self._stays(single, g, st.item_class(single)):
            # grew past T in one slot and may not stay: allocate it afresh
            old = gpu.label
            st.take(single)
            self._settle(g, old)
            self._allocate(single, src=g)
            return
        st.relabel(g)
        self._repair(g)

    def _stays(self, it: Item, g: int, k: SizeClass) -> bool:
        """Whether an item whose class grew to k may stay on its GPU g (no move needed)."""
        st = self.st
        if k == L:
            return True
        if k == M and st.gpus[g].label == M:
            others = [st.item_class(st.items[i]) for i in st.gpus[g].items if i != it.id]
            return others.count(M) < 2 and others.count(M) + others.count(T) == len(others)
        if k in (S, M) and st.gpus[g].label == L:
            big = self._l_size(g)
            others = [i for i in st.gpus[g].items if i != it.id and st.item_class(st.items[i]) in (S, M)]
            return not others and big + st.item_size(it) < self.C
        return False

    def _repair(self, g: int) -> None:
        """After an in-place change: an L-GPU keeps ≤ 1 M/S that fits beside its L; an M-GPU keeps ≤ 1 T."""
        st = self.st
        if g not in st.gpus:
            return
        lab = st.gpus[g].label
        if lab == L:
            ms = sorted((i for i in st.gpus[g].items if st.item_class(st.items[i]) in (S, M)),
                        key=lambda i: -st.item_size(st.items[i]))
            big = self._l_size(g)
            keep = ms[:1] if ms and big + st.item_size(st.items[ms[0]]) < self.C else []
            for i in ms:
                if i not in keep:
                    self._evict(st.items[i])
            self._refill(g)
        elif lab == M:
            ts = sorted((i for i in st.gpus[g].items if st.item_class(st.items[i]) == T),
                        key=lambda i: st.item_size(st.items[i]))
            for i in ts[:-1]:
                self._evict(st.items[i])
        if st.gpus[g].used > self.C:
            self._overflow(g)

    def _overflow(self, g: int) -> None:
        """GPU g outgrew C: evict (never its largest item) the item carrying the fewest requests whose removal
        suffices, smallest first; else the smallest items one by one; then restore g."""
        st = self.st
        old = st.gpus[g].label
        while st.gpus[g].used > self.C:
            order = sorted(st.gpus[g].items, key=lambda i: st.item_size(st.items[i]))[:-1]
            if not order:  # a single request is never over C; a lone multi-item is at most C/4
                raise AssertionError(f"GPU {g} over capacity with one item")
            excess = st.gpus[g].used - self.C
            enough = [i for i in order if st.item_size(st.items[i]) >= excess]
            pick = min(enough, key=lambda i: (len(st.items[i].members), st.item_size(st.items[i]))) \
                if enough else order[0]
            self._evict(st.items[pick])
        self._settle(g, old)

    def _evict(self, it: Item) -> None:
        src = self.st.take(it)
        self._allocate(it, src=src)
        self.st.drop_gpu_if_empty(src)

    # ---- allocation -------------------------------------------------------------------------------
    def _l_size(self, g: int) -> int:
        i = self.st.gpus[g].l_item
        it = self.st.items.get(i)
        return self.st.item_size(it) if it is not None and it.gpu == g else 0

    def _allocate(self, it: Item, src: int = -1) -> None:
        """Allocate an unplaced item by its class; logs a move if it came from GPU ``src``."""
        st = self.st
        k = st.item_class(it)
        s = st.item_size(it)
        dst: int | None = None
        if k == T:
            n = st._next_gpu
            lab, used = st.label_arr[:n], st.used_arr[:n]
            ok = ((lab == L) | ((lab == M) & (st.tcount_arr[:n] == 0))) & (used <= self.C - s)
            if 0 <= src < n:
                ok[src] = False
            if ok.any():
                w = self.prio_w
                prio = np.where(ok, w.a * (self.C - used) / self.C - w.b * st.nreq_arr[:n], -np.inf)
                dst = int(np.argmax(prio))
            if dst is None:
                lt = st.latest(T, exclude=src)
                dst = lt if lt is not None and st.free(lt) >= s else st.new_gpu()
            self._put(it, dst, src)
        elif k in (S, M):
            n = st._next_gpu
            lab, used = st.label_arr[:n], st.used_arr[:n]
            ok = (lab == L) & (st.ms_arr[:n] == 0) & (st.lsize_arr[:n] + s < self.C)
            if 0 <= src < n:
                ok[src] = False
            if ok.any():
                w = self.prio_w
                prio = np.where(ok, w.a * (self.C - used) / self.C - w.b * st.nreq_arr[:n], -np.inf)
                dst = int(np.argmax(prio))
            if dst is None:
                lt = st.latest(k, exclude=src)
                cap = 2 if k == M else 3
                if lt is not None and self._pure(lt, k, cap) and self._room_without_t(lt) >= s:
                    dst = lt
                else:
                    dst = st.new_gpu()
            self._put(it, dst, src)
            self._shed_t(dst)
        else:
            dst = st.new_gpu()
            self._put(it, dst, src)
            self._refill(dst)

    def _put(self, it: Item, dst: int, src: int) -> None:
        self.st.place(it, dst)
        self.st.log_moves(it, src, dst)

    def _pure(self, g: int, k: SizeClass, cap: int) -> bool:
        """Whether GPU g holds fewer than ``cap`` items of class k and otherwise only T items (an M-GPU) or nothing."""
        st = self.st
        c = [st.item_class(st.items[i]) for i in st.gpus[g].items]
        other = [x for x in c if x != k]
        return c.count(k) < cap and (not other if k == S else all(x == T for x in other))

    def _has_ms(self, g: int) -> bool:
        return self.st.gpus[g].ms_count > 0

    def _room_without_t(self, g: int) -> int:
        st = self.st
        return st.free(g) + sum(st.item_size(st.items[i]) for i in st.gpus[g].items
                                if st.item_class(st.items[i]) == T)

    def _shed_t(self, g: int) -> None:
        """Evict T items (smallest first) from g until it fits in C."""
        st = self.st
        for i in sorted((i for i in st.gpus[g].items if st.item_class(st.items[i]) == T),
                        key=lambda i: st.item_size(st.items[i])):
            if st.gpus[g].used <= self.C:
                break
            self._evict(st.items[i])

    # ---- restoring a GPU --------------------------------------------------------------------------
    def _settle(self, g: int, old: SizeClass) -> None:
        """After GPU g lost something: terminate it if empty, dissolve it if its label fell, else refill it
        (when batching, the refill waits for the slot's end: an arrival may fill or empty g first)."""
        st = self.st
        if st.drop_gpu_if_empty(g):
            return
        new = st.gpus[g].label
        if new != old and old in (L, M, S):
            self._dissolve(g)
            return
        self._refill(g)

    def _refill(self, g: int) -> None:
        """Refill GPU g now, or note it for the slot's end while batching defers refills."""
        if self._deferred is not None:
            self._deferred.add(g)
        else:
            self._restore(g)

    def _restore(self, g: int) -> None:
        """Refill GPU g by its label: an M/S-GPU short of its count from the latest of its class, an L-GPU
        without M/S with one, any L/M/T-GPU below 3C/4 with T items."""
        st = self.st
        if g not in st.gpus:
            return
        new = st.gpus[g].label
        if new == M:
            if st.count(g, M) < 2 and st.latest(M) != g:
                self._pull_same(g, M)
            self._fill_t(g)
        elif new == S:
            if st.count(g, S) < 3 and st.latest(S) != g:
                self._pull_same(g, S)
        elif new == L:
            if not self._has_ms(g):
                self._refill_l(g)
            self._fill_t(g)
        else:
            self._fill_t(g)

    def _dissolve(self, g: int) -> None:
        """Re-allocate everything on g, largest first (g terminates)."""
        st = self.st
        items = sorted((st.items[i] for i in st.gpus[g].items), key=lambda it: -st.item_size(it))
        for it in items:
            st.take(it)
        st.drop_gpu_if_empty(g)
        for it in items:
            self._allocate(it, src=g)

    def _pull_same(self, g: int, k: SizeClass) -> None:
        """Refill M/S-GPU g with one item of class k from the most recent GPU of that class."""
        st = self.st
        src = st.latest(k, exclude=g)
        if src is None:
            return
        cands = [st.items[i] for i in st.gpus[src].items if st.item_class(st.items[i]) == k]
        room = self._room_without_t(g) if k == M else st.free(g)
        cands = [it for it in cands if st.item_size(it) <= room]
        if not cands:
            return
        it = max(cands, key=st.item_size)
        old = st.gpus[src].label
        st.move(it, g)
        self._shed_t(g)
        self._settle(src, old)

    def _refill_l(self, g: int) -> None:
        """Give L-GPU g one M/S item that fits beside its L, from the M/S-GPU of highest priority for g."""
        st = self.st
        big = self._l_size(g)
        n = st._next_gpu
        lab = st.label_arr[:n]
        ok = ((lab == M) | (lab == S)) & (st.ms_arr[:n] > 0) & (st.minms_arr[:n] + big < self.C)
        ok[g] = False
        if not ok.any():
            return
        w = self.prio_w
        cand = np.flatnonzero(ok)
        machine = cand // w.gpus_per_machine == g // w.gpus_per_machine
        prio = w.a * (self.C - st.used_arr[cand]) / self.C - w.b * st.nreq_arr[cand] + w.d * machine
        best: tuple[float, int, Item] | None = None
        for k in np.argsort(-prio, kind="stable"):
            g2 = int(cand[k])
            klass = st.gpus[g2].label
            fits = [st.items[i] for i in st.gpus[g2].items
                    if st.item_class(st.items[i]) == klass and big + st.item_size(st.items[i]) < self.C]
            if fits:
                best = (float(prio[k]), g2, max(fits, key=st.item_size))
                break
        if best is None:
            return
        _, src, it = best
        old = st.gpus[src].label
        st.move(it, g)
        self._shed_t(g)
        self._settle(src, old)

    def _fill_t(self, g: int) -> None:
        """Raise an L/M/T-GPU below 3C/4 with T items from the most recent T-GPU (an M-GPU takes one T)."""
        st = self.st
        if g not in st.gpus:
            return
        lab = st.gpus[g].label
        if lab == S or (lab == T and st.latest(T) == g):
            return
        while g in st.gpus and st.gpus[g].used * 4 < 3 * self.C:
            if lab == M and st.count(g, T) >= 1:
                return
            src = st.latest(T, exclude=g)
            if src is None or (lab == T and src < g):
                return
            free = st.free(g)
            cands = [st.items[i] for i in st.gpus[src].items
                     if st.item_size(st.items[i]) <= free and st.item_class(st.items[i]) == T]
            if not cands:
                return
            it = max(cands, key=st.item_size)
            st.move(it, g)
            self._settle(src, T)

    # ---- views ------------------------------------------------------------------------------------
    def placement(self) -> dict[int, int]:
        """Request → GPU id."""
        return {r: self.st.gpu_of(r) for r in self.st.size}

    def num_gpus(self) -> int:
        return len(self.st.gpus)


def _cls(size: int, capacity: int) -> SizeClass:
    from petals_chain.mell.classes import size_class

    return size_class(size, capacity)
