"""OT plans (marginals, row normalisation, the price term under both modes) and the paper's metrics."""

from __future__ import annotations

import numpy as np
import pytest

from petals_chain.torta.metrics import (horizon_load_balance, load_balance, prediction_accuracy, slot_load_balance,
                                       switching_cost)
from petals_chain.torta.params import DEFAULT, TortaParamError
from petals_chain.torta.topology import TopologyError, load_regions
from petals_chain.torta.transport import TransportError, cost_matrix, ot_plan, row_normalise


@pytest.fixture(scope="module")
def abilene():
    return load_regions("abilene", DEFAULT, np.random.default_rng(3))


def test_balanced_plan_meets_both_marginals(abilene):
    rng = np.random.default_rng(0)
    cost = cost_matrix(abilene.latency_s, abilene.price_per_kwh, DEFAULT)
    for _ in range(5):
        mu, nu = rng.random(12), rng.random(12)
        plan = ot_plan(mu, nu, cost, DEFAULT)
        assert np.abs(plan.sum(1) - mu / mu.sum()).max() < 1e-9
        assert np.abs(plan.sum(0) - nu / nu.sum()).max() < 1e-9
        assert (plan >= 0).all()
        prob = row_normalise(plan)
        assert np.abs(prob.sum(1) - 1).max() < 1e-12


def test_row_normalise_any_policy_output():
    a = np.array([[0.0, 0.0, 0.0], [1.0, 3.0, 0.0], [-0.1, 2.0, 2.0]])
    out = row_normalise(a)
    np.testing.assert_allclose(out.sum(1), 1.0)
    np.testing.assert_allclose(out[0], 1 / 3)
    np.testing.assert_allclose(out[1], [0.25, 0.75, 0.0])
    assert (out >= 0).all()


def test_balanced_price_term_cannot_move_the_plan(abilene):
    """With both marginals fixed, a column-only term adds a constant: the network cost of the optimum is unchanged."""
    rng = np.random.default_rng(1)
    mu, nu = rng.random(12), rng.random(12)
    net = abilene.latency_s * 1e3
    costs = []
    for w1 in (0.0, 1.0, 100.0):
        plan = ot_plan(mu, nu, cost_matrix(abilene.latency_s, abilene.price_per_kwh, DEFAULT.with_(ot_w1=w1)),
                       DEFAULT)
        costs.append(float((plan * net).sum()))
    assert max(costs) - min(costs) < 1e-9


def test_unbalanced_plan_moves_mass_to_cheap_regions(abilene):
    mu = abilene.demand_share
    nu = np.ones(12)
    cheap = np.argsort(abilene.price_per_kwh)[:3]
    p = DEFAULT.with_(ot_mode="unbalanced")
    plan = ot_plan(mu, nu, cost_matrix(abilene.latency_s, abilene.price_per_kwh, p), p)
    np.testing.assert_allclose(plan.sum(1), mu / mu.sum(), atol=1e-9)
    assert plan.sum(0)[cheap].sum() > 3 / 12 + 0.05
    balanced = ot_plan(mu, nu, cost_matrix(abilene.latency_s, abilene.price_per_kwh, DEFAULT), DEFAULT)
    assert abs(balanced.sum(0)[cheap].sum() - 3 / 12) < 1e-9


def test_sinkhorn_plan_meets_both_marginals_and_moves_smoothly(abilene):
    """ot_mode="sinkhorn": the entropic plan meets both marginals, and a small change of μ moves it a little (the
    exact LP's plan is a vertex of the transport polytope and can jump)."""
    p = DEFAULT.with_(ot_mode="sinkhorn")
    cost = cost_matrix(abilene.latency_s, abilene.price_per_kwh, p)
    rng = np.random.default_rng(4)
    mu, nu = rng.random(12) + 0.5, rng.random(12) + 0.5
    plan = ot_plan(mu, nu, cost, p)
    np.testing.assert_allclose(plan.sum(1), mu / mu.sum(), atol=1e-8)
    np.testing.assert_allclose(plan.sum(0), nu / nu.sum(), atol=1e-8)
    nudged = mu * (1 + 0.01 * rng.standard_normal(12))
    assert np.linalg.norm(row_normalise(ot_plan(nudged, nu, cost, p)) - row_normalise(plan)) < 0.1


def test_default_plan_sheds_a_queued_region(abilene):
    """ν = capacity minus queue (the default): a region holding a backlog of half its slot capacity receives less of
    the plan than with no queue; with ν = total capacity (nu_total=True) its share is unchanged."""
    from petals_chain.torta.episode import macro_plan

    cost = cost_matrix(abilene.latency_s, abilene.price_per_kwh, DEFAULT)
    f, cap = abilene.demand_share * 500, np.full(12, 100.0)
    queue = np.zeros(12)
    queue[4] = 50.0
    inflow = {(tot, q): f @ macro_plan(f, cap, queue if q else 0 * queue, cost, DEFAULT.with_(nu_total=tot))
              for tot in (False, True) for q in (False, True)}
    assert inflow[False, True][4] < 0.75 * inflow[False, False][4]
    assert inflow[True, True][4] == pytest.approx(inflow[True, False][4])


def test_bad_transport_input_is_refused(abilene):
    cost = cost_matrix(abilene.latency_s, abilene.price_per_kwh, DEFAULT)
    with pytest.raises(TransportError, match="mu"):
        ot_plan(-np.ones(12), np.ones(12), cost, DEFAULT)
    with pytest.raises(TransportError, match="cost"):
        ot_plan(np.ones(3), np.ones(3), cost, DEFAULT)


def test_load_balance_on_hand_values():
    assert load_balance(np.array([1.0, 3.0])) == pytest.approx(2 / 3)
    assert load_balance(np.array([0.5, 0.5, 0.5])) == pytest.approx(1.0)
    assert load_balance(np.zeros(4)) == 1.0
    with pytest.raises(ValueError):
        load_balance(np.array([]))


def test_slot_and_horizon_load_balance_on_hand_values():
    util = np.array([[1.0, 0.5], [0.0, 0.5], [0.7, 0.0]])  # (servers, slots)
    on = np.array([[True, True], [True, True], [False, True]])  # server 2 is on in slot 1 only
    # slot 0 over servers 0, 1: U = [1, 0], CV 1 → 1/2 (server 2's 0.7 is not counted: it was off);
    # slot 1 over all three: U = [1/2, 1/2, 0], mean 1/3, std √2/6, CV √2/2
    assert slot_load_balance(util, on) == pytest.approx((0.5 + 1 / (1 + np.sqrt(2) / 2)) / 2)
    # per server over its on slots: [3/4, 1/4, 0], mean 1/3, variance 7/72
    assert horizon_load_balance(util, on) == pytest.approx(1 / (1 + 3 * np.sqrt(7 / 72)))
    with pytest.raises(ValueError, match="util/on"):
        slot_load_balance(util, on[:, :1])
    with pytest.raises(ValueError, match="no server"):
        horizon_load_balance(util, np.zeros_like(on))


def test_prediction_accuracy_on_hand_values():
    assert prediction_accuracy(np.array([4.0, 9.0]), np.array([4.0, 9.0])) == pytest.approx(1.0)
    # |2 − 1| / (1 + 1) = 0.5 and |3 − 3| / 4 = 0 → exp(−0.25)
    assert prediction_accuracy(np.array([2.0, 3.0]), np.array([1.0, 3.0])) == pytest.approx(np.exp(-0.25))
    with pytest.raises(ValueError, match="shape"):
        prediction_accuracy(np.zeros(2), np.zeros(3))


def test_switching_cost_hand_value():
    assert switching_cost(np.eye(2), np.array([[0.5, 0.5], [0.5, 0.5]])) == pytest.approx(1.0)


def test_topologies_and_params(abilene):
    assert abilene.n_regions == 12
    assert abilene.latency_s.max() == pytest.approx(0.025)
    np.testing.assert_allclose(abilene.latency_s, abilene.latency_s.T)
    assert (np.diag(abilene.latency_s) == 0).all()
    assert (abilene.servers_per_region() >= 1).all()
    assert 200 <= abilene.n_servers <= 300  # Table I(b): 200–300 GPUs in all
    assert abilene.price_per_kwh.min() >= DEFAULT.price_min and abilene.price_per_kwh.max() <= DEFAULT.price_max
    assert load_regions("cost266", DEFAULT, np.random.default_rng(0)).n_regions == 37
    with pytest.raises(TopologyError, match="nowhere"):
        load_regions("nowhere", DEFAULT, np.random.default_rng(0))
    with pytest.raises(TortaParamError, match="sigmaa"):
        DEFAULT.with_(sigmaa=1.0)
    with pytest.raises(TortaParamError, match="ot_mode"):
        DEFAULT.with_(ot_mode="entropic")
