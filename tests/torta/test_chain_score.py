"""The micro layer's greedy score as a live chain-dispatch rule: differs from JFFC where the score says so, never
exceeds a chain's capacity, keeps the FIFO queue."""

from __future__ import annotations

import numpy as np

from petals_chain.dispatch.jffc import JFFC
from petals_chain.orchestrator.leasing.leases import LeaseManager
from petals_chain.torta.chain_score import GreedyScoreChains, chain_scores
from petals_chain.torta.live import GreedyScorePolicy


def test_scores_are_the_weighted_sum_of_hardware_load_and_locality() -> None:
    """(7) on hand-computed values: weights 0.2/0.6/0.2, load exp(−held/c), locality exp(−t/300 s) after a start."""
    s = chain_scores(np.array([1.0, 0.5]), np.array([2.0, 0.0]), np.array([4.0, 4.0]), np.array([0.0, -np.inf]),
                     300.0)
    assert np.allclose(s, [0.2 * 1 + 0.6 * np.exp(-0.5) + 0.2 * np.exp(-1), 0.2 * 0.5 + 0.6 * 1])


def test_an_idle_chain_beats_a_loaded_fast_one_unlike_jffc() -> None:
    """A second arrival at once goes to the slightly slower idle chain (load outweighs the fast chain's locality;
    JFFC keeps the fast one); a full region queues in FIFO order and a departure hands the slot to the head."""
    g = GreedyScoreChains([1.0, 0.9], [2, 1])
    j = JFFC([1.0, 0.9], [2, 1])
    assert [s.chain for s in g.on_arrival(0, 0.0) + g.on_arrival(1, 0.0)] == [0, 1]
    assert [s.chain for s in j.on_arrival(0, 0.0) + j.on_arrival(1, 0.0)] == [0, 0]
    g2 = GreedyScoreChains([1.0, 0.9], [4, 1])
    g2.on_arrival(0, 0.0)
    g2.on_arrival(1, 0.0)
    j4 = JFFC([1.0, 0.9], [4, 1])
    j4.on_arrival(0, 0.0)
    j4.on_arrival(1, 0.0)
    assert g2.occupancy() == [2, 0]  # one of four lanes busy costs less than the idle chain's lower speed
    assert g2.on_arrival(2, 1000.0)[0].chain == 1 and j4.on_arrival(2, 1000.0)[0].chain == 0
    assert g.on_arrival(2, 1.0)[0].chain == 0  # chain 1 is full
    assert g.on_arrival(3, 1.0) == [] and g.on_arrival(4, 1.0) == []  # full: queued
    assert g.occupancy() == [2, 1] and g.queued_jobs() == [3, 4]
    assert [(s.job, s.chain) for s in g.on_departure(0, 0, 2.0)] == [(3, 0)]
    assert g.occupancy() == [2, 1]


def test_lease_manager_uses_the_greedy_rule() -> None:
    """The regions' greedy lease manager builds its policy from the chains it is given."""
    from petals_chain.orchestrator.engine.chains import ChainInfo
    from petals_chain.protocol.hop import Hop

    lm = LeaseManager(policy=GreedyScorePolicy())
    lm.set_chains([ChainInfo((Hop("a", 0, 4),), 2, 1.0, "c0")], 1)
    assert isinstance(lm._policy, GreedyScoreChains)
