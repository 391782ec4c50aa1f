"""Adaptive migration division: budgets never exceeded, identical on every caller, KV first when it fits (first
fit), the faster mode by the profiled speeds (fastest)."""

from __future__ import annotations

import numpy as np
import pytest

import math

from petals_chain.mell.hybrid import Budgets, Mode, Speeds, hybrid_divide, machine_path, profile_speeds
from petals_chain.mell.state import Move

KV = 1000  # bytes per token


def _moves(rng, n):
    return [Move(int(r), int(rng.integers(0, 16)), int(rng.integers(0, 16)), int(rng.integers(1, 5000)))
            for r in rng.permutation(n)]


@pytest.mark.parametrize("rule", ["first", "best", "fastest"])
def test_budgets_never_exceeded(rule):
    rng = np.random.default_rng(1)
    path = machine_path(4)
    for _ in range(300):
        moves = [m for m in _moves(rng, int(rng.integers(1, 30))) if m.src != m.dst]
        bud = Budgets({}, {}, default_link_bytes=float(rng.integers(0, 10**7)),
                      default_prefill_tokens=int(rng.integers(0, 20_000)))
        speeds = Speeds(default_link_bytes_per_s=float(rng.uniform(1e5, 1e8)),
                        default_prefill_tokens_per_s=float(rng.uniform(100, 1e5)))
        div = hybrid_divide(moves, KV, bud, path, rule, speeds)
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


@pytest.mark.parametrize("rule", ["first", "fastest"])
def test_identical_on_every_caller(rule):
    """Each caller sees the cluster's moves in its own order; every move gets the same mode."""
    rng = np.random.default_rng(2)
    path = machine_path(4)
    bud = Budgets({}, {}, default_link_bytes=2e6, default_prefill_tokens=6000)
    speeds = Speeds({"pcie0": 1e9}, {3: 50.0}, default_link_bytes_per_s=1e6, default_prefill_tokens_per_s=2000.0)
    moves = [m for m in _moves(rng, 40) if m.src != m.dst]
    ref = dict(zip(moves, hybrid_divide(moves, KV, bud, path, rule, speeds).modes))
    for _ in range(20):
        shuffled = [moves[k] for k in rng.permutation(len(moves))]
        assert dict(zip(shuffled, hybrid_divide(shuffled, KV, bud, path, rule, speeds).modes)) == ref
    assert len(set(ref.values())) == 3  # the budgets make all three modes occur


def test_fastest_takes_the_mode_with_the_shorter_estimate_within_budgets():
    """1 KB/token: KV over a 1 MB/s NIC takes 1 ms/token, replay at 2,000 tok/s 0.5 ms: replay across machines;
    over a 1 GB/s PCIe link KV (1 µs/token) inside one. Only one mode within budget: that one, however slow. Equal
    estimates: KV. A setup time or a prefill that slows with the context turns the pick."""
    path = machine_path(8)
    speeds = Speeds({"pcie0": 1e9}, {}, default_link_bytes_per_s=1e6, default_prefill_tokens_per_s=2000.0)
    big = Budgets({}, {}, default_link_bytes=1e12, default_prefill_tokens=10**9)
    across, inside = Move(1, 0, 9, 1000), Move(2, 0, 1, 1000)
    assert hybrid_divide([across, inside], KV, big, path, "fastest", speeds).modes == (Mode.TOKEN, Mode.KV)
    assert hybrid_divide([across], KV, big, path, "first", speeds).modes == (Mode.KV,)  # first fit: KV regardless
    no_prefill = Budgets({}, {}, default_link_bytes=1e12, default_prefill_tokens=10)
    assert hybrid_divide([across], KV, no_prefill, path, "fastest", speeds).modes == (Mode.KV,)
    tie = Speeds(default_link_bytes_per_s=1e6, default_prefill_tokens_per_s=1000.0)
    assert hybrid_divide([across], KV, big, path, "fastest", tie).modes == (Mode.KV,)
    slow_kv = Speeds(default_link_bytes_per_s=1e9, default_prefill_tokens_per_s=1000.0, kv_setup_s=2.0)
    assert hybrid_divide([across], KV, big, path, "fastest", slow_kv).modes == (Mode.TOKEN,)  # 2 s vs 1 s
    attention = Speeds(default_link_bytes_per_s=1e6, default_prefill_tokens_per_s=4000.0,
                       prefill_doubling_tokens=500.0)  # replay 0.25 s · (1 + 2) = 0.75 s < 1 s of KV
    assert attention.token_s(9, 1000) == pytest.approx(0.75)
    assert hybrid_divide([across], KV, big, path, "fastest", attention).modes == (Mode.TOKEN,)
    longer = Move(3, 0, 9, 4000)  # replay 1 s · (1 + 8) = 9 s > 4 s of KV
    assert hybrid_divide([longer], KV, big, path, "fastest", attention).modes == (Mode.KV,)


def test_profile_speeds_recovers_the_rates_from_two_runs_per_mode():
    """Runs made by a known profile give that profile back; runs with no growth per token give a linear rate; a
    single run gives its own rate and no setup."""
    truth = Speeds(default_link_bytes_per_s=2e6, default_prefill_tokens_per_s=40.0, kv_setup_s=0.5,
                   prefill_doubling_tokens=800.0)
    kv = [(b, truth.kv_s(("x",), b)) for b in (1e6, 9e7)]
    replay = [(n, truth.token_s(0, n)) for n in (128, 2048)]
    got = profile_speeds(kv, replay)
    assert got.default_link_bytes_per_s == pytest.approx(2e6) and got.kv_setup_s == pytest.approx(0.5)
    assert got.default_prefill_tokens_per_s == pytest.approx(40.0)
    assert got.prefill_doubling_tokens == pytest.approx(800.0)
    linear = profile_speeds([(4e6, 2.0)], [(100, 1.0), (1000, 10.0)])
    assert linear.default_link_bytes_per_s == 2e6 and linear.kv_setup_s == 0.0
    assert linear.default_prefill_tokens_per_s == pytest.approx(100.0) and math.isinf(linear.prefill_doubling_tokens)


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
    with pytest.raises(ValueError, match="speeds"):
        hybrid_divide([], KV, Budgets({}, {}), machine_path(2), rule="fastest")
    with pytest.raises(ValueError, match="rates must be > 0"):
        Speeds(default_prefill_tokens_per_s=0.0)
    with pytest.raises(ValueError, match="kv_setup_s"):
        Speeds(kv_setup_s=-1.0)
    with pytest.raises(ValueError, match="at least one"):
        profile_speeds([], [(1, 1.0)])
    with pytest.raises(ValueError, match="gpus_per_machine"):
        machine_path(0)
