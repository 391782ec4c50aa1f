"""The packing state every scheduler shares: requests, items (single requests or multi-items), GPUs, moves.

A GPU is a bin of capacity C tokens, identified by an id that is never reused (ids grow with activation
time, so "most recently activated" is the largest id). Every change of a request's GPU is logged as a
:class:`Move` (docs/mell.md, "Moves").
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from petals_chain.mell.classes import SizeClass, size_class


@dataclass(frozen=True)
class Move:
    """Request ``request`` goes from GPU ``src`` to GPU ``dst`` with ``size_tokens`` of KV cache."""

    request: int
    src: int
    dst: int
    size_tokens: int


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
        self._next_gpu = 0
        self._next_item = 0
        self.log: list[Move] = []
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
        return sum(len(self.items[i].members) for i in self.gpus[g].items)

    def gpu_of(self, request: int) -> int:
        return self.items[self.item_of[request]].gpu

    def count(self, g: int, cls: SizeClass) -> int:
        """Number of items of class ``cls`` on GPU g."""
        return sum(1 for i in self.gpus[g].items if self.item_class(self.items[i]) == cls)

    # ---- labels ------------------------------------------------------------------------------------
    def relabel(self, g: int) -> None:
        """Recompute GPU g's label (class of its largest item) and keep the label index current."""
        gpu = self.gpus[g]
        new = max((self.item_class(self.items[i]) for i in gpu.items), default=SizeClass.T)
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
        self.gpus[g] = Gpu(g)
        self.by_label[SizeClass.T].add(g)
        heapq.heappush(self._heaps[SizeClass.T], -g)
        self.gpus_opened += 1
        return g

    def place(self, it: Item, g: int) -> None:
        """Put an unplaced item on GPU g (no move is logged: callers log with :meth:`log_moves`)."""
        gpu = self.gpus[g]
        gpu.items.add(it.id)
        gpu.used += self.item_size(it)
        it.gpu = g
        self.relabel(g)

    def take(self, it: Item) -> int:
        """Remove an item from its GPU (the GPU stays, possibly empty); returns the GPU it left."""
        g = it.gpu
        gpu = self.gpus[g]
        gpu.items.discard(it.id)
        gpu.used -= self.item_size(it)
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
                self.log.append(Move(r, src, dst, self.size[r]))

    def drop_gpu_if_empty(self, g: int) -> bool:
        """Terminate GPU g if it holds nothing; True if it was terminated (or already gone)."""
        gpu = self.gpus.get(g)
        if gpu is None:
            return True
        if gpu.items:
            return False
        self.by_label[gpu.label].discard(g)
        del self.gpus[g]
        return True

    def remove_request(self, r: int) -> int:
        """Forget request r (it finished); returns its GPU. Its item shrinks or disappears."""
        it = self.items[self.item_of.pop(r)]
        g = it.gpu
        s = self.size.pop(r)
        it.members.remove(r)
        self.gpus[g].used -= s
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

    def used_tokens(self) -> int:
        return sum(g.used for g in self.gpus.values())
