"""A KV memory cache whose sessions' caches are rows of one tensor per block: what the batched step's arena path needs.

PETALS' ``MemoryCache`` creates each session's keys and values as tensors of their own (``descr.make_zeros()`` when
the runtime first uses them). The batched step attends over many sessions at once fastest when, for every block,
their caches are rows of one tensor: a decode batch then attends in place over a dense range of rows, with no copy
(``batched_step.arena_rows``; on an H200 this lifted 64 sessions from 0.1–0.2 to 0.48–0.77 of the bare batched
forward, results/gpu-batched/). :class:`ArenaMemoryCache` is PETALS' cache with that layout:

* **Arenas.** The k-th (keys, values) pair of an allocation (block k of the session's span: PETALS' handler allocates
  the span's blocks in order, two tensors per block) lives in arena k: keys ``[rows, kv_heads, head_dim, L]`` and
  values ``[rows, kv_heads, L, head_dim]``, L the server's longest session (``--max-length``), rows the jobs its
  cache holds (c). A session of ``max_length`` ≤ L and ``batch`` hypotheses gets ``batch`` consecutive rows, the same
  in every arena, and views ``arena[row:row + batch, ..., :max_length]``: PETALS' layout and strides within a row,
  so PETALS' own step, the KV transfer and the batched step all work on them unchanged. Sessions of one batched step
  cover the same blocks (the pool's rule), so their caches of block k are rows of arena k.
* **Accounting.** Every session is charged a full slot (``pairs`` blocks at L tokens, times its hypotheses), whatever
  its span and ``max_length``: the orchestrator's model (c jobs per server, each holding a cache on every block of
  its span) and exactly the memory the arenas reserve, so the handlers' waiting for free memory (PETALS') admits no
  more sessions than there are rows. A session that does not fit the layout (more blocks than the server holds,
  longer than L, an unknown tensor shape) or finds no free run of rows gets PETALS' own tensors, with a warning.
* **Lifetime.** Arenas are made (zeroed) at the first session's first step, the runtime's first ``use_cache``; a
  session's rows are zeroed when it gets them (as ``make_zeros`` would) and freed when PETALS frees its handles.

Only the runtime process touches the arenas (``use_cache``), as only it touches PETALS' tensors; the handlers only
compute sizes. ``install_kv_arena`` makes ``petals.server.server`` build this cache (``ModuleContainer`` looks
``MemoryCache`` up there) with the server's rows and L. ``--kv-arena auto`` (the default) uses arenas on CUDA
devices only, where the batched step's gathered attention reads them in place; on a CPU the per-session attention
is faster (docs/batching.md) and PETALS' tensors are kept.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from petals.server.memory_cache import MemoryCache

from petals_chain.defaults import KV_ARENA_MODES

log = logging.getLogger(__name__)
ARENA_LOG_PREFIX = "KV cache arenas"  # logged when the arenas are made (live tests read it)


@dataclass(frozen=True)
class ArenaLayout:
    """What the server's arenas hold: ``rows`` sessions (c), ``pairs`` (keys, values) pairs per session (its blocks ×
    devices), each ``length`` tokens (L); ``mode`` "on", "off" or "auto" (CUDA devices only)."""

    rows: int = 0
    pairs: int = 0
    length: int = 0
    mode: str = "off"

    def __post_init__(self) -> None:
        if self.mode not in KV_ARENA_MODES:
            raise ValueError(f"kv arena mode must be one of {', '.join(KV_ARENA_MODES)}, got {self.mode!r}")
        if self.mode != "off" and min(self.rows, self.pairs, self.length) < 1:
            raise ValueError(f"kv arenas need rows, pairs and length >= 1, got {self}")

    def serves(self, device: torch.device | str) -> bool:
        """Whether caches on ``device`` go into arenas."""
        return self.mode == "on" or (self.mode == "auto" and torch.device(device).type == "cuda")


def _pairs(descriptors: Sequence[Any]) -> list[tuple[int, int, int, int]] | None:
    """Per (keys, values) pair of an allocation, ``(batch, kv_heads, head_dim, max_length)``; None unless the
    descriptors are PETALS' pairs (keys ``[b, h, d, L]`` then values ``[b, h, L, d]``, same dtype and device)."""
    if not descriptors or len(descriptors) % 2:
        return None
    out = []
    for keys, values in zip(descriptors[::2], descriptors[1::2]):
        ks, vs = tuple(keys.shape), tuple(values.shape)
        if len(ks) != 4 or len(vs) != 4 or (ks[0], ks[1], ks[3], ks[2]) != vs or keys.dtype != values.dtype \
                or keys.device != values.device:
            return None
        out.append(ks)
    return out


class ArenaMemoryCache(MemoryCache):
    """PETALS' ``MemoryCache`` that places each session's caches as rows of per-block arenas (module docstring)."""

    layout = ArenaLayout()  # set by install_kv_arena before the server builds its container (and forks handlers)

    def __init__(self, max_size_bytes: int | None, max_alloc_timeout: float | None = None) -> None:
        super().__init__(max_size_bytes, max_alloc_timeout)
        self.layout = type(self).layout  # this cache's, fixed at creation
        self._arenas: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._free_rows: list[bool] = []
        self._row_of: dict[int, tuple[int, int]] = {}  # an arena session's first handle → (first row, batch)
        self.sessions_in_arena = 0  # sessions placed in arenas since the start (tests and logs)
        self.sessions_outside = 0  # sessions given PETALS' tensors instead

    # ---- handlers' side: sizes ----------------------------------------------------------------------------------

    def _fits(self, descriptors: Sequence[Any]) -> list[tuple[int, int, int, int]] | None:
        """The allocation's pairs if it goes into arenas, else None."""
        lay = self.layout
        pairs = _pairs(descriptors)
        if pairs is None or lay.mode == "off" or not lay.serves(descriptors[0].device):
            return None
        if len(pairs) > lay.pairs or any(p[3] > lay.length or p[0] > lay.rows for p in pairs):
            return None
        return pairs

    def get_allocation_size(self, *descriptors: Any) -> int:
        """A full slot for an arena session (every block of the server at L tokens, per hypothesis), PETALS' size
        otherwise. Called by the handlers before they wait for memory."""
        pairs = self._fits(descriptors)
        if pairs is None:
            return MemoryCache.get_allocation_size(*descriptors)
        batch, heads, dim, _ = pairs[0]
        per_pair = 2 * heads * dim * self.layout.length * descriptors[0].dtype.itemsize
        return batch * self.layout.pairs * per_pair

    # ---- runtime's side: tensors --------------------------------------------------------------------------------

    @contextlib.contextmanager
    def use_cache(self, *handles: int) -> Iterator[tuple[torch.Tensor, ...]]:
        """The tensors of ``handles``, as PETALS' ``use_cache`` yields them (runtime process only), after applying
        the handlers' requests in order: a new session goes into the arenas (or gets PETALS' zero tensors), a
        deleted one frees its rows."""
        assert os.getpid() == self.runtime_pid, "use_cache runs in the runtime's process"
        while self._pipe_recv.poll():
            new_handles, descriptors = self._pipe_recv.recv()
            if descriptors is None:
                self._release(new_handles)
                for handle in new_handles:
                    if self._allocated_tensors.pop(handle, None) is None:
                        log.warning("asked to free cache handle %s, which does not exist", handle)
            elif not self._place_tracked(new_handles, descriptors):
                for handle, descr in zip(new_handles, descriptors):
                    self._allocated_tensors[handle] = descr.make_zeros()
        yield tuple(self._allocated_tensors[handle] for handle in handles)

    def _ensure_arenas(self, pairs: list[tuple[int, int, int, int]], descriptors: Sequence[Any]) -> None:
        """Make (zeroed) arenas up to the allocation's number of pairs, sized like its pairs."""
        lay = self.layout
        made = len(self._arenas) < len(pairs)
        while len(self._arenas) < len(pairs):
            k = len(self._arenas)
            _, heads, dim, _ = pairs[k]
            keys = descriptors[2 * k]
            self._arenas.append((torch.zeros(lay.rows, heads, dim, lay.length, dtype=keys.dtype, device=keys.device),
                                 torch.zeros(lay.rows, heads, lay.length, dim, dtype=keys.dtype, device=keys.device)))
            if not self._free_rows:
                self._free_rows = [True] * lay.rows
        if made:
            log.info("%s: %d blocks x %d rows of %d tokens (%s)", ARENA_LOG_PREFIX, len(self._arenas), lay.rows,
                     lay.length, self._arenas[0][0].device)

    def _place_tracked(self, handles: Sequence[int], descriptors: Sequence[Any]) -> bool:
        """:meth:`_place` outside inference mode: the runtime calls ``use_cache`` inside it, where views are not
        tracked (no ``_base``), and the batched step knows a session's rows by their view of the arena."""
        with torch.inference_mode(False):
            return self._place(handles, descriptors)

    def _place(self, handles: Sequence[int], descriptors: Sequence[Any]) -> bool:
        """Put one allocation in the arenas (views in PETALS' table); False when it does not fit."""
        pairs = self._fits(descriptors)
        if pairs is None:
            self.sessions_outside += 1
            return False
        self._ensure_arenas(pairs, descriptors)
        for k, (_, heads, dim, _) in enumerate(pairs):
            keys, values = self._arenas[k]
            if (keys.shape[1], keys.shape[2]) != (heads, dim) or keys.dtype != descriptors[2 * k].dtype \
                    or keys.device != descriptors[2 * k].device:
                log.warning("a session's cache of block %d does not match the arena (%s); PETALS' tensors", k,
                            tuple(descriptors[2 * k].shape))
                self.sessions_outside += 1
                return False
        batch = pairs[0][0]
        row = self._find_rows(batch)
        if row is None:
            log.warning("no %d consecutive free arena rows for a session; PETALS' tensors (beyond the arenas)", batch)
            self.sessions_outside += 1
            return False
        for r in range(row, row + batch):
            self._free_rows[r] = False
        for k, (_, _, _, length) in enumerate(pairs):
            keys, values = self._arenas[k]
            kv = keys[row:row + batch, :, :, :length], values[row:row + batch, :, :length]
            kv[0].zero_()
            kv[1].zero_()
            self._allocated_tensors[handles[2 * k]] = kv[0]
            self._allocated_tensors[handles[2 * k + 1]] = kv[1]
        self._row_of[handles[0]] = (row, batch)
        self.sessions_in_arena += 1
        return True

    def _find_rows(self, batch: int) -> int | None:
        """The first of ``batch`` consecutive free rows (lowest first: sessions stay packed at the arena's start,
        so a decode batch's rows are dense), or None."""
        run = 0
        for r, free in enumerate(self._free_rows):
            run = run + 1 if free else 0
            if run == batch:
                return r - batch + 1
        return None

    def _release(self, handles: Sequence[int]) -> None:
        """Free the rows of the arena sessions among ``handles`` (PETALS then forgets the views)."""
        for handle in handles:  # PETALS frees an allocation's handles together; its first one holds the rows
            if handle in self._row_of:
                row, batch = self._row_of.pop(handle)
                for r in range(row, row + batch):
                    self._free_rows[r] = True

    @property
    def rows_in_use(self) -> int:
        """Arena rows held by sessions now."""
        return sum(1 for free in self._free_rows if not free)


def install_kv_arena(layout: ArenaLayout) -> None:
    """Make petals' server (in this process) build :class:`ArenaMemoryCache` with ``layout``, or PETALS' own
    ``MemoryCache`` when the mode is "off"."""
    import petals.server.server as petals_server

    if layout.mode == "off":
        petals_server.MemoryCache = MemoryCache
        return
    ArenaMemoryCache.layout = layout
    petals_server.MemoryCache = ArenaMemoryCache
