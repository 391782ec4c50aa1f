"""The arena KV cache: sessions' caches become rows of one tensor per block, PETALS' step and the batched step
(gathered, in place over the arena) give PETALS' outputs on them, rows are reused and zeroed, every session is
charged a full slot so no more sessions are admitted than there are rows, and what does not fit gets PETALS' own
tensors.

In process: ``ArenaMemoryCache`` is PETALS' ``MemoryCache``; the handlers' side is driven as PETALS' does it (the
allocation messages on the cache's pipe, or ``allocate_cache`` itself for the admission test), the runtime's side
through ``use_cache`` inside the backends' steps. Tiny random LLaMA blocks, float32.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os

import pytest
import torch

from petals_chain.server import batched_step as batched_step_module
from petals_chain.server.batched_step import BatchedMergedInferenceStep, arena_rows
from petals_chain.server.kv_arena import ArenaLayout, ArenaMemoryCache, install_kv_arena
from petals_chain.server.random_span import TINY, allocate_session, inference_infos, llama_config, random_backends

N_BLOCKS = 3
ROWS = 6
LENGTH = 48
TOL = 1e-4
NO_HYPO = torch.empty(0, dtype=torch.int64)
_handles = itertools.count(10_000)


def _arena_cache(mode: str = "on", rows: int = ROWS) -> ArenaMemoryCache:
    ArenaMemoryCache.layout = ArenaLayout(rows=rows, pairs=N_BLOCKS, length=LENGTH, mode=mode)
    try:
        return ArenaMemoryCache(max_size_bytes=None)
    finally:
        ArenaMemoryCache.layout = ArenaLayout()


@pytest.fixture
def arena_backends():
    torch.set_num_threads(1)
    cache = _arena_cache()
    return cache, random_backends(llama_config(TINY), N_BLOCKS, seed=0, memory_cache=cache)


@pytest.fixture(scope="module")
def ref_backends():
    return random_backends(llama_config(TINY), N_BLOCKS, seed=0)  # the same weights, PETALS' own tensors


def _alloc(cache: ArenaMemoryCache, backends: dict, batch: int, max_length: int) -> tuple[tuple[int, ...], ...]:
    """A session's handles, allocated as a PETALS handler does (its descriptors down the cache's pipe)."""
    descriptors = [d for b in backends.values() for d in b.get_inference_cache_descriptors(batch, max_length)]
    handles = tuple(next(_handles) for _ in descriptors)
    cache._pipe_send.send((handles, descriptors))
    return tuple(handles[i:i + 2] for i in range(0, len(handles), 2))


def _free(cache: ArenaMemoryCache, session: tuple[tuple[int, ...], ...]) -> None:
    cache._pipe_send.send((tuple(h for pair in session for h in pair), None))


def _tensors(cache: ArenaMemoryCache, session) -> tuple[torch.Tensor, ...]:
    with cache.use_cache(*(h for pair in session for h in pair)) as tensors:
        return tensors


def test_sessions_are_rows_of_one_arena_per_block_and_rows_are_reused_zeroed(arena_backends) -> None:
    cache, backends = arena_backends
    a, b, c = _alloc(cache, backends, 1, LENGTH), _alloc(cache, backends, 1, 20), _alloc(cache, backends, 2, 30)
    ta, tb, tc = (_tensors(cache, s) for s in (a, b, c))
    assert cache.sessions_in_arena == 3 and cache.rows_in_use == 4 and len(cache._arenas) == N_BLOCKS
    for k, (ak, av) in enumerate(cache._arenas):
        assert ak.shape == (ROWS, TINY.kv_heads, TINY.hidden // TINY.heads, LENGTH)
        for t in (ta, tb, tc):
            assert t[2 * k]._base is ak and t[2 * k + 1]._base is av
    assert tb[0].shape[-1] == 20 and tc[1].shape[:3] == (2, TINY.kv_heads, 30)
    steps = [batched_step_module.SessionStep(torch.zeros(t[0].shape[0], 1, TINY.hidden), [(t[0], t[1])], 0)
             for t in (ta, tb, tc)]
    assert arena_rows(steps, 0)[2] == [0, 1, 2, 3]
    tb[0].fill_(7.0)
    _free(cache, b)
    d = _alloc(cache, backends, 1, LENGTH)  # the lowest free row again, zeroed
    td = _tensors(cache, d)
    assert cache.rows_in_use == 4 and td[0].storage_offset() == tb[0].storage_offset()
    assert td[0].abs().sum().item() == 0
    e = _alloc(cache, backends, 2, LENGTH)  # rows 4-5: the last free run of two
    assert _tensors(cache, e)[0].storage_offset() == 4 * cache._arenas[0][0].stride(0)
    for s in (a, c, d, e):
        _free(cache, s)
    _tensors(cache, ())
    assert cache.rows_in_use == 0 and not cache._allocated_tensors


def test_steps_on_arena_rows_equal_petals_own(arena_backends, ref_backends, monkeypatch) -> None:
    """Four sessions of different lengths on arena rows (one of two hypotheses): prefill by PETALS' own step on the
    views, then decode rounds by the gathered batched step, which reads the arena in place; every output equals
    PETALS' step on PETALS' tensors."""
    from petals.server.backend import _MergedInferenceStep

    cache, backends = arena_backends
    torch.manual_seed(5)
    layout = [(1, 40), (2, LENGTH), (1, 24), (1, LENGTH)]
    ours = [_alloc(cache, backends, b, n) for b, n in layout]
    refs = [allocate_session(ref_backends, b, n) for b, n in layout]
    petals_ours, petals_ref = _MergedInferenceStep(backends), _MergedInferenceStep(ref_backends)
    nones = [None] * N_BLOCKS
    worst = 0.0
    lengths = []
    for (b, _), s, r, n in zip(layout, ours, refs, (5, 9, 3, 12)):
        h = torch.randn(b, n, TINY.hidden)
        got = petals_ours(h.clone(), NO_HYPO, inference_infos(backends, s, 0), *nones)[0]
        want = petals_ref(h.clone(), NO_HYPO, inference_infos(ref_backends, r, 0), *nones)[0]
        worst = max(worst, (got - want).abs().max().item())
        lengths.append(n)
    seen = []
    real = batched_step_module.arena_rows
    monkeypatch.setattr(batched_step_module, "arena_rows", lambda steps, index: seen.append(x := real(steps, index))
                        or x)
    batched = BatchedMergedInferenceStep(backends, attention="gathered")
    for _ in range(4):
        hs = [torch.randn(b, 1, TINY.hidden) for b, _ in layout]
        outs = batched([(h, NO_HYPO, inference_infos(backends, s, p)) for h, s, p in zip(hs, ours, lengths)])
        for h, out, r, p in zip(hs, outs, refs, lengths):
            want = petals_ref(h.clone(), NO_HYPO, inference_infos(ref_backends, r, p), *nones)[0]
            worst = max(worst, (out - want).abs().max().item())
        lengths = [p + 1 for p in lengths]
    print(f"arena cache: max |Δ output| {worst:.2e}")
    assert seen and all(x is not None for x in seen)  # every decode layer attended over the arena
    assert worst < TOL


def test_every_session_is_charged_a_full_slot_and_admission_stops_at_the_rows(arena_backends) -> None:
    """A short session costs a full slot (every block of the server at L tokens); with the budget of ROWS slots,
    PETALS' own ``allocate_cache`` admits ROWS sessions and refuses the next."""
    from petals.server.memory_cache import AllocationFailed, MemoryCache

    cache, backends = arena_backends
    descr = [d for b in backends.values() for d in b.get_inference_cache_descriptors(1, 16)]
    slot = MemoryCache.get_allocation_size(*[d for b in backends.values()
                                             for d in b.get_inference_cache_descriptors(1, LENGTH)])
    assert cache.get_allocation_size(*descr) == slot == 3 * MemoryCache.get_allocation_size(*descr)
    cache.max_size_bytes = ROWS * slot
    cache.runtime_pid = os.getpid() + 1  # allocate_cache is the handlers' side (another process in a server)

    async def admit(n: int) -> None:
        async with contextlib.AsyncExitStack() as stack:
            for _ in range(n):
                await stack.enter_async_context(cache.allocate_cache(*descr, timeout=0))

    asyncio.run(admit(ROWS))
    with pytest.raises(AllocationFailed):
        asyncio.run(admit(ROWS + 1))


def test_what_does_not_fit_gets_petals_tensors(arena_backends) -> None:
    """Longer than L, more blocks than the server's, no free run of rows: PETALS' own zero tensors (and PETALS'
    size); "auto" on a CPU keeps PETALS' tensors for every session."""
    from petals.server.memory_cache import MemoryCache

    cache, backends = arena_backends
    too_long = _alloc(cache, backends, 1, LENGTH + 8)
    rows = [_alloc(cache, backends, 1, LENGTH) for _ in range(ROWS - 1)]
    too_wide = _alloc(cache, backends, 2, LENGTH)  # one free row left, two needed
    for s in (too_long, too_wide):
        assert all(t._base is None for t in _tensors(cache, s))
    assert all(t._base is not None for s in rows for t in _tensors(cache, s))
    assert cache.sessions_outside == 2 and cache.rows_in_use == ROWS - 1
    extra = list(backends.values())[0].get_inference_cache_descriptors(1, LENGTH)
    wide = [d for b in backends.values() for d in b.get_inference_cache_descriptors(1, LENGTH)] + extra
    assert cache.get_allocation_size(*wide) == MemoryCache.get_allocation_size(*wide)
    auto = _arena_cache("auto")
    assert auto.get_allocation_size(*extra) == MemoryCache.get_allocation_size(*extra)
    assert auto._fits(extra) is None


def test_install_swaps_petals_memory_cache_and_off_restores_it() -> None:
    import petals.server.server as petals_server
    from petals.server.memory_cache import MemoryCache

    try:
        install_kv_arena(ArenaLayout(rows=2, pairs=1, length=8, mode="auto"))
        assert petals_server.MemoryCache is ArenaMemoryCache and ArenaMemoryCache.layout.rows == 2
    finally:
        install_kv_arena(ArenaLayout())
        ArenaMemoryCache.layout = ArenaLayout()
    assert petals_server.MemoryCache is MemoryCache
    with pytest.raises(ValueError, match="mode must be one of"):
        ArenaLayout(rows=1, pairs=1, length=1, mode="paged")
    with pytest.raises(ValueError, match="need rows"):
        ArenaLayout(rows=0, pairs=1, length=8, mode="on")
