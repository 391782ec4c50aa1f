"""Baselines: best/worst/first fit choose as named, reservation never overflows, preemption picks the newest,
LB's moves narrow the gap they act on."""

from __future__ import annotations

import math

import numpy as np
import pytest

from petals_chain.mell.baselines import FitScheduler, LoadBalanceScheduler
from petals_chain.mell.invariants import capacity_violations
from petals_chain.mell.random_sequences import run_sequence

C = 1000


def _three_gpus(rule):
    s = FitScheduler(C, rule, reserve=False)
    s.step({1: 900}, [])
    s.step({2: 500}, [])  # 900 + 500 > C: new GPU
    s.step({3: 700}, [])  # fits neither: third GPU
    return s


@pytest.mark.parametrize("rule, expected", [("best", 0), ("worst", 1), ("first", 0)])
def test_fit_rules(rule, expected):
    s = _three_gpus(rule)
    assert s.num_gpus() == 3
    free = {g: s.st.free(g) for g in s.st.gpus}  # 100, 500, 300
    s.step({4: 100}, [])
    g = s.placement()[4]
    assert list(free).index(g) == expected


def test_reservation_never_overflows_or_preempts():
    for rule in ("best", "worst"):
        s = FitScheduler(C, rule)
        for res in run_sequence(s, np.random.default_rng(3), 60):
            assert res.preemptions == 0 and not res.moves
            assert capacity_violations(s.st) == []


def test_reservation_mirror_matches_the_requests():
    """The per-GPU reservation the fit rules read equals the final sizes of the requests on that GPU."""
    s = FitScheduler(C, "best")
    for _ in run_sequence(s, np.random.default_rng(5), 120, arrivals_per_step=4):
        for g in s.st.gpus:
            held = sum(s._final[r] for r, h in s.placement().items() if h == g)
            assert s._res_arr[g] == held == s._reserved[g]
    assert s.st.gpus_opened > 64  # past the mirror's first growth


def test_preemption_takes_the_newest_request():
    s = FitScheduler(C, "best", reserve=False)
    s.step({1: 400}, [])
    s.step({2: 400}, [])
    res = s.step({}, [], {1: 700})  # 700 + 400 > C: request 2 (newest) leaves for a new GPU
    assert res.preempted == (2,) and s.num_gpus() == 2


def test_lb_moves_narrow_the_gap_and_respect_capacity():
    s = LoadBalanceScheduler(C, reserve=False)
    moved = 0
    for res in run_sequence(s, np.random.default_rng(4), 80):
        moved += len(res.moves)
        assert capacity_violations(s.st) == []
    assert moved > 0


def _lb_with(groups, **kw):
    """An LB scheduler whose GPUs hold the given request sizes (one list per GPU)."""
    s = LoadBalanceScheduler(C, reserve=False, **kw)
    r = 0
    for sizes in groups:
        g = s.st.new_gpu()
        for size in sizes:
            r += 1
            s.st.size[r] = size
            s._final[r] = size
            s._admitted[r] = r
            s.st.place(s.st.new_item([r], bundle=False), g)
            s._add_reserved(g, size)
    return s


def _spread(s) -> float:
    f = [s._freeness(g) for g in s.st.gpus]
    return max(f) - min(f)


def test_v0_moves_the_shortest_request_only_when_it_narrows_the_gap():
    """Our first reading (kept as variant v0): one move per pair, freeness = free / requests."""
    s = _lb_with([[100, 120, 110, 130], [100]], variant="v0")  # 135 vs 900: moving 100 gives 217 vs 400
    moves = s._rebalance()
    assert [(m.request, m.src, m.dst) for m in moves] == [(1, 0, 1)]
    s = _lb_with([[300, 300], [500]], variant="v0")  # 200 vs 500: moving 300 would reverse the gap (700 vs 100)
    assert s._rebalance() == [] and s.placement() == {1: 0, 2: 0, 3: 1}


def test_llumnix_freeness_counts_actual_tokens_next_steps_and_one_more_request():
    s = _lb_with([[300, 200], [100]])
    s._step_tokens = 10
    assert s._freeness(0) == pytest.approx((C - 500 - 2 * 10) / 3)
    assert s._freeness(1) == pytest.approx((C - 100 - 10) / 2)
    s._final.update({1: C, 2: C})  # reservations are not looked at
    assert s._freeness(0) == pytest.approx((C - 500 - 20) / 3)


def test_llumnix_pairs_the_most_loaded_with_the_freest_and_balances():
    """Four GPUs: the two most loaded are sources, paired in order with the freest and the second freest; every
    move narrows its pair's gap, and the spread of freeness over the GPUs shrinks."""
    s = _lb_with([[150] * 6, [120] * 5, [100], [150]])  # freeness 14, 67, 450, 425 (mean 239)
    before = _spread(s)
    moves = s._rebalance()
    pairs = {(m.src, m.dst) for m in moves}
    assert pairs == {(0, 2), (1, 3)}
    assert _spread(s) < before
    assert capacity_violations(s.st) == []


def test_llumnix_moves_until_the_pair_is_balanced_and_never_reverses_it():
    """One pair, several moves in one slot, stopping when one more would not narrow the gap (or would invert it)."""
    s = _lb_with([[100] * 6, [100]], threshold=100.0)  # 57 vs 450
    moves = s._rebalance()
    assert [(m.src, m.dst) for m in moves] == [(0, 1), (0, 1)]  # then 120 vs 175: a third move inverts the gap
    assert s._freeness(1) - s._freeness(0) > 0
    s = _lb_with([[300, 300], [500]])  # 133 vs 250: moving 300 gives 350 vs 67, reversed
    assert s._rebalance() == [] and s.placement() == {1: 0, 2: 0, 3: 1}


def test_llumnix_dispatch_goes_to_the_highest_freeness_not_the_most_free_room():
    """GPU 0 holds one 500-token request (freeness 250), GPU 1 three of 100 (room 700, freeness 175): worst fit
    picks GPU 1, Llumnix's load-aware dispatch GPU 0."""
    lb, wf = _lb_with([[500], [100, 100, 100]]), _lb_with([[500], [100, 100, 100]], variant="v0")
    assert lb._choose(200) == 0 and wf._choose(200) == 1


@pytest.fixture(scope="module")
def fig_cluster():
    """The figures' 7B/4090 cluster, 400 Poisson requests (gap 0.5 s), under Mell and every baseline flavour,
    with LB's migration switched off (threshold −∞) beside LB."""
    from petals_chain.experiments.mell_common import config, workload
    from petals_chain.mell.scheduler import MellScheduler
    from petals_chain.mell.sim import simulate

    cfg = config("7b-4090")
    cap = cfg.capacity_tokens
    wl = workload("poisson-high", "7b-4090", 400, np.random.default_rng(3))
    res = {k: simulate(p, wl, cfg) for k, p in {
        "Mell": MellScheduler(cap), "BF": FitScheduler(cap, "best"), "WF": FitScheduler(cap, "worst"),
        "LB": LoadBalanceScheduler(cap), "LB-dispatch": LoadBalanceScheduler(cap, threshold=-math.inf),
        "WF-p": FitScheduler(cap, "worst", reserve=False), "LB-p": LoadBalanceScheduler(cap, reserve=False)}.items()}
    print({k: (r.peak_gpus, round(r.mean_gpus, 1), r.migrations, r.preemptions) for k, r in res.items()})
    return res


def test_lb_needs_no_more_gpus_than_worst_fit_and_its_dispatch_is_why(fig_cluster):
    """Reserving the final size, LB opens fewer GPUs than WF at the peak and on average, and so does LB with its
    migration switched off: the gain is Llumnix's dispatch on actual freeness, not the balancing. Preempting
    instead (LB-p vs WF-p), LB-p trades WF-p's preemptions for migrations and needs the same GPUs on average
    within 5 % (docs/mell.md, "Baselines")."""
    res = fig_cluster
    for k in ("LB", "LB-dispatch"):
        assert res[k].peak_gpus <= res["WF"].peak_gpus and res[k].mean_gpus < res["WF"].mean_gpus, k
    assert res["LB"].migrations > 0 and res["LB-dispatch"].migrations == 0
    assert res["LB-p"].preemptions < res["WF-p"].preemptions and res["LB-p"].migrations > 0
    assert abs(res["LB-p"].mean_gpus - res["WF-p"].mean_gpus) <= 0.05 * res["WF-p"].mean_gpus


def test_finding_lb_needs_more_gpus_than_best_fit_because_its_dispatch_spreads(fig_cluster):
    """Fig 11's LB above BF (the paper: below both BF and WF), pinned: LB's dispatch alone, without a single
    migration, already needs more GPUs than best fit on average and at the peak, and LB's balancing moves change
    that by under 5 %. Dispatching to the highest freeness spreads requests over GPUs that best fit would have
    left empty; balancing cannot take that back."""
    res = fig_cluster
    assert res["LB-dispatch"].mean_gpus > 1.03 * res["BF"].mean_gpus
    assert res["LB-dispatch"].peak_gpus > res["BF"].peak_gpus
    assert res["LB"].mean_gpus > res["BF"].mean_gpus
    assert abs(res["LB"].mean_gpus - res["LB-dispatch"].mean_gpus) < 0.05 * res["LB-dispatch"].mean_gpus


def test_finding_mell_moves_more_than_lb_because_it_answers_growth_and_departures(fig_cluster):
    """Fig 12's Mell above LB (the paper: below), pinned on both sides. Mell moves on growth (a request that
    overflows its GPU or changes class) and after departures (refilling a GPU to its packing bound): those
    operations make at least 90 % of its moves, arrivals and the sweep the rest. LB moves only when a pair of
    GPUs is out of balance, and reserving each request's final size leaves little imbalance: the same LB moves
    at least twice as many requests once it preempts instead of reserving."""
    res = fig_cluster
    kinds = res["Mell"].moves_by_kind
    reacting = sum(kinds.get(k, 0) for k in ("overflow", "update", "depart", "refill"))
    assert reacting >= 0.9 * sum(kinds.values()) > 0
    assert res["Mell"].migrations > 3 * res["LB"].migrations > 0
    assert res["LB-p"].migrations > 2 * res["LB"].migrations


def test_bad_input():
    with pytest.raises(ValueError, match="rule"):
        FitScheduler(C, "random")
    s = FitScheduler(C, "best")
    with pytest.raises(ValueError, match="final_sizes"):
        s.step({1: 10}, [])
    with pytest.raises(ValueError, match="final size"):
        s.step({1: 10}, [], None, {1: 5})
    with pytest.raises(ValueError, match="variant"):
        LoadBalanceScheduler(C, variant="random")


def test_finding_reserving_baselines_are_full_of_reservations_not_tokens():
    """Fig 14's reserving baselines at 40–53 % utilisation (the paper: ≈ 80 %), pinned: best fit that reserves
    fills its GPUs' room with final sizes to over 80 % on average, while the tokens actually held fill little more
    than half of it; the same arrivals under BF-p fill over 80 % with tokens."""
    from petals_chain.experiments.mell_common import config, workload
    from petals_chain.mell.sim import simulate

    class Recording(FitScheduler):
        def step(self, *a, **kw):
            out = super().step(*a, **kw)
            n = self.num_gpus()
            self.fill.append(sum(self._reserved.values()) / (n * self.C) if n else np.nan)
            return out

    cfg = config("7b-4090")
    wl = workload("poisson-high", "7b-4090", 400, np.random.default_rng(3))
    bf = Recording(cfg.capacity_tokens, "best")
    bf.fill = []
    res = simulate(bf, wl, cfg)
    a, b = res.window
    reserved = float(np.nanmean(bf.fill[a:b]))
    bfp = simulate(FitScheduler(cfg.capacity_tokens, "best", reserve=False), wl, cfg)
    print(f"BF reserved {reserved:.2f}, BF tokens {res.utilisation:.2f}, BF-p tokens {bfp.utilisation:.2f}")
    assert reserved > 0.8 and res.utilisation < 0.6 and reserved - res.utilisation > 0.25
    assert bfp.utilisation > 0.8
