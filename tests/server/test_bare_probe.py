"""The bare-forward probe (server/bare_probe.py): which batches it mirrors, what it runs, its scratch memory, and
the step log's bare column (read back, old three-column logs included, malformed rows refused)."""

from __future__ import annotations

import pytest
import torch

from petals_chain.launch.profile_fit import read_step_log
from petals_chain.server.bare_probe import BareProbe
from petals_chain.server.batched_step import BatchedMergedInferenceStep
from petals_chain.server.batching import StepLog
from petals_chain.server.random_span import TINY, allocate_session, inference_infos, llama_config, random_backends
from petals_chain.model import SpecError

MAX_LENGTH = 64
NO_HYPO = torch.empty(0, dtype=torch.int64)


@pytest.fixture(scope="module")
def backends() -> dict:
    torch.set_num_threads(1)
    return random_backends(llama_config(TINY), 2, seed=0)


def _args(backends: dict, handles, tokens: int, prefix: int, rows: int = 1) -> tuple:
    return (torch.randn(rows, tokens, TINY.hidden), NO_HYPO, inference_infos(backends, handles, prefix))


def test_it_mirrors_decode_batches_only(backends) -> None:
    """Decode steps over one span: (span, rows over all hypotheses, mean context); a prefill or verification step,
    or a batch over two spans, is not mirrored."""
    a, b = (allocate_session(backends, 1, MAX_LENGTH) for _ in range(2))
    wide = allocate_session(backends, 2, MAX_LENGTH)
    uids = tuple(backends)
    plan = BareProbe.decode_rows([_args(backends, a, 1, 10), _args(backends, b, 1, 31),
                                  _args(backends, wide, 1, 20, rows=2)])
    assert plan == (uids, 4, round((10 + 31 + 2 * 20) / 4))
    assert BareProbe.decode_rows([_args(backends, a, 1, 10), _args(backends, b, 3, 12)]) is None
    first = dict(list(backends.items())[:1])
    assert BareProbe.decode_rows([_args(backends, a, 1, 10), _args(first, b[:1], 1, 12)]) is None
    assert BareProbe.decode_rows([]) is None


def test_every_nth_decode_is_timed_on_scratch_caches_that_only_grow(backends) -> None:
    """every=3: the 3rd and 6th decode batch are timed (prefills do not count); the sessions' own caches are not
    written; the scratch grows to powers of two for more rows or a longer context and is then reused."""
    merged = BatchedMergedInferenceStep(backends)
    probe = BareProbe(merged, every=3)
    a, b = (allocate_session(backends, 1, MAX_LENGTH) for _ in range(2))
    handles = [h for session in (a, b) for block in session for h in block]
    with merged.memory_cache.use_cache(*handles) as tensors:
        before = [t.clone() for t in tensors]
    decode = [_args(backends, a, 1, 10), _args(backends, b, 1, 14)]
    got = [probe.after(decode), probe.after([_args(backends, a, 5, 0)]), probe.after(decode), probe.after(decode)]
    assert got[:3] == [None, None, None] and got[3] is not None and got[3] > 0
    with merged.memory_cache.use_cache(*handles) as tensors:
        assert all(torch.equal(x, y) for x, y in zip(before, tensors))
    (keys, values) = probe._scratch[tuple(backends)][0]
    assert keys.shape[0] == 2 and keys.shape[-1] == 16 and values.shape[2] == 16  # mean context 12 + 1 → 16
    three = decode + [_args(backends, allocate_session(backends, 1, MAX_LENGTH), 1, 40)]
    assert probe.after(three) is None and probe.after(three) is None
    assert probe.after(three) > 0
    (keys, _) = probe._scratch[tuple(backends)][0]
    assert keys.shape[0] == 4 and keys.shape[-1] == 32  # 3 rows → 4; mean context 21 + 1 → 32
    assert probe.after(decode) is None and probe.after(decode) is None and probe.after(decode) > 0
    assert probe._scratch[tuple(backends)][0][0] is keys  # smaller batches reuse the larger scratch


def test_a_bad_period_is_refused(backends) -> None:
    with pytest.raises(ValueError, match="N >= 1"):
        BareProbe(BatchedMergedInferenceStep(backends), every=0)


def test_step_log_round_trip_with_and_without_the_bare_column(tmp_path) -> None:
    path = tmp_path / "steps.csv"
    log = StepLog(str(path))
    log.write(2, 2, 0.01)
    log.write(3, 3, 0.02, 0.015)
    rows = read_step_log(path)
    assert [(r.sessions, r.tokens, r.seconds, r.bare_seconds) for r in rows] == [(2, 2, 0.01, None),
                                                                                  (3, 3, 0.02, 0.015)]
    old = tmp_path / "old.csv"
    old.write_text("sessions,tokens,seconds\n1,1,0.5\n")
    assert read_step_log(old)[0].bare_seconds is None and read_step_log(old)[0].seconds == 0.5
    bad = tmp_path / "bad.csv"
    bad.write_text("sessions,tokens,seconds,bare_seconds\n1,1,0.5,0.1,9\n")
    with pytest.raises(SpecError, match="bad.csv:2"):
        read_step_log(bad)


def test_bench_server_reports_the_paired_in_server_ratio() -> None:
    """``bench server``'s inside table: per server and k, the probed batches' count and the mean of their paired
    bare/step ratios with its interval; cells without a probe say so."""
    from petals_chain.bench.server import _inside_table

    rows = [("s0", 2, 0.010, 0.008), ("s0", 2, 0.010, None), ("s0", 2, 0.020, 0.018), ("s0", 3, 0.012, None)]
    step = {(30, 100, 2): {"a": 50.0, "c": 250.0}}
    lines = _inside_table(rows, {"s0": 30}, step, 128, 100)
    assert len(lines) == 2
    two, three = lines
    assert two.split("|")[-1].split()[:2] == ["2", "0.85"]  # (0.8 + 0.9) / 2 over the 2 probed batches
    assert " 0.80 " in two.split("|")[3]  # in process: 2 / 0.010 = 200 tokens/s against a bare 250
    assert three.split("|")[-1].split()[:2] == ["0", "-"]


def test_bench_server_pools_the_probe_by_bands_of_k() -> None:
    from petals_chain.bench.server import _probe_bands

    rows = [("s0", 1, 0.01, 0.009), ("s0", 3, 0.01, 0.008), ("s0", 4, 0.02, 0.018), ("s0", 4, 0.02, None),
            ("s0", 12, 0.05, 0.04)]
    text = _probe_bands(rows)
    assert text.startswith("k 1: 1 batches, 0.90 ± nan; k 3-4: 2 batches, 0.85 ± ")
    assert text.endswith("k 9-16: 1 batches, 0.80 ± nan")
    assert _probe_bands([("s0", 2, 0.01, None)]) == "no batch probed"
