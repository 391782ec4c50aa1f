"""The packing state every scheduler shares: requests, items (single requests or multi-items), GPUs, moves.

A GPU is a bin of capacity C tokens, identified by an id that is never reused (ids grow with activation
time, so "most recently activated" is the largest id). Every change of a request's GPU is logged as a
:class:`Move` (docs/mell.md, "Moves").
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

import numpy as np

from petals_chain.mell.classes import SizeClass, size_class


@dataclass(frozen=True)
class Move:
    """Request ``request`` goes from GPU ``src`` to GPU ``dst`` with ``size_tokens`` of KV cache.

    ``item`` is the scheduler's item that carried it (-1: not recorded): the moves of one slot with the same
    ``(item, src, dst)`` are one scheduler move (docs/mell.md, "Moves"). ``sweep`` marks a move made by the
    end-of-slot sweep, a rule of ours the paper does not have.
    """

    request: int
    src: int
    dst: int
    size_tokens: int
    item: int = -1
    sweep: bool = False


def item_moves(moves) -> int:
    """Scheduler moves among request moves: distinct ``(item, src, dst)``; a move with no item counts alone."""
    keys = {(mv.item, mv.src, mv.dst) if mv.item >= 0 else (-1 - k, mv.src, mv.dst) for k, mv in enumerate(moves)}
    return len(keys)


@dataclass
class Item:
    """What a scheduler places: one request, or a multi-item bundling several tiny requests (class T)."""

    id: int
    members: list[int]
    bundle: bool
    gpu: int = -1


@dataclass
class Gpu:
    """One active GPU: its items and the tokens they use."""

    id: int
    items: set[int] = field(default_factory=set)
    used: int = 0
    label: SizeClass = SizeClass.T
    l_item: int = -1  # id of its L item (-1: none), cached by relabel
    ms_count: int = 0  # M and S items it holds, cached by relabel


class PackingState:
    """Requests, items and GPUs with O(1) bookkeeping; ``log`` records every request move in order."""

    def __init__(self, capacity_tokens: int) -> None:
        if int(capacity_tokens) != capacity_tokens or capacity_tokens < 8:
            raise ValueError(f"capacity_tokens must be an integer >= 8, got {capacity_tokens!r}")
        self.C = int(capacity_tokens)
        self.size: dict[int, int] = {}
        self.item_of: dict[int, int] = {}
        self.items: dict[int, Item] = {}
        self.gpus: dict[int, Gpu] = {}
        self.by_label: dict[SizeClass, set[int]] = {k: set() for k in SizeClass if k != SizeClass.X}
        self._heaps: dict[SizeClass, list[int]] = {k: [] for k in self.by_label}
        self.lonely_l: set[int] = set()  # L-GPUs holding no M/S item
        # per-GPU mirrors indexed by GPU id, for vectorised candidate search: tokens used, requests held,
        # label (-9 once terminated) and T items held
        self.used_arr = np.zeros(64, dtype=np.int64)
        self.nreq_arr = np.zeros(64, dtype=np.int64)
        self.label_arr = np.full(64, -9, dtype=np.int8)
        self.tcount_arr = np.zeros(64, dtype=np.int64)
        self.lsize_arr = np.zeros(64, dtype=np.int64)  # size of its L item (0: none)
        self.ms_arr = np.zeros(64, dtype=np.int64)  # M/S items held
        self.minms_arr = np.zeros(64, dtype=np.int64)  # smallest M/S item when labelled (may lag growth: lower bound)
        self._next_gpu = 0
        self._next_item = 0
        self.log: list[Move] = []
        self.sweeping = False  # set by a scheduler while its end-of-slot sweep runs: its moves are marked
        self.gpus_opened = 0

    # ---- sizes and classes -------------------------------------------------------------------------
    def item_size(self, it: Item) -> int:
        """Tokens of an item (sum over its requests)."""
        if not it.bundle:
            return self.size[it.members[0]]
        return sum(self.size[r] for r in it.members)

    def item_class(self, it: Item) -> SizeClass:
        """A multi-item is always T; a single request has its size's class."""
        return SizeClass.T if it.bundle else max(size_class(self.size[it.members[0]], self.C), SizeClass.T)

    def free(self, g: int) -> int:
        return self.C - self.gpus[g].used

    def n_requests(self, g: int) -> int:
        return int(self.nreq_arr[g])

    def gpu_of(self, request: int) -> int:
        return self.items[self.item_of[request]].gpu

    def count(self, g: int, cls: SizeClass) -> int:
        """Number of items of class ``cls`` on GPU g."""
        return sum(1 for i in self.gpus[g].items if self.item_class(self.items[i]) == cls)

    # ---- labels ------------------------------------------------------------------------------------
    def relabel(self, g: int) -> None:
        """Recompute GPU g's label (class of its largest item) and keep the label index current."""
        gpu = self.gpus[g]
        classes = {i: self.item_class(self.items[i]) for i in gpu.items}
        new = max(classes.values(), default=SizeClass.T)
        gpu.l_item = next((i for i, c in classes.items() if c == SizeClass.L), -1)
        gpu.ms_count = sum(1 for c in classes.values() if c in (SizeClass.M, SizeClass.S))
        self.tcount_arr[g] = sum(1 for c in classes.values() if c == SizeClass.T)
        self.lsize_arr[g] = self.item_size(self.items[gpu.l_item]) if gpu.l_item >= 0 else 0
        self.ms_arr[g] = gpu.ms_count
        self.minms_arr[g] = min((self.item_size(self.items[i]) for i, c in classes.items()
                                 if c in (SizeClass.M, SizeClass.S)), default=0)
        if new == SizeClass.L and gpu.ms_count == 0:
            self.lonely_l.add(g)
        else:
            self.lonely_l.discard(g)
        self.label_arr[g] = int(new)
        if new != gpu.label or g not in self.by_label[new]:
            self.by_label[gpu.label].discard(g)
            gpu.label = new
            self.by_label[new].add(g)
            heapq.heappush(self._heaps[new], -g)

    def latest(self, label: SizeClass, exclude: int = -1) -> int | None:
        """Most recently activated GPU with this label (skipping ``exclude``), or None."""
        heap, members = self._heaps[label], self.by_label[label]
        while heap and -heap[0] not in members:
            heapq.heappop(heap)
        if not heap:
            return None
        if -heap[0] != exclude:
            return -heap[0]
        best = max((g for g in members if g != exclude), default=None)
        return best

    # ---- mutations ---------------------------------------------------------------------------------
    def new_item(self, members: list[int], bundle: bool) -> Item:
        it = Item(self._next_item, members, bundle)
        self._next_item += 1
        self.items[it.id] = it
        for r in members:
            self.item_of[r] = it.id
        return it

    def new_gpu(self) -> int:
        g = self._next_gpu
        self._next_gpu += 1
        if g >= self.used_arr.size:
            n = 2 * self.used_arr.size
            self.used_arr = np.concatenate([self.used_arr, np.zeros(n - self.used_arr.size, np.int64)])
            self.nreq_arr = np.concatenate([self.nreq_arr, np.zeros(n - self.nreq_arr.size, np.int64)])
            self.tcount_arr = np.concatenate([self.tcount_arr, np.zeros(n - self.tcount_arr.size, np.int64)])
            self.lsize_arr = np.concatenate([self.lsize_arr, np.zeros(n - self.lsize_arr.size, np.int64)])
            self.ms_arr = np.concatenate([self.ms_arr, np.zeros(n - self.ms_arr.size, np.int64)])
            self.minms_arr = np.concatenate([self.minms_arr, np.zeros(n - self.minms_arr.size, np.int64)])
            self.label_arr = np.concatenate([self.label_arr, np.full(n - self.label_arr.size, -9, np.int8)])
        self.used_arr[g] = self.nreq_arr[g] = self.tcount_arr[g] = 0
        self.lsize_arr[g] = self.ms_arr[g] = self.minms_arr[g] = 0
        self.label_arr[g] = int(SizeClass.T)
        self.gpus[g] = Gpu(g)
        self.by_label[SizeClass.T].add(g)
        heapq.heappush(self._heaps[SizeClass.T], -g)
        self.gpus_opened += 1
        return g

    def place(self, it: Item, g: int) -> None:
        """Put an unplaced item on GPU g (no move is logged: callers log with :meth:`log_moves`)."""
        gpu = self.gpus[g]
        gpu.items.add(it.id)
        size = self.item_size(it)
        gpu.used += size
        self.used_arr[g] += size
        self.nreq_arr[g] += len(it.members)
        it.gpu = g
        self.relabel(g)

    def take(self, it: Item) -> int:
        """Remove an item from its GPU (the GPU stays, possibly empty); returns the GPU it left."""
        g = it.gpu
        gpu = self.gpus[g]
        gpu.items.discard(it.id)
        size = self.item_size(it)
        gpu.used -= size
        self.used_arr[g] -= size
        self.nreq_arr[g] -= len(it.members)
        it.gpu = -1
        if gpu.items:
            self.relabel(g)
        return g

    def move(self, it: Item, dst: int) -> None:
        """Move a placed item to GPU dst, logging one move per request it carries."""
        src = self.take(it)
        self.place(it, dst)
        self.log_moves(it, src, dst)

    def log_moves(self, it: Item, src: int, dst: int) -> None:
        if src != dst and src >= 0:
            for r in it.members:
                self.log.append(Move(r, src, dst, self.size[r], it.id, self.sweeping))

    def drop_gpu_if_empty(self, g: int) -> bool:
        """Terminate GPU g if it holds nothing; True if it was terminated (or already gone)."""
        gpu = self.gpus.get(g)
        if gpu is None:
            return True
        if gpu.items:
            return False
        self.by_label[gpu.label].discard(g)
        self.lonely_l.discard(g)
        self.label_arr[g] = -9
        del self.gpus[g]
        return True

    def remove_request(self, r: int) -> int:
        """Forget request r (it finished); returns its GPU. Its item shrinks or disappears."""
        it = self.items[self.item_of.pop(r)]
        g = it.gpu
        s = self.size.pop(r)
        it.members.remove(r)
        self.gpus[g].used -= s
        self.used_arr[g] -= s
        self.nreq_arr[g] -= 1
        if not it.members:
            self.gpus[g].items.discard(it.id)
            del self.items[it.id]
        if self.gpus[g].items:
            self.relabel(g)
        return g

    def grow(self, r: int, new_size: int) -> None:
        """Set request r's KV size (sizes only grow); the GPU's usage follows."""
        old = self.size[r]
        if new_size < old:
            raise ValueError(f"request {r}: size must not shrink ({old} -> {new_size})")
        self.size[r] = new_size
        it = self.items[self.item_of[r]]
        if it.gpu >= 0:
            self.gpus[it.gpu].used += new_size - old
            self.used_arr[it.gpu] += new_size - old
            if self.gpus[it.gpu].l_item == it.id:
                self.lsize_arr[it.gpu] += new_size - old

    def join(self, r: int, size: int, it: Item) -> None:
        """A new request r of ``size`` tokens joins multi-item ``it`` where it lies."""
        self.size[r] = size
        it.members.append(r)
        self.item_of[r] = it.id
        self.gpus[it.gpu].used += size
        self.used_arr[it.gpu] += size
        self.nreq_arr[it.gpu] += 1

    def used_tokens(self) -> int:
        return sum(g.used for g in self.gpus.values())
