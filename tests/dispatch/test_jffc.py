"""JFFC (Algorithm 3): fastest free chain first, one central FIFO queue, slots handed over on departure."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.dispatch.jffc import JFFC
from petals_chain.model import SpecError


def test_fastest_free_chain_then_queue_then_fifo():
    pol = JFFC(rates=[1.0, 3.0, 2.0], capacities=[1, 2, 1])
    chains = [pol.on_arrival(j)[0].chain for j in range(4)]
    assert chains == [1, 1, 2, 0]  # fastest (rate 3) twice, then rate 2, then rate 1
    assert pol.on_arrival(4) == [] and pol.on_arrival(5) == []
    assert pol.queue_length() == 2 and pol.occupancy() == [1, 2, 1]
    # a departure hands its slot straight to the queue head, on the chain that freed it
    (s,) = pol.on_departure(0, 1)
    assert (s.job, s.chain) == (4, 1)
    (s,) = pol.on_departure(3, 0)
    assert (s.job, s.chain) == (5, 0)
    assert pol.on_departure(2, 2) == [] and pol.occupancy() == [1, 2, 0]
    assert pol.on_arrival(6)[0].chain == 2  # the freed chain is offered again


def test_ties_go_to_the_lower_index_and_cancel_removes_waiters():
    pol = JFFC([2.0, 2.0], [1, 1])
    assert [pol.on_arrival(j)[0].chain for j in range(2)] == [0, 1]
    pol.on_arrival(10)
    pol.on_arrival(11)
    assert pol.cancel(10) and not pol.cancel(99)
    assert pol.queued_jobs() == [11]
    assert pol.on_departure(0, 0)[0].job == 11


def test_departure_from_idle_chain_is_an_error():
    pol = JFFC([1.0], [1])
    with pytest.raises(ValueError, match="no job in service"):
        pol.on_departure(0, 0)
    with pytest.raises(SpecError):
        JFFC([1.0, 0.0], [1, 1])
    with pytest.raises(SpecError):
        JFFC([1.0], [0])


def test_random_event_sequences_keep_invariants():
    rng = np.random.default_rng(0)
    rates = rng.uniform(0.1, 5.0, 8)
    caps = rng.integers(1, 4, 8)
    pol = JFFC(rates, caps)
    on: dict[int, int] = {}
    for job in range(3000):
        if not on or rng.random() < 0.5:
            starts = pol.on_arrival(job)
        else:
            j = int(rng.choice(list(on)))
            starts = pol.on_departure(j, on.pop(j))
        for s in starts:
            on[s.job] = s.chain
        occ = pol.occupancy()
        assert all(0 <= o <= c for o, c in zip(occ, caps))
        assert pol.queue_length() == 0 or occ == list(caps)  # queue only when every chain is full
        assert sum(occ) == len(on)


def test_a_resumed_job_takes_a_free_chain_or_waits_ahead_of_later_arrivals():
    """on_resume: with a free slot it starts at once on the fastest one; otherwise it queues by job id, so
    resumed jobs go ahead of every later arrival (and in their own order among themselves)."""
    p = JFFC([1.0, 2.0], [1, 1])
    assert [(s.job, s.chain) for s in p.on_resume(7)] == [(7, 1)]  # free: the fastest chain, like an arrival
    assert [(s.job, s.chain) for s in p.on_arrival(8)] == [(8, 0)]
    assert p.on_arrival(9) == [] and p.on_arrival(10) == []
    assert p.on_resume(4) == [] and p.on_resume(2) == [] and p.on_resume(9_999) == []
    assert p.queued_jobs() == [2, 4, 9, 10, 9_999]
    assert [(s.job, s.chain) for s in p.on_departure(7, 1)] == [(2, 1)]
    assert p.queue_length() == 4 and p.occupancy() == [1, 1]


def test_arrivals_take_the_fastest_free_chain_also_after_occupy():
    """Against a brute-force reference: with arrivals, departures and occupy (leases carried over from an
    earlier composition) mixed at random, an arrival always takes the fastest chain with a free slot."""
    rng = np.random.default_rng(4)
    rates = rng.choice([0.5, 1.0, 2.0, 3.0], 12)  # ties: the lower index wins
    caps = rng.integers(1, 4, 12)
    pol = JFFC(rates, caps)
    busy = [0] * 12
    on: dict[int, int] = {}
    for job in range(4000):
        x = rng.random()
        if x < 0.1:
            k = int(rng.integers(12))
            assert pol.occupy(k) == (busy[k] < caps[k])
            if busy[k] < caps[k]:
                busy[k] += 1
                on[-1 - job] = k
        elif x < 0.55 or not on:
            free = [k for k in range(12) if busy[k] < caps[k]]
            want = min(free, key=lambda k: (-rates[k], k)) if free else None
            starts = pol.on_arrival(job)
            if want is None:
                assert starts == []
                pol.cancel(job)
            else:
                assert [(s.job, s.chain) for s in starts] == [(job, want)]
                busy[want] += 1
                on[job] = want
        else:
            j = int(rng.choice(list(on)))
            k = on.pop(j)
            assert pol.on_departure(j, k) == []
            busy[k] -= 1
        assert pol.occupancy() == busy


@pytest.mark.parametrize("num_chains", [1, 3, 10, 100, 1000])
def test_the_live_entries_decide_as_the_rules_through_the_dispatcher(num_chains):
    """Issue 26: the live JFFC (one packed state array, compiled entry points) makes the same decision as the rules
    called through numba's dispatcher on separate arrays (the path before, kept in the benchmark as the reference),
    on random sequences of arrivals and departures over chains with tied rates; every start, the occupancy and the
    queue agree after every event."""
    from petals_chain.bench.orchestrator import DispatcherJFFC

    rng = np.random.default_rng(26 + num_chains)
    rates = rng.choice([0.05, 0.1, 0.125, 0.2], num_chains)  # few distinct rates: ties go to the lower index
    caps = rng.integers(1, 9, num_chains)
    new, old = JFFC(rates, caps), DispatcherJFFC(rates, caps)
    on: dict[int, int] = {}
    load = 0.3 + 0.7 * rng.random()  # share of events that are arrivals: from draining to saturated
    for job in range(6000):
        if not on or rng.random() < load:
            got, want = new.on_arrival(job), old.on_arrival(job)
        else:
            j = int(rng.choice(list(on)))
            k = on.pop(j)
            got, want = new.on_departure(j, k), old.on_departure(j, k)
        assert got == want
        for s in got:
            on[s.job] = s.chain
        assert new.occupancy() == old.occupancy() and new.queue_length() == old.queue_length()
    assert sum(new.occupancy()) == len(on)


def test_a_departure_from_no_chain_is_an_error_and_changes_nothing():
    pol = JFFC([1.0, 2.0], [1, 1])
    pol.on_arrival(0)
    for bad in (-1, 2, 10**6):
        with pytest.raises(ValueError, match="no job in service"):
            pol.on_departure(0, bad)
    assert pol.occupancy() == [0, 1] and pol.on_arrival(1)[0].chain == 0
