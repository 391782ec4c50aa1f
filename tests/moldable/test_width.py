"""The swarm's speculative width: greedy(p*) from the measured load with headroom, drafts, and the s(k) fit."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from petals_chain.client.drafts import prompt_lookup_draft
from petals_chain.moldable.width_range import WidthError, check_width
from petals_chain.model import SpecError
from petals_chain.moldable.optimal import optimal_allocation
from petals_chain.moldable.speedup import SpeedUp, SpeedUpError, concave_hull
from petals_chain.moldable.live import WidthChooser, policy_probabilities, width_probabilities

S = SpeedUp((1.0, 1.8, 2.5, 3.0, 3.4))


def mean_width(p: np.ndarray) -> float:
    """E[width] under a width law."""
    return float(np.dot(np.arange(1, p.size + 1), p))


def test_width_falls_as_the_load_grows() -> None:
    """Idle swarm: the widest width; more load: narrower on average; past the headroom: width 1 only."""
    loads = [0.0, 0.1, 0.3, 0.45, 0.55, 0.65, 0.69, 0.7, 0.9]
    means = [mean_width(width_probabilities(S, lam, headroom=0.7)) for lam in loads]
    assert means[0] == 5.0 and means[1] == 5.0  # λ/ρ̄ <= a_d = 0.68: every session on d
    assert all(a >= b - 1e-12 for a, b in zip(means, means[1:])), means
    assert means[2] > means[4] > means[6]
    assert means[-2] == means[-1] == 1.0


def test_width_law_is_theorem1_at_the_scaled_load() -> None:
    """p at λ is Theorem 1's p* at λ/ρ̄ (one concept, one place); docs/moldable.md's example at λ/ρ̄ = 0.8."""
    p = width_probabilities(S, 0.8 * 0.7, headroom=0.7)
    np.testing.assert_allclose(p, optimal_allocation(S, 0.8).p)
    np.testing.assert_allclose(p, [0, 0, 0.625, 0.375, 0], atol=1e-12)
    np.testing.assert_allclose(policy_probabilities("fixed-1", S, 0.3), [1, 0, 0, 0, 0])
    np.testing.assert_allclose(policy_probabilities("fixed-max", S, 0.3), [0, 0, 0, 0, 1])


def test_chooser_follows_the_measured_load() -> None:
    """Arrivals far apart: wide sessions; arrivals close together (same sizes): narrow ones. Widths never exceed
    the free units, and the units come back."""
    rng = np.random.default_rng(3)
    ch = WidthChooser(20, S, "greedy-p", rng, mean_size_s=1.0, mean_interarrival_s=1.0, headroom=0.7)
    t, widths = 0.0, []
    for _ in range(40):  # one arrival every 10 s: λ = 1 / (10 · 20) → width d
        t += 10.0
        w = ch.start(ch.arrive(t))
        widths.append(w)
        ch.finish(w, service_s=1.0 / S.s[w - 1])
    assert widths[-10:] == [5] * 10
    for _ in range(200):  # one arrival every 0.08 s: λ = 1 / (0.08 · 20) = 0.625 → λ/ρ̄ = 0.89
        t += 0.08
        w = ch.start(ch.arrive(t))
        widths.append(w)
        ch.finish(w, service_s=1.0 / S.s[w - 1])
    assert abs(ch.load - 0.625) < 0.02
    late = widths[-100:]
    expected = mean_width(width_probabilities(S, 0.625, headroom=0.7))  # p* at 0.89 mixes widths 2 and 3
    assert set(late) <= {2, 3} and abs(np.mean(late) - expected) < 0.15 and 2.0 < expected < 2.3
    assert ch.free == 20


def test_chooser_cuts_to_free_units_and_keeps_fifo_order() -> None:
    """With 3 units held by a width-3 session, the next waits; when they come back it gets min(I, free)."""
    ch = WidthChooser(3, S, "fixed-max", np.random.default_rng(0), mean_size_s=1.0, mean_interarrival_s=1.0)
    first = ch.start(ch.arrive(0.0))
    assert first == 3 and ch.free == 0
    order: list[int] = []
    tickets = [ch.arrive(0.1), ch.arrive(0.2)]

    def run(ticket: int) -> None:
        """Wait for a width, note the order, give it back."""
        w = ch.start(ticket, timeout_s=10)
        order.append(ticket)
        ch.finish(w)

    threads = [threading.Thread(target=run, args=(tk,)) for tk in reversed(tickets)]
    for th in threads:
        th.start()
    with pytest.raises(TimeoutError):
        ch.start(ch.arrive(0.3), timeout_s=0.05)  # not at the head of the queue
    ch._queue.remove(max(ch._queue))  # that ticket gave up
    ch.finish(first)
    for th in threads:
        th.join(10)
    assert order == tickets


def test_bad_input_is_refused_naming_the_field() -> None:
    """Width out of range, unknown policy, bad headroom, bad units, giving back units never held."""
    for bad in (0, 33, 1.5, True, None):
        with pytest.raises(WidthError, match="width: must be an integer in 1..32"):
            check_width(bad)
    assert check_width(8) == 8
    with pytest.raises(SpecError, match="policy: unknown width policy 'widest'"):
        policy_probabilities("widest", S, 0.3)
    with pytest.raises(SpecError, match="headroom: must be in"):
        width_probabilities(S, 0.3, headroom=1.5)
    with pytest.raises(SpecError, match="load: must be a finite number"):
        width_probabilities(S, float("nan"))
    with pytest.raises(SpecError, match="units: must be an integer >= 1"):
        WidthChooser(0, S, "greedy-p", np.random.default_rng(0), mean_size_s=1, mean_interarrival_s=1)
    ch = WidthChooser(4, S, "fixed-1", np.random.default_rng(0), mean_size_s=1, mean_interarrival_s=1)
    with pytest.raises(SpecError, match="width: 2 units were not held"):
        ch.finish(2)


def test_prompt_lookup_drafts_the_continuation_of_the_latest_match() -> None:
    """The longest matching suffix n-gram wins, the latest occurrence first; nothing matches: no draft."""
    text = [5, 6, 7, 8, 9, 1, 6, 7, 2, 3, 6, 7]
    assert prompt_lookup_draft(text, 3) == [2, 3, 6]  # bigram (6, 7) last seen before 2, 3, 6
    assert prompt_lookup_draft([1, 2, 3, 1, 2], 2, max_ngram=2) == [3, 1]
    assert prompt_lookup_draft([1, 2, 3, 4], 4) == []
    assert prompt_lookup_draft([1, 2, 1], 0) == []


def test_measured_speedup_fit_is_concave() -> None:
    """Tokens per second measured at k = 1..8 with noise and a dip: the hull is increasing, concave, s_1 = 1,
    above every measured point, and cut where more width stops helping."""
    k = np.arange(1, 9)
    measured = np.array([2.0, 3.3, 4.1, 4.0, 4.9, 5.0, 4.6, 4.95])
    s = concave_hull(k, measured)
    arr = s.array()
    assert arr[0] == 1.0 and s.d <= 8
    gains = np.diff(np.concatenate([[0.0], arr]))
    assert np.all(gains > 0) and np.all(np.diff(gains) <= 1e-12)
    assert np.all(arr >= measured[: s.d] / measured[0] - 1e-12)
    with pytest.raises(SpeedUpError, match="one server"):
        concave_hull([2, 3], [1.0, 1.2])
