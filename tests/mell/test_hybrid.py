"""Adaptive migration division: budgets never exceeded, identical on every caller, KV first when it fits."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.mell.hybrid import Budgets, Mode, hybrid_divide, machine_path
from petals_chain.mell.state import Move

KV = 1000  # bytes per token


def _moves(rng, n):
    return [Move(int(r), int(rng.integers(0, 16)), int(rng.integers(0, 16)), int(rng.integers(1, 5000)))
            for r in rng.permutation(n)]


@pytest.mark.parametrize("rule", ["first", "best"])
def test_budgets_never_exceeded(rule):
    rng = np.random.default_rng(1)
    path = machine_path(4)
    for _ in range(300):
        moves = [m for m in _moves(rng, int(rng.integers(1, 30))) if m.src != m.dst]
        bud = Budgets({}, {}, default_link_bytes=float(rng.integers(0, 10**7)),
                      default_prefill_tokens=int(rng.integers(0, 20_000)))
        div = hybrid_divide(moves, KV, bud, path, rule)
        load_b, load_p = {}, {}
        for mv, mode in zip(moves, div.modes):
            if mode == Mode.KV:
                for lnk in path(mv.src, mv.dst):
                    load_b[lnk] = load_b.get(lnk, 0) + mv.size_tokens * KV
            elif mode == Mode.TOKEN:
                load_p[mv.dst] = load_p.get(mv.dst, 0) + mv.size_tokens
        assert all(v <= bud.link(k) for k, v in load_b.items())
        assert all(v <= bud.prefill(k) for k, v in load_p.items())
        assert load_b == pytest.approx(div.link_bytes) and load_p == div.prefill_tokens
        # a deferred move fitted neither budget when it was considered, so it would not fit now either
        for mv, mode in zip(moves, div.modes):
            if mode == Mode.DEFER:
                assert load_p.get(mv.dst, 0) + mv.size_tokens > bud.prefill(mv.dst)


def test_identical_on_every_caller():
    """Each caller sees the cluster's moves in its own order; every move gets the same mode."""
    rng = np.random.default_rng(2)
    path = machine_path(4)
    bud = Budgets({}, {}, default_link_bytes=2e6, default_prefill_tokens=6000)
    moves = [m for m in _moves(rng, 40) if m.src != m.dst]
    ref = dict(zip(moves, hybrid_divide(moves, KV, bud, path).modes))
    for _ in range(20):
        shuffled = [moves[k] for k in rng.permutation(len(moves))]
        assert dict(zip(shuffled, hybrid_divide(shuffled, KV, bud, path).modes)) == ref
    assert len(set(ref.values())) == 3  # the budgets make all three modes occur


def test_kv_first_then_token_then_defer():
    path = machine_path(8)
    moves = [Move(1, 0, 9, 3000), Move(2, 1, 9, 2000), Move(3, 2, 9, 1000)]
    bud = Budgets({"nic0": 3e6, "nic1": 3e6}, {9: 2500})
    assert hybrid_divide(moves, KV, bud, path).modes == (Mode.KV, Mode.TOKEN, Mode.DEFER)
    same_machine = [Move(4, 0, 1, 10)]
    assert path(0, 1) == ("pcie0",) and path(0, 9) == ("nic0", "nic1")
    assert hybrid_divide(same_machine, KV, Budgets({"pcie0": 1e5}, {}), path).modes == (Mode.KV,)


def test_bad_input():
    with pytest.raises(ValueError, match="kv_bytes_per_token"):
        hybrid_divide([], 0, Budgets({}, {}), machine_path(2))
    with pytest.raises(ValueError, match="rule"):
        hybrid_divide([], KV, Budgets({}, {}), machine_path(2), rule="worst")
    with pytest.raises(ValueError, match="gpus_per_machine"):
        machine_path(0)
