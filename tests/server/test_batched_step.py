"""The batched step equals PETALS' own one-session-at-a-time step, outputs and caches, for mixed sessions.

Reference: PETALS' ``_MergedInferenceStep`` (what the server's merged inference pool runs for one session's
step) over the same ``TransformerBackend``s; every session has two caches, one advanced by the reference, one by
the batched step, and both must agree after every round. Float32, tiny random-weight LLaMA blocks.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch

from petals_chain.server import batched_step as batched_step_module
from petals_chain.server.batched_step import BatchedMergedInferenceStep, BatchedSpanStep, SessionStep, arena_rows
from petals_chain.server.random_span import TINY, allocate_session, inference_infos, llama_config, random_backends

TOL = 1e-4  # float32; observed differences are ~1e-6 (summation order of packed vs single-session matmuls)
MAX_LENGTH = 48
N_BLOCKS = 3
NO_HYPO = torch.empty(0, dtype=torch.int64)


@pytest.fixture(scope="module")
def backends():
    torch.set_num_threads(1)
    return random_backends(llama_config(TINY), N_BLOCKS, seed=0)


@dataclass
class Session:
    """A session with a reference cache and a batched cache, and its length so far."""

    ref: tuple
    bat: tuple
    batch: int = 1
    length: int = 0


def _reference(backends, hidden, hypo_ids, infos) -> torch.Tensor:
    from petals.server.backend import _MergedInferenceStep

    return _MergedInferenceStep(backends)(hidden.clone(), hypo_ids, infos, *([None] * len(infos)))[0]


def _cache_diff(backends, session: Session) -> float:
    cache = next(iter(backends.values())).memory_cache
    ref = [h for hs in session.ref for h in hs]
    bat = [h for hs in session.bat for h in hs]
    with cache.use_cache(*ref) as a, cache.use_cache(*bat) as b:  # keys then values of each block
        n = session.length
        return max((x[..., :n] - y[..., :n] if i % 2 == 0 else x[:, :, :n] - y[:, :, :n]).abs().max().item()
                   for i, (x, y) in enumerate(zip(a, b)))


def _plan(rng: random.Random, s: Session) -> tuple[int, int] | None:
    """(prefix_length, new tokens) of this session's next step, or None when it sits this round out."""
    if s.length == 0:
        return 0, rng.randint(2, 12)  # prefill
    kind = rng.choice(["decode", "decode", "verify", "rollback", "idle"])
    room = MAX_LENGTH - s.length
    if kind == "idle" or room < 1:
        return None if room >= 1 else (rng.randint(0, s.length - 1), 1)
    if kind == "decode":
        return s.length, 1
    if kind == "verify":
        return s.length, rng.randint(2, min(5, room))
    back = rng.randint(0, s.length - 1)  # rollback to an earlier position, then a speculative width of tokens
    return back, rng.randint(1, min(5, MAX_LENGTH - back))


@pytest.mark.parametrize("attention", ["per_session", "gathered"])
@pytest.mark.parametrize("n_sessions", [1, 2, 4, 8])
@pytest.mark.parametrize("seed", [0, 1])
def test_mixed_sessions_equal_petals_step(backends, n_sessions: int, seed: int, attention: str) -> None:
    """Random rounds of prefill, decode, k > 1 verification and rollback; outputs and caches equal PETALS'."""
    rng = random.Random(seed * 100 + n_sessions)
    torch.manual_seed(seed)
    sessions = [Session(allocate_session(backends, 1, MAX_LENGTH), allocate_session(backends, 1, MAX_LENGTH))
                for _ in range(n_sessions)]
    batched = BatchedMergedInferenceStep(backends, attention=attention)
    worst_out = worst_cache = 0.0
    kinds: set[str] = set()
    for _ in range(8):
        requests, expected, members = [], [], []
        for s in sessions:
            plan = _plan(rng, s)
            if plan is None:
                continue
            prefix, n = plan
            kinds.add("prefill" if s.length == 0 else "rollback" if prefix < s.length else
                      "decode" if n == 1 else "verify")
            hidden = torch.randn(s.batch, n, TINY.hidden)
            expected.append(_reference(backends, hidden, NO_HYPO, inference_infos(backends, s.ref, prefix)))
            requests.append((hidden.clone(), NO_HYPO, inference_infos(backends, s.bat, prefix)))
            members.append(s)
            s.length = prefix + n
        if not requests:
            continue
        rng.shuffle(order := list(range(len(requests))))  # the batch's order must not matter
        outputs = batched([requests[i] for i in order])
        for pos, i in enumerate(order):
            worst_out = max(worst_out, (outputs[pos] - expected[i]).abs().max().item())
        worst_cache = max(worst_cache, *(_cache_diff(backends, s) for s in members))
    print(f"{n_sessions} sessions, seed {seed}, steps {sorted(kinds)}: max |Δ output| {worst_out:.2e},"
          f" max |Δ cache| {worst_cache:.2e}")
    assert worst_out < TOL and worst_cache < TOL
    if n_sessions >= 4:
        assert {"prefill", "decode"} <= kinds


def _prefill_then_decode(backends, sessions: list[Session], batched, prefills, rounds: int,
                         order: list[int]) -> tuple[float, float]:
    """Each session's prefill alone, then ``rounds`` decode rounds of all sessions together through ``batched``,
    against PETALS' step on the reference caches; the session of 3 hypotheses is reordered by ``order`` every other
    round. Returns the largest output and cache differences."""
    for s, n in zip(sessions, prefills):
        hidden = torch.randn(s.batch, n, TINY.hidden)
        _reference(backends, hidden, NO_HYPO, inference_infos(backends, s.ref, 0))
        batched([(hidden.clone(), NO_HYPO, inference_infos(backends, s.bat, 0))])
        s.length = n
    worst = 0.0
    for round_ in range(rounds):
        requests, expected = [], []
        for s in sessions:
            ids = torch.tensor(order) if s.batch == 3 and round_ % 2 else NO_HYPO
            hidden = torch.randn(s.batch, 1, TINY.hidden)
            expected.append(_reference(backends, hidden, ids, inference_infos(backends, s.ref, s.length)))
            requests.append((hidden.clone(), ids, inference_infos(backends, s.bat, s.length)))
            s.length += 1
        for out, exp in zip(batched(requests), expected):
            worst = max(worst, (out - exp).abs().max().item())
    return worst, max(_cache_diff(backends, s) for s in sessions)


def test_gathered_decode_equals_petals_step(backends) -> None:
    """Decode-only rounds of sessions of different lengths (one of 3 hypotheses reordered by hypo_ids) through the
    gathered mechanism (one padded attention for all) equal PETALS' step; the padded path is really taken."""
    torch.manual_seed(5)
    sessions = [Session(allocate_session(backends, b, MAX_LENGTH), allocate_session(backends, b, MAX_LENGTH),
                        batch=b) for b in (1, 3, 1, 1)]
    batched = BatchedMergedInferenceStep(backends, attention="gathered")
    span = batched._span_step(tuple(backends))
    gathered_calls = []
    real = span._attend_gathered
    span._attend_gathered = lambda *a: gathered_calls.append(1) or real(*a)
    worst, worst_cache = _prefill_then_decode(backends, sessions, batched, (2, 9, 17, 30), 6, [2, 0, 1])
    print(f"gathered decode: max |Δ output| {worst:.2e}, max |Δ cache| {worst_cache:.2e}")
    assert len(gathered_calls) == 6 * N_BLOCKS  # every layer of every decode round took the padded path
    assert worst < TOL and worst_cache < TOL


def _arenas(backends, slots: int, max_length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One keys and one values arena per block, ``slots`` rows of ``max_length`` positions (PETALS' layout)."""
    descr = next(iter(backends.values())).get_inference_cache_descriptors
    return [tuple(d.make_zeros() for d in descr(slots, max_length)) for _ in backends]


def _arena_session(backends, arenas, slot: int, batch: int, length: int) -> tuple:
    """A session's cache handles: rows ``slot ... slot + batch - 1`` of every block's arenas, ``length`` long."""
    cache = next(iter(backends.values())).memory_cache
    return tuple(cache.adopt([ak[slot:slot + batch, :, :, :length], av[slot:slot + batch, :, :length]])
                 for ak, av in arenas)


@pytest.mark.parametrize("slots, in_place, exact", [
    ((5, 0, 9, 7), True, False),  # rows 0-2, 5, 7, 9: over half of 0..9 in use, attention over the range in place
    ((0, 1, 4, 5), True, True),  # rows 0..5 in the batch's order: the range is the batch
    ((30, 0, 20, 11), False, False),  # rows spread over 0..30: gathered by one indexed copy
])
def test_arena_decode_equals_petals_step(backends, monkeypatch, slots, in_place: bool, exact: bool) -> None:
    """Sessions whose caches are rows of one arena per block (slots in any order, different lengths, one of 3
    hypotheses): the gathered step writes them by index and reads them in place or by one indexed copy, and equals
    PETALS' step on separate caches."""
    torch.manual_seed(6)
    arenas = _arenas(backends, 32, MAX_LENGTH)
    lengths = (MAX_LENGTH, 40, MAX_LENGTH, 36)
    layout = [(slot, 3 if i == 1 else 1, length) for i, (slot, length) in enumerate(zip(slots, lengths))]
    sessions = [Session(allocate_session(backends, b, MAX_LENGTH), _arena_session(backends, arenas, slot, b, length),
                        batch=b) for slot, b, length in layout]
    batched = BatchedMergedInferenceStep(backends, attention="gathered")
    by_index = []
    real = batched_step_module.arena_rows
    monkeypatch.setattr(batched_step_module, "arena_rows",
                        lambda steps, index: by_index.append(r := real(steps, index)) or r)
    worst, worst_cache = _prefill_then_decode(backends, sessions, batched, (3, 11, 20, 29), 5, [1, 2, 0])
    print(f"arena decode: max |Δ output| {worst:.2e}, max |Δ cache| {worst_cache:.2e}")
    assert by_index and all(r is not None for r in by_index)  # every block of every round went through the arena
    rows = [row for slot, b, _ in layout for row in range(slot, slot + b)]
    assert all(r[2] == rows for r in by_index)
    ak, av = arenas[0]
    probe = [SessionStep(torch.randn(b, 1, TINY.hidden), [(ak[slot:slot + b], av[slot:slot + b])], 4)
             for slot, b, _ in layout]
    plan = batched._span_step(tuple(backends))._gather_plan(probe, torch.zeros(1, TINY.hidden))
    plan.set_rows(rows, torch.device("cpu"))
    assert plan.in_place == in_place and (plan.span_index is None) == (exact or not in_place)
    assert worst < TOL and worst_cache < TOL


@pytest.mark.parametrize("arena", [False, True])
def test_decoders_attend_gathered_beside_a_speculative_session(backends, arena: bool) -> None:
    """A decode batch with a k = 4 verification and a prefill among it (the verifier listed first): the decoding
    sessions still attend gathered, the other two per session, outputs and caches equal PETALS' step, and every
    output comes back in the caller's order."""
    torch.manual_seed(9)
    arenas = _arenas(backends, 8, MAX_LENGTH) if arena else None

    def cache(slot: int):
        return _arena_session(backends, arenas, slot, 1, MAX_LENGTH) if arena else \
            allocate_session(backends, 1, MAX_LENGTH)

    sessions = [Session(allocate_session(backends, 1, MAX_LENGTH), cache(slot)) for slot in range(5)]
    batched = BatchedMergedInferenceStep(backends, attention="gathered")
    span = batched._span_step(tuple(backends))
    covered = []
    real = span._attend_gathered
    span._attend_gathered = lambda q, k, v, steps, *a: covered.append(len(steps)) or real(q, k, v, steps, *a)
    worst = 0.0
    for s, n in zip(sessions[:4], (7, 3, 12, 5)):  # four prefills alone; session 4 joins in round 2
        hidden = torch.randn(1, n, TINY.hidden)
        _reference(backends, hidden, NO_HYPO, inference_infos(backends, s.ref, 0))
        batched([(hidden.clone(), NO_HYPO, inference_infos(backends, s.bat, 0))])
        s.length = n
    for round_, widths in enumerate([(4, 1, 1, 1, 0), (1, 3, 1, 1, 6)]):  # (tokens per session; 0: sits out)
        requests, expected = [], []
        for s, n in zip(sessions, widths):
            if n == 0:
                continue
            hidden = torch.randn(1, n, TINY.hidden)
            expected.append(_reference(backends, hidden, NO_HYPO, inference_infos(backends, s.ref, s.length)))
            requests.append((hidden.clone(), NO_HYPO, inference_infos(backends, s.bat, s.length)))
            s.length += n
        for out, exp in zip(batched(requests), expected):
            assert out.shape == exp.shape
            worst = max(worst, (out - exp).abs().max().item())
    worst_cache = max(_cache_diff(backends, s) for s in sessions)
    print(f"decoders gathered beside a verifier (arena {arena}): max |Δ output| {worst:.2e}, cache {worst_cache:.2e}")
    assert covered == [3] * N_BLOCKS + [3] * N_BLOCKS  # round 1: sessions 1-3 of 4; round 2: 0, 2, 3 of 5
    assert worst < TOL and worst_cache < TOL


def test_arena_rows_recognises_only_slot_views(backends) -> None:
    """Views of one arena's rows are recognised; another arena, an offset inside a row and a plain tensor are not."""
    (ak, av), (bk, bv) = _arenas(backends, 4, 16)[:2]
    one = torch.randn(1, 1, TINY.hidden)

    def step(keys, values):
        return SessionStep(one, [(keys, values)], 0)

    rows = arena_rows([step(ak[2:3, :, :, :8], av[2:3, :, :8]), step(ak[0:2], av[0:2])], 0)
    assert rows is not None and rows[2] == [2, 0, 1]
    assert arena_rows([step(ak[2:3], av[2:3]), step(bk[0:1], bv[0:1])], 0) is None  # two arenas
    assert arena_rows([step(ak[2:3, :, :, 4:8], av[2:3, :, 4:8])], 0) is None  # not at the row's start
    assert arena_rows([step(ak[2:3].clone(), av[2:3].clone())], 0) is None  # not a view


def test_gathered_falls_back_per_session(backends) -> None:
    """The gathered mechanism leaves prefill, verification and too-short caches to the per-session path, and an
    unknown mechanism is refused by name."""
    blocks = [b.module for b in backends.values()]
    step = BatchedSpanStep(blocks, attention="gathered")
    descr = next(iter(backends.values())).get_inference_cache_descriptors
    long_c = [tuple(d.make_zeros() for d in descr(1, 32)) for _ in blocks]
    short_c = [tuple(d.make_zeros() for d in descr(1, 8)) for _ in blocks]
    one = torch.randn(1, 1, TINY.hidden)
    x = one.view(1, -1)
    assert step._gather_plan([SessionStep(one, long_c, 20), SessionStep(one, long_c, 3)], x) is not None
    assert step._gather_plan([SessionStep(one, long_c, 20), SessionStep(one, short_c, 3)], x) is None
    verify = SessionStep(torch.randn(1, 2, TINY.hidden), long_c, 5)
    assert step._gather_plan([verify, SessionStep(one, long_c, 3)], x) is None  # one decoder: nothing to gather
    two = [verify, SessionStep(one, long_c, 3), SessionStep(one, long_c, 9)]
    assert step._gather_plan(two, x) is None  # the decoders must lead the packed rows ...
    plan = step._gather_plan([two[i] for i in step._packing_order(two, x.device)], x)  # ... as the step packs them
    assert plan is not None and (plan.sessions, plan.tokens, plan.longest) == (2, 2, 10)
    assert BatchedSpanStep(blocks, attention="auto")._gather_plan(
        [SessionStep(one, long_c, 20), SessionStep(one, long_c, 3)], x) is None  # auto: per session on a CPU
    with pytest.raises(ValueError, match="attention must be one of"):
        BatchedSpanStep(blocks, attention="paged")


def test_beams_reorder_like_petals(backends) -> None:
    """Sessions of several hypotheses with hypo_ids beside a greedy one: caches reordered as PETALS does."""
    torch.manual_seed(3)
    beams = Session(allocate_session(backends, 3, MAX_LENGTH), allocate_session(backends, 3, MAX_LENGTH), batch=3)
    greedy = Session(allocate_session(backends, 1, MAX_LENGTH), allocate_session(backends, 1, MAX_LENGTH))
    batched = BatchedMergedInferenceStep(backends)
    worst = 0.0
    for step, hypo in enumerate([NO_HYPO, torch.tensor([2, 0, 0]), torch.tensor([1, 2, 0])]):
        n = 6 if step == 0 else 1
        requests, expected = [], []
        for s, ids in ((beams, hypo), (greedy, NO_HYPO)):
            hidden = torch.randn(s.batch, n, TINY.hidden)
            expected.append(_reference(backends, hidden, ids, inference_infos(backends, s.ref, s.length)))
            requests.append((hidden.clone(), ids, inference_infos(backends, s.bat, s.length)))
            s.length += n
        for out, exp in zip(batched(requests), expected):
            worst = max(worst, (out - exp).abs().max().item())
    worst_cache = max(_cache_diff(backends, beams), _cache_diff(backends, greedy))
    print(f"beams: max |Δ output| {worst:.2e}, max |Δ cache| {worst_cache:.2e}")
    assert worst < TOL and worst_cache < TOL


def test_chunked_prefill_equals_unchunked(backends) -> None:
    """Query chunks (a tiny logits budget) give the same outputs and caches as one pass."""
    torch.manual_seed(4)
    blocks = [b.module for b in backends.values()]
    whole, chunked = BatchedSpanStep(blocks), BatchedSpanStep(blocks, max_logits_bytes=1)
    descr = next(iter(backends.values())).get_inference_cache_descriptors
    caches_a = [tuple(d.make_zeros() for d in descr(2, 40)) for _ in blocks]
    caches_b = [tuple(t.clone() for t in pair) for pair in caches_a]
    hidden = [torch.randn(2, 17, TINY.hidden), torch.randn(2, 3, TINY.hidden)]
    out_a = whole([SessionStep(hidden[0], caches_a, 0)])[0]
    out_b = chunked([SessionStep(hidden[0], caches_b, 0)])[0]
    out_a2 = whole([SessionStep(hidden[1], caches_a, 17)])[0]
    out_b2 = chunked([SessionStep(hidden[1], caches_b, 17)])[0]
    diff = max((out_a - out_b).abs().max().item(), (out_a2 - out_b2).abs().max().item(),
               *((x - y).abs().max().item() for pa, pb in zip(caches_a, caches_b) for x, y in zip(pa, pb)))
    print(f"chunked vs whole: max |Δ| {diff:.2e}")
    assert diff < TOL


def test_bare_blocks_and_empty_steps(backends) -> None:
    """Unwrapped WrappedLlamaBlocks work too, and a 0-token step passes through untouched."""
    blocks = [b.module.module_shards[0] for b in backends.values()]
    descr = next(iter(backends.values())).get_inference_cache_descriptors
    caches = [tuple(d.make_zeros() for d in descr(1, 8)) for _ in blocks]
    empty = torch.zeros(1, 0, TINY.hidden)
    steps = [SessionStep(empty, caches, 0), SessionStep(torch.randn(1, 2, TINY.hidden), caches, 0)]
    out = BatchedSpanStep(blocks)(steps)
    assert out[0].shape == (1, 0, TINY.hidden) and out[1].shape == (1, 2, TINY.hidden)


def test_refuses_what_it_cannot_run(backends) -> None:
    """Overflowing the cache, a wrong width and sessions over different blocks are refused by name."""
    blocks = [b.module for b in backends.values()]
    descr = next(iter(backends.values())).get_inference_cache_descriptors
    caches = [tuple(d.make_zeros() for d in descr(1, 8)) for _ in blocks]
    step = BatchedSpanStep(blocks)
    with pytest.raises(ValueError, match="exceeds"):
        step([SessionStep(torch.randn(1, 3, TINY.hidden), caches, 6)])
    with pytest.raises(ValueError, match="hidden_states"):
        step([SessionStep(torch.randn(1, 3, TINY.hidden + 1), caches, 0)])
    with pytest.raises(ValueError, match="cache pairs"):
        step([SessionStep(torch.randn(1, 1, TINY.hidden), caches[:1], 0)])
    a = allocate_session(backends, 1, 8)
    infos = inference_infos(backends, a, 0)
    with pytest.raises(ValueError, match="same blocks"):
        BatchedMergedInferenceStep(backends)([(torch.randn(1, 1, TINY.hidden), NO_HYPO, infos),
                                              (torch.randn(1, 1, TINY.hidden), NO_HYPO, infos[:1])])
