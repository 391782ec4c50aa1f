"""Unit behaviour of the dispatch baselines (docs/model.md, "Dispatch baselines") and the policy factory."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.dispatch import POLICY_NAMES, JFFCMigration, Start, canonical_name, make_policy
from petals_chain.dispatch.base import DispatchPolicy
from petals_chain.model import SpecError


def gen(seed: int = 0) -> np.random.Generator:
    """A seeded generator for the randomised policies."""
    return np.random.default_rng(seed)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_factory_builds_every_policy_behind_the_protocol(name: str) -> None:
    policy = make_policy(name, [1.0, 2.0], [1, 2], gen())
    assert isinstance(policy, DispatchPolicy)
    assert policy.name == name
    assert policy.occupancy() == [0, 0]
    assert policy.queue_length() == 0


def test_factory_names_are_case_and_dash_insensitive() -> None:
    assert canonical_name("sa_jsq") == "SA-JSQ"
    assert canonical_name("jffc-MIGRATION") == "JFFC-migration"
    with pytest.raises(ValueError, match="unknown dispatch policy 'JSW'"):
        make_policy("JSW", [1.0], [1], gen())


def test_randomised_policies_demand_a_generator() -> None:
    with pytest.raises(ValueError, match="rng"):
        make_policy("JSQ", [1.0], [1])
    with pytest.raises(TypeError, match="Generator"):
        make_policy("JIQ", [1.0], [1], 42)  # type: ignore[arg-type]


def test_bad_chains_are_refused_naming_the_chain() -> None:
    with pytest.raises(SpecError, match="chain 1 has capacity 0"):
        make_policy("SED", [1.0, 1.0], [1, 0], gen())


def test_jsq_fills_free_slots_then_queues_on_the_least_loaded_chain() -> None:
    policy = make_policy("JSQ", [1.0, 1.0], [1, 2], gen())
    starts = [policy.on_arrival(j) for j in range(3)]
    assert all(len(s) == 1 for s in starts)  # three slots in total, all used
    assert sorted(s[0].chain for s in starts) == [0, 1, 1]
    # Z = (1, 2): keys (1-1+1)/1 = 1 and (2-2+1)/2 = 0.5 -> chain 1 gets the queued job
    assert policy.on_arrival(3) == []
    assert policy.queue_length() == 1
    assert policy.on_departure(0, 0) == []  # chain 0 has no queue of its own
    assert policy.on_departure(1, 1) == [Start(3, 1)]


def test_jsq_breaks_ties_at_random_and_sa_jsq_picks_the_fastest() -> None:
    picks = {make_policy("JSQ", [1.0, 3.0], [1, 1], gen(s)).on_arrival(0)[0].chain for s in range(40)}
    assert picks == {0, 1}
    fast = {make_policy("SA-JSQ", [1.0, 3.0], [1, 1], gen(s)).on_arrival(0)[0].chain for s in range(40)}
    assert fast == {1}


def test_sed_queues_at_a_fast_chain_rather_than_start_on_a_slow_one() -> None:
    policy = make_policy("SED", [4.0, 0.5], [1, 1], gen())
    assert policy.on_arrival(0) == [Start(0, 0)]
    # chain 0: 1/4 + 1/4 = 0.5 < chain 1: 1/0.5 = 2 -> wait at chain 0
    assert policy.on_arrival(1) == []
    assert policy.occupancy() == [1, 0]
    assert policy.on_departure(0, 0) == [Start(1, 0)]


def test_jiq_prefers_idle_chains_and_otherwise_joins_any() -> None:
    policy = make_policy("JIQ", [1.0, 1.0, 1.0], [1, 1, 1], gen(3))
    chains = [policy.on_arrival(j)[0].chain for j in range(3)]
    assert sorted(chains) == [0, 1, 2]
    assert policy.on_arrival(3) == []
    assert policy.queue_length() == 1


def test_departure_from_an_empty_chain_is_an_error() -> None:
    policy = make_policy("JSQ", [1.0], [1], gen())
    with pytest.raises(ValueError, match="no job in service"):
        policy.on_departure(0, 0)


def test_migration_moves_the_slowest_job_to_a_freed_faster_chain() -> None:
    policy = JFFCMigration([2.0, 1.0, 0.5], [1, 1, 1])
    assert [policy.on_arrival(j)[0].chain for j in range(3)] == [0, 1, 2]
    assert policy.on_departure(0, 0) == [Start(2, 0, migrated_from=2)]
    assert policy.occupancy() == [1, 1, 0]
    # a departure from the slowest busy chain moves nothing
    assert policy.on_departure(1, 1) == []
    assert policy.occupancy() == [1, 0, 0]


def test_migration_serves_the_queue_before_migrating() -> None:
    policy = JFFCMigration([2.0, 1.0], [1, 1])
    for j in range(3):
        policy.on_arrival(j)
    assert policy.queue_length() == 1
    assert policy.on_departure(0, 0) == [Start(2, 0)]
    with pytest.raises(ValueError, match="not in service"):
        policy.on_departure(0, 0)
