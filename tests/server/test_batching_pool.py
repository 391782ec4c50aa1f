"""The batching pool in the runtime's place: which queued steps join a batch, the pool's bookkeeping, each task's
own answer, a bad session failing only itself, the batching window, and PETALS' runtime driving it.

In-process, no RPC: tiny random LLaMA blocks built as PETALS' server builds them (``random_span``), the pool's
prioritizer thread running as in the server, and the runtime's calls (``load_batch_to_runtime``, ``run_batch``,
``send_outputs_from_runtime``) made by the test, or by a real ``BatchingRuntime`` thread. In the server the
handlers submit from their own processes; here the pools' submission queues are thread queues, so that a
future set by the runtime is the test's own object (hivemind's MPFuture answers its process of origin directly).
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch

from petals_chain import defaults
from petals_chain.server.batching import (_PETALS_SHORT_STEP, BatchingConfig, BatchingInferencePool, BatchingRuntime,
                                          install_batching, merge_batching_pools_inplace,
                                          route_long_steps_to_merged_pool)
from petals_chain.server.random_span import (TINY, allocate_session, inference_infos, llama_config, random_backends,
                                             submit_in_process)

MAX_LENGTH = 32
N_BLOCKS = 2
NO_HYPO = torch.empty(0, dtype=torch.int64)
TOL = 1e-4


def _backends(config: BatchingConfig, seed: int = 0) -> dict:
    torch.set_num_threads(1)
    backends = random_backends(llama_config(TINY), N_BLOCKS, seed=seed)
    merge_batching_pools_inplace(backends, config)
    submit_in_process(backends)
    return backends


@contextlib.contextmanager
def _started_pool(config: BatchingConfig):
    """A batching pool over fresh backends, its prioritizer thread running; stopped after."""
    backends = _backends(config)
    pool = next(iter(backends.values())).inference_pool
    assert isinstance(pool, BatchingInferencePool)
    pool.start()
    try:
        yield pool, backends
    finally:
        pool.shutdown()
        pool.join(5)
        route_long_steps_to_merged_pool(False)  # merging set PETALS' module for a server process


@pytest.fixture
def pool_and_backends():
    with _started_pool(BatchingConfig(max_sessions=4, window_s=0.0, max_tokens=64)) as out:
        yield out


def _wait_queued(pool: BatchingInferencePool, n: int) -> None:
    """Until the prioritizer thread has moved ``n`` tasks into the ordered queue."""
    deadline = time.monotonic() + 10
    while pool._ordered_tasks.qsize() < n:
        assert time.monotonic() < deadline, "tasks never reached the ordered queue"
        time.sleep(0.001)


def _submit(pool, backends, handles, hidden, prefix: int, priority: float = 1.0, prompt=None):
    infos = inference_infos(backends, handles, prefix)
    return pool.submit_task(hidden, NO_HYPO, infos, *([prompt] * len(infos)), priority=priority)


def _reference(backends, hidden, prefix: int, handles) -> torch.Tensor:
    from petals.server.backend import _MergedInferenceStep

    infos = inference_infos(backends, handles, prefix)
    return _MergedInferenceStep(backends)(hidden.clone(), NO_HYPO, infos, *([None] * len(infos)))[0]


def _run(pool: BatchingInferencePool) -> int:
    """What the runtime does for one batch; returns how many tasks it held."""
    uid, (batch,) = pool.load_batch_to_runtime()
    results, _ = pool.run_batch(batch, uid)
    pool.send_outputs_from_runtime(uid, results)
    return len(batch)


def test_compatible_steps_run_as_one_batch_and_each_future_gets_its_own(pool_and_backends) -> None:
    """Three sessions (a prefill, and two decodes at different lengths) in one batch: each future holds exactly
    PETALS' output for its own session, the counting pipe is drained and the histogram counts one step of 3."""
    pool, backends = pool_and_backends
    torch.manual_seed(0)
    sessions = [(allocate_session(backends, 1, MAX_LENGTH), allocate_session(backends, 1, MAX_LENGTH))
                for _ in range(3)]
    prefills = [torch.randn(1, n, TINY.hidden) for n in (5, 3, 9)]
    for (bat, ref), h in zip(sessions, prefills):  # bring both caches of each session to its length
        _reference(backends, h, 0, ref)
        _reference(backends, h, 0, bat)
    steps = [torch.randn(1, n, TINY.hidden) for n in (1, 1, 4)]
    futures = [_submit(pool, backends, bat, h, len(p[0])) for (bat, _), h, p in zip(sessions, steps, prefills)]
    _wait_queued(pool, 3)
    assert _run(pool) == 3
    assert pool.empty and pool.sessions_per_step == {3: 1}
    for fut, (_, ref), h, p in zip(futures, sessions, steps, prefills):
        (got,) = fut.result(5)
        want = _reference(backends, h, p.shape[1], ref)
        assert (got - want).abs().max().item() < TOL


def test_what_cannot_join_stays_queued_in_order_and_priority_follows_the_head(pool_and_backends) -> None:
    """A deep-prompt step and a step over other blocks do not join; the session cap holds; the pool's priority is
    the remaining head's, and the left-over tasks are loaded next, one by one, in priority order."""
    pool, backends = pool_and_backends
    uids = list(backends)
    handles = [allocate_session(backends, 1, MAX_LENGTH) for _ in range(7)]
    h = torch.randn(1, 2, TINY.hidden)
    normal = [_submit(pool, backends, handles[i], h, 0) for i in range(5)]  # 5 > max_sessions = 4
    prompt = torch.zeros(1, 1, TINY.hidden)
    deep = _submit(pool, backends, handles[5], h, 0, priority=1.5, prompt=prompt)
    sub = {uids[0]: backends[uids[0]]}
    other = pool.submit_task(h, NO_HYPO, inference_infos(sub, handles[6][:1], 0), None, priority=2.0)
    _wait_queued(pool, 7)
    assert _run(pool) == 4
    left = sorted(pool._ordered_tasks.queue)
    assert len(left) == 3 and pool.priority == (left[0].priority, left[0].time_submitted)
    assert [_run(pool) for _ in range(3)] == [1, 1, 1]
    assert pool.empty
    for fut in [*normal, deep, other]:
        assert fut.result(5)[0].shape == h.shape


def test_token_cap_and_one_session_per_batch() -> None:
    """Steps beyond the tokens-per-step cap wait for the next batch (chunks of 64: these steps run whole), and a
    session's second step never joins its first."""
    with _started_pool(BatchingConfig(max_sessions=4, window_s=0.0, max_tokens=64, prefill_chunk_tokens=64)) as out:
        pool, backends = out
        a, b = (allocate_session(backends, 1, 2 * MAX_LENGTH) for _ in range(2))
        big = torch.randn(1, 40, TINY.hidden)
        f1 = _submit(pool, backends, a, big, 0)
        f2 = _submit(pool, backends, b, big, 0)  # 80 > max_tokens = 64
        f3 = _submit(pool, backends, a, torch.randn(1, 1, TINY.hidden), 40)  # same session as f1
        _wait_queued(pool, 3)
        assert _run(pool) == 1
        assert _run(pool) == 2  # b's prefill and a's decode (different sessions, 41 tokens)
        for f in (f1, f2, f3):
            f.result(5)
        assert pool.chunks_run == 0


def test_a_bad_session_fails_only_itself(pool_and_backends) -> None:
    """One session's step overruns its cache: the batch is retried one session at a time, that session's future
    gets the error and the others get PETALS' outputs."""
    pool, backends = pool_and_backends
    good = [allocate_session(backends, 1, MAX_LENGTH) for _ in range(2)]
    bad = allocate_session(backends, 1, 8)  # 8 positions: a 12-token step cannot fit
    refs = [allocate_session(backends, 1, MAX_LENGTH) for _ in range(2)]
    hs = [torch.randn(1, 3, TINY.hidden) for _ in range(2)]
    futures = [_submit(pool, backends, g, h, 0) for g, h in zip(good, hs)]
    f_bad = _submit(pool, backends, bad, torch.randn(1, 12, TINY.hidden), 0)
    _wait_queued(pool, 3)
    assert _run(pool) == 3
    assert pool.retried_batches == 1
    with pytest.raises(Exception):
        f_bad.result(5)
    for fut, ref, h in zip(futures, refs, hs):
        assert (fut.result(5)[0] - _reference(backends, h, 0, ref)).abs().max().item() < TOL


def test_long_step_runs_in_chunks_beside_decodes() -> None:
    """A 100-token prefill (budget 64, chunks of up to 64) runs in chunks: the first beside two decodes that take
    their 2 tokens and leave it the other 62, the rest (38) next; no batch exceeds the budget; the prefill's future
    gets the whole output, equal to PETALS' step over all 100 tokens, and the cache it left serves the next decode as
    PETALS' cache does."""
    with _started_pool(BatchingConfig(max_sessions=4, window_s=0.0, max_tokens=64, prefill_chunk_tokens=64)) as out:
        _long_step_beside_decodes(*out)


def _long_step_beside_decodes(pool: BatchingInferencePool, backends: dict) -> None:
    torch.manual_seed(3)
    long_len = 100
    bat, ref = allocate_session(backends, 1, 128), allocate_session(backends, 1, 128)
    decoders = [tuple(allocate_session(backends, 1, MAX_LENGTH) for _ in range(2)) for _ in range(2)]
    for d_bat, d_ref in decoders:
        h = torch.randn(1, 4, TINY.hidden)
        _reference(backends, h, 0, d_bat)
        _reference(backends, h, 0, d_ref)
    prompt = torch.randn(1, long_len, TINY.hidden)
    f_long = _submit(pool, backends, bat, prompt, 0)
    steps = [torch.randn(1, 1, TINY.hidden) for _ in decoders]
    f_dec = [_submit(pool, backends, d_bat, h, 4) for (d_bat, _), h in zip(decoders, steps)]
    _wait_queued(pool, 3)
    sizes = []
    while not pool.empty:
        uid, (batch,) = pool.load_batch_to_runtime()
        results, tokens = pool.run_batch(batch, uid)
        pool.send_outputs_from_runtime(uid, results)
        sizes.append((len(batch), tokens))
    assert sizes == [(3, 64), (1, 38)], sizes
    assert pool.chunks_run == 2 and not pool._partial
    (got,) = f_long.result(5)
    assert got.shape == prompt.shape
    assert (got - _reference(backends, prompt, 0, ref)).abs().max().item() < TOL
    for fut, (_, d_ref), h in zip(f_dec, decoders, steps):
        assert (fut.result(5)[0] - _reference(backends, h, 4, d_ref)).abs().max().item() < TOL
    nxt = torch.randn(1, 1, TINY.hidden)
    f_next = _submit(pool, backends, bat, nxt, long_len)
    _wait_queued(pool, 1)
    assert _run(pool) == 1
    assert (f_next.result(5)[0] - _reference(backends, nxt, long_len, ref)).abs().max().item() < TOL


def test_chunks_one_long_step_per_batch_within_the_budget() -> None:
    """Budget 64, chunks of 32 (the reserve for a long step: 32): two 40-token prompts never share a batch as two
    long steps; the first's last 8 tokens run whole beside the second's first chunk; a long step joins short steps
    while they leave it 32 tokens and takes at most 32; behind 40 tokens of short steps it waits."""
    with _started_pool(BatchingConfig(max_sessions=4, window_s=0.0, max_tokens=64, prefill_chunk_tokens=32)) as out:
        pool, backends = out
        s = [allocate_session(backends, 1, 128) for _ in range(7)]

        def submit(i: int, n: int):
            return _submit(pool, backends, s[i], torch.randn(1, n, TINY.hidden), 0)

        def batch_lengths() -> list[int]:
            uid, (batch,) = pool.load_batch_to_runtime()
            pool.send_outputs_from_runtime(uid, pool.run_batch(batch, uid)[0])
            return sorted(a[0].shape[1] for a in batch)

        futures = [submit(0, 40), submit(1, 40)]
        _wait_queued(pool, 2)
        assert [batch_lengths() for _ in range(3)] == [[32], [8, 32], [8]]
        futures += [submit(2, 30), submit(3, 50)]
        _wait_queued(pool, 2)
        assert [batch_lengths() for _ in range(2)] == [[30, 32], [18]]
        futures += [submit(4, 20), submit(5, 20), submit(6, 50)]
        _wait_queued(pool, 3)
        assert [batch_lengths() for _ in range(3)] == [[20, 20], [32], [18]]
        for fut in futures:
            assert fut.result(5)[0].shape[1] in (20, 30, 40, 50)
        assert pool.empty and not pool._partial and pool.chunks_run == 8  # two chunks each of 40, 40, 50, 50


def test_runtime_serves_a_chunked_prefill_beside_decoding_sessions() -> None:
    """PETALS' runtime loop (our runtime class, its output senders in other threads): a 90-token prefill at
    max_tokens 32 goes in chunks while three sessions decode; every output equals PETALS' step."""
    backends = _backends(BatchingConfig(max_sessions=8, window_s=0.005, max_tokens=32))  # chunks of 32 (the CPU's)
    runtime = BatchingRuntime(backends, device=None, prefetch_batches=1)
    pool = next(iter(backends.values())).inference_pool
    assert pool.config.prefill_chunk_tokens == defaults.PREFILL_CHUNK_TOKENS_CPU
    runtime.start()
    assert runtime.ready.wait(10)
    try:
        torch.manual_seed(4)
        inputs = [[torch.randn(1, 90, TINY.hidden), torch.randn(1, 1, TINY.hidden)]]
        inputs += [[torch.randn(1, 3 if t == 0 else 1, TINY.hidden) for t in range(6)] for _ in range(3)]
        outs: dict[int, list[torch.Tensor]] = {}

        def session(i: int) -> None:
            handles = allocate_session(backends, 1, 128)
            pos, got = 0, []
            for h in inputs[i]:
                got.append(_submit(pool, backends, handles, h, pos).result(60)[0])
                pos += h.shape[1]
            outs[i] = got

        threads = [threading.Thread(target=session, args=(i,)) for i in range(len(inputs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for i, steps in enumerate(inputs):
            ref, pos = allocate_session(backends, 1, 128), 0
            for h, got in zip(steps, outs[i]):
                assert (got - _reference(backends, h, pos, ref)).abs().max().item() < TOL
                pos += h.shape[1]
        assert pool.chunks_run >= 3, pool.chunks_run
    finally:
        runtime.shutdown()


def test_window_waits_only_for_sessions_of_recent_batches() -> None:
    """After a batch of sessions A and B, a step of A waits (up to the window) for B's and they run together;
    sessions that left are waited for only while they were in the last two batches."""
    backends = _backends(BatchingConfig(max_sessions=4, window_s=0.5, max_tokens=64))
    pool = next(iter(backends.values())).inference_pool
    pool.start()
    try:
        a, b, c = (allocate_session(backends, 1, MAX_LENGTH) for _ in range(3))
        h = torch.randn(1, 1, TINY.hidden)
        _submit(pool, backends, a, h, 0)
        _submit(pool, backends, b, h, 0)
        _wait_queued(pool, 2)
        assert _run(pool) == 2
        _submit(pool, backends, a, h, 1)
        late = threading.Timer(0.2, lambda: _submit(pool, backends, b, h, 1))
        late.start()
        t0 = time.monotonic()
        assert _run(pool) == 2
        assert 0.15 < time.monotonic() - t0 < 0.45
        late.join()
        # A and B leave; C steps alone: it waits for them while they were in the last two batches, then never
        waited = []
        for pos in range(4):
            _submit(pool, backends, c, h, pos)
            t0 = time.monotonic()
            assert _run(pool) == 1
            waited.append(time.monotonic() - t0)
        assert min(waited[:2]) > 0.4 and max(waited[2:]) < 0.2, waited
    finally:
        pool.shutdown()
        pool.join(5)


@pytest.mark.parametrize("b_after, together", [(0.5, False), (0.08, True)])
def test_window_waits_only_for_sessions_due_within_it(b_after: float, together: bool) -> None:
    """Two sessions stepping every second, B ``b_after`` s after A (window 0.2 s). Once B's period is known (third
    round on), A's step waits for B only if B's next step is due within the window plus a window's margin: 0.5 s
    after (a step apart, as on a chain behind round trips) A runs at once and alone; 0.08 s after, A waits and they
    run together."""
    with _started_pool(BatchingConfig(max_sessions=4, window_s=0.2, max_tokens=64)) as (pool, backends):
        a, b = (allocate_session(backends, 1, MAX_LENGTH) for _ in range(2))
        h = torch.randn(1, 1, TINY.hidden)
        start, rounds, waits, sizes = time.monotonic(), 5, [], []
        for r in range(rounds):
            time.sleep(max(0.0, start + 1.0 * r - time.monotonic()))
            _submit(pool, backends, a, h, r)
            timer = threading.Timer(b_after, lambda r=r: _submit(pool, backends, b, h, r))
            timer.start()
            _wait_queued(pool, 1)
            t0 = time.monotonic()
            uid, (batch,) = pool.load_batch_to_runtime()
            waits.append(time.monotonic() - t0)
            sizes.append(len(batch))
            pool.send_outputs_from_runtime(uid, pool.run_batch(batch, uid)[0])
            timer.join()
            if len(batch) == 1:  # B's step on its own
                _wait_queued(pool, 1)
                _run(pool)
        print(f"B {b_after} s after A: A's waits {[round(w, 3) for w in waits]}, sessions per A's batch {sizes}")
        if together:
            assert sizes[2:] == [2] * (rounds - 2)
        else:
            assert sizes[2:] == [1] * (rounds - 2) and max(waits[2:]) < 0.1, waits


def test_runtime_serves_concurrent_sessions_and_forward_pools_still_work() -> None:
    """PETALS' runtime loop with our runtime class: concurrent decoding sessions get PETALS' outputs, steps were
    batched, the runtime loads without prefetching, and a forward-pool task (PETALS' own pool) is answered too."""
    backends = _backends(BatchingConfig(max_sessions=8, window_s=0.01, max_tokens=64))
    runtime = BatchingRuntime(backends, device=None, prefetch_batches=1)
    assert runtime.prefetch_batches == 0
    pool = next(iter(backends.values())).inference_pool
    runtime.start()
    assert runtime.ready.wait(10)
    try:
        n, steps = 4, 5
        torch.manual_seed(1)
        inputs = [[torch.randn(1, 3 if t == 0 else 1, TINY.hidden) for t in range(steps)] for _ in range(n)]
        outs: dict[int, list[torch.Tensor]] = {}

        def session(i: int) -> None:
            handles = allocate_session(backends, 1, MAX_LENGTH)
            pos, got = 0, []
            for h in inputs[i]:
                got.append(_submit(pool, backends, handles, h, pos).result(30)[0])
                pos += h.shape[1]
            outs[i] = got

        threads = [threading.Thread(target=session, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        fwd = next(iter(backends.values())).forward_pool.submit_task(torch.randn(1, 2, TINY.hidden), None)
        for t in threads:
            t.join(60)
        assert fwd.result(30)[0].shape == (1, 2, TINY.hidden)
        for i in range(n):
            ref, pos = allocate_session(backends, 1, MAX_LENGTH), 0
            for h, got in zip(inputs[i], outs[i]):
                assert (got - _reference(backends, h, pos, ref)).abs().max().item() < TOL
                pos += h.shape[1]
        assert max(pool.sessions_per_step) > 1, pool.sessions_per_step
    finally:
        runtime.shutdown()


def test_install_swaps_petals_internals_and_one_session_restores_them() -> None:
    import petals.server.backend as petals_backend
    import petals.server.block_functions as block_functions
    import petals.server.server as petals_server

    original_runtime = petals_server.RuntimeWithDeduplicatedPools
    try:
        install_batching(BatchingConfig(max_sessions=4))
        assert petals_server.RuntimeWithDeduplicatedPools is BatchingRuntime
        assert petals_server.merge_inference_pools_inplace is not petals_backend.merge_inference_pools_inplace
        _backends(BatchingConfig(max_sessions=4))  # a batching pool: every step goes to it, long ones in chunks
        assert block_functions.MAX_SHORT_INFERENCE_TOKENS > 10**9
        install_batching(BatchingConfig(max_sessions=1))
        assert petals_server.RuntimeWithDeduplicatedPools is original_runtime
        assert petals_server.merge_inference_pools_inplace is petals_backend.merge_inference_pools_inplace
        assert block_functions.MAX_SHORT_INFERENCE_TOKENS == 128  # PETALS' own limit (and NF4's) is back
        assert block_functions.MAX_NF4_SHORT_INFERENCE_TOKENS == _PETALS_SHORT_STEP["MAX_NF4_SHORT_INFERENCE_TOKENS"]
    finally:
        install_batching(BatchingConfig(max_sessions=1))


def test_one_session_config_builds_petals_own_pool() -> None:
    from petals.server.task_pool import PrioritizedTaskPool

    backends = _backends(BatchingConfig(max_sessions=1))
    pool = next(iter(backends.values())).inference_pool
    assert type(pool) is PrioritizedTaskPool


@pytest.mark.parametrize("kwargs", [dict(max_sessions=0), dict(max_tokens=0), dict(window_s=-1.0),
                                    dict(window_s=float("nan")), dict(bare_probe_every=-1)])
def test_bad_config_is_refused(kwargs) -> None:
    with pytest.raises(ValueError):
        BatchingConfig(**kwargs)


def test_bare_probe_logs_the_bare_forward_beside_every_nth_decode_batch(tmp_path) -> None:
    """--bare-probe-every 2 with a step log: of four decode batches of two sessions, the 2nd and the 4th carry a
    bare time (> 0) beside their own, the others and a prefill batch none; the sessions' outputs are PETALS' and
    their caches are untouched by the probe (the next step still matches the reference)."""
    from petals_chain.launch.profile_fit import read_step_log

    log = tmp_path / "steps.csv"
    config = BatchingConfig(max_sessions=4, window_s=0.0, max_tokens=64, step_log=str(log), bare_probe_every=2)
    with _started_pool(config) as (pool, backends):
        torch.manual_seed(1)
        sessions = [(allocate_session(backends, 1, MAX_LENGTH), allocate_session(backends, 1, MAX_LENGTH))
                    for _ in range(2)]
        prompts = [torch.randn(1, n, TINY.hidden) for n in (4, 6)]
        futures = [_submit(pool, backends, bat, h, 0) for (bat, _), h in zip(sessions, prompts)]
        _wait_queued(pool, 2)
        assert _run(pool) == 2
        for (_, ref), h, fut in zip(sessions, prompts, futures):
            want = _reference(backends, h, 0, ref)
            assert (fut.result(5)[0] - want).abs().max().item() < TOL
        lengths = [4, 6]
        for _ in range(4):
            steps = [torch.randn(1, 1, TINY.hidden) for _ in sessions]
            futures = [_submit(pool, backends, bat, h, n) for (bat, _), h, n in zip(sessions, steps, lengths)]
            _wait_queued(pool, 2)
            assert _run(pool) == 2
            for (_, ref), h, n, fut in zip(sessions, steps, lengths, futures):
                want = _reference(backends, h, n, ref)
                assert (fut.result(5)[0] - want).abs().max().item() < TOL
            lengths = [n + 1 for n in lengths]
    rows = read_step_log(log)
    assert [(r.sessions, r.tokens) for r in rows] == [(2, 10)] + [(2, 2)] * 4
    probed = [r.bare_seconds is not None for r in rows]
    assert probed == [False, False, True, False, True]
    assert all(r.bare_seconds > 0 for r in rows if r.bare_seconds is not None)


def test_bare_probe_stays_off_without_a_step_log(monkeypatch) -> None:
    """The probe writes only to the step log: with none, the pool runs no probe forwards at all."""
    from petals_chain.server.batching import STEP_LOG_ENV

    monkeypatch.delenv(STEP_LOG_ENV, raising=False)
    backends = _backends(BatchingConfig(max_sessions=4, window_s=0.0, bare_probe_every=2))
    try:
        pool = next(iter(backends.values())).inference_pool
        assert pool.step_log is None and pool.bare_probe is None
    finally:
        route_long_steps_to_merged_pool(False)
