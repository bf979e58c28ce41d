"""Skellam accounting at integer RDP orders only (issue 30).

The Skellam mechanism's RDP bound (Agarwal, Kairouz and Liu, NeurIPS 2021, Theorem 3.5 and
Corollary 3.6) is proven for integer orders alpha > 1: a ledger or plan holding a skellam record is
accounted at integer orders for the whole composition, and secure-mode calibration targets epsilon
at those orders. Central mode keeps its orders and multipliers."""

import math

import numpy as np
import pytest

from fedpriv.algorithms import recommend
from fedpriv.algorithms.als import ALSConfig, calibrate_plan, plan_releases, sensitivity
from fedpriv.algorithms.plans import budget_plan
from fedpriv.privacy import distributed as dn
from fedpriv.privacy.accounting import (
    INTEGER_RDP_ORDERS,
    RDP_ORDERS,
    SAMPLED_RDP_ORDERS,
    BestOfAccountant,
    PlannedRelease,
    calibrate,
    epsilon_bounds,
    epsilon_rdp,
    needs_integer_orders,
    pld_supported,
    rdp_curve,
)
from fedpriv.privacy.records import Release, RepeatAndSelect

DELTA = 1e-5
RANGE = (1.0, 5.0)


def _skellam(name: str, c: float, z: float, count: int = 1, length: int = 1000) -> Release:
    """The skellam record a secure round of one part writes (PrivacyLedger.skellam_round): the
    rounded integer sensitivities of the part, and the noise the shares are sized for, kappa z Delta2."""
    p = dn.plan_round([(name, length, c, z)], max_users=1000, n_nodes=10).part(name)
    std = dn.kappa(z, p.delta2) * z * p.delta2
    return Release(name, "skellam", float(p.delta2), std, count, None, int(p.length), l1_sensitivity=float(p.delta1))


def _secure_records(cfg: ALSConfig, multipliers: dict[str, float]) -> list[Release]:
    return [_skellam(p.name, sensitivity(p.name, cfg, RANGE), multipliers[p.name], p.count) for p in plan_releases("adadpals", cfg, False)]


def _is_int(orders) -> bool:
    orders = np.asarray(orders, dtype=float)
    return bool(np.all(orders == np.floor(orders)) and np.all(orders >= 2))


# ---------------------------------------------------------------------- (a) the orders
def test_a_ledger_with_a_skellam_record_is_accounted_at_integer_orders_only():
    sk = _skellam("s", 1.0, 2.0, 3)
    ga = Release("g", "gaussian", 1.0, 2.0, 4)
    sampled = Release("q", "gaussian", 1.0, 1.2, 50, 0.01)
    tuned = RepeatAndSelect("tuning", 5.0, 1.0, 0, (sk, ga))
    for rels in ([sk], [sk, ga], [ga, sk], [sk, sampled], [tuned]):
        assert needs_integer_orders(rels)
        orders, rdp = rdp_curve(rels)
        assert _is_int(orders) and np.all(np.isfinite(rdp))
    assert np.array_equal(rdp_curve([sk, ga])[0], INTEGER_RDP_ORDERS)
    # dense near the small orders, as far as the usual ones go
    assert np.array_equal(INTEGER_RDP_ORDERS[:255], np.arange(2, 257)) and INTEGER_RDP_ORDERS[-1] == RDP_ORDERS[-1]
    big = INTEGER_RDP_ORDERS[INTEGER_RDP_ORDERS >= 256]
    assert np.all(np.diff(big) / big[:-1] < 0.03)
    # mixed: restricting the orders only makes epsilon larger, and every accountant uses them
    both = [sk, ga]
    orders, rdp = rdp_curve(both)
    import dp_accounting.rdp.rdp_privacy_accountant as rdp_acc

    assert epsilon_rdp(both, DELTA) == pytest.approx(float(rdp_acc.compute_epsilon(orders, rdp, DELTA)[0]), rel=1e-12)
    assert epsilon_rdp([ga], DELTA) <= epsilon_rdp([ga], DELTA, integer_orders=True)
    assert BestOfAccountant().epsilon(both, DELTA) == epsilon_bounds(both, DELTA)[0] == epsilon_rdp(both, DELTA)
    # no PLD for Skellam
    assert not pld_supported(both) and not pld_supported([sk])


def test_skellam_rdp_is_below_the_gaussian_at_every_integer_order_with_kappa():
    """kappa^2 = 1 + 3.5 / (z Delta2)^2 keeps the Skellam RDP (xi + rho alpha) below the Gaussian's
    alpha / (2 z^2) at every order >= 1 (with Delta1 <= Delta2^2): so a Gaussian plan calibrated at
    integer orders covers its Skellam releases at those orders."""
    alphas = np.concatenate([INTEGER_RDP_ORDERS, [1.0, 1.5]])
    for z in (0.3, 0.6, 1.0, 4.0, 30.0):
        for delta2 in (1.0, 3.0, 50.0, 2.0**20 + 31.6):
            for delta1 in (delta2, min(delta2**2, 31.6 * delta2), delta2**2):
                std = dn.kappa(z, delta2) * z * delta2
                rho, xi = dn.skellam_zcdp(delta2, delta1, std)
                assert np.all(xi + rho * alphas <= alphas / (2 * z * z) * (1 + 1e-12))


# ---------------------------------------------------------------------- (b), (c) secure plans
@pytest.mark.parametrize("eps", [1.0, 5.0, 20.0])
def test_a_secure_plan_spends_at_most_its_target_at_integer_orders(eps):
    cfg = ALSConfig.from_overrides({"aggregation": "secure"}, "adadpals")
    plan = budget_plan("adadpals", cfg, eps, DELTA)
    assert plan.integer_orders and plan.calibration.integer_orders
    assert plan.multipliers == calibrate_plan("adadpals", cfg, False, eps, DELTA)
    records = _secure_records(cfg, plan.multipliers)
    spent = epsilon_rdp(records, DELTA)
    assert spent <= eps * (1 + 1e-3)
    assert spent >= eps * 0.97
    assert plan.summary()["epsilon_rdp"] == pytest.approx(eps, rel=1e-3)
    assert plan.summary()["epsilon_rdp"] == pytest.approx(spent, rel=1e-6)


@pytest.mark.parametrize("eps, old_spent", [(1.0, 0.99994), (5.0, 5.00729), (20.0, 20.9095)])
def test_the_old_fractional_order_calibration_overspends_at_integer_orders(eps, old_spent):
    """What the reviewer found: the same plan calibrated at fractional orders (central's calibration)
    spends more than its target once its Skellam records are accounted at integer orders."""
    cfg = ALSConfig.from_overrides({"aggregation": "secure"}, "adadpals")
    planned = plan_releases("adadpals", cfg, False)
    old = calibrate(planned, eps, DELTA).multipliers
    new = calibrate(planned, eps, DELTA, integer_orders=True).multipliers
    assert epsilon_rdp(_secure_records(cfg, old), DELTA) == pytest.approx(old_spent, rel=1e-4)
    assert epsilon_rdp(_secure_records(cfg, new), DELTA) <= eps * (1 + 1e-4)
    assert all(new[k] >= old[k] for k in old)  # the price: a little more noise
    if eps == 20.0:
        assert new["users"] == pytest.approx(3.1417066, rel=1e-6) and old["users"] == pytest.approx(3.0453247, rel=1e-6)


@pytest.mark.parametrize("eps", [1.0, 5.0, 20.0])
def test_every_secure_caller_calibrates_at_integer_orders(eps):
    from fedpriv.algorithms import pam
    from fedpriv.algorithms.config import Aggregation, PAMConfig

    # SecureDPFedAvg (its calibration): 10 rounds of one Skellam release
    z = calibrate([PlannedRelease("update", 10, 1.0)], eps, DELTA, integer_orders=True).multiplier("update")
    assert eps * 0.97 <= epsilon_rdp([_skellam("update", 1.0, z, 10)], DELTA) <= eps * (1 + 1e-3)
    # PAM in secure mode
    state, _ = pam.new_pam_state("pam", PAMConfig(aggregation=Aggregation("secure")), 6, 2, 8, eps, DELTA, ledger_seed=0)
    central, _ = pam.new_pam_state("pam", PAMConfig(), 6, 2, 8, eps, DELTA, ledger_seed=0)
    recs = [_skellam(p.name, 1.0, state.multipliers[p.name], p.count) for p in pam.plan_pam_releases("pam", state.config)]
    assert eps * 0.97 <= epsilon_rdp(recs, DELTA) <= eps * (1 + 1e-3)
    assert all(state.multipliers[k] >= central.multipliers[k] for k in central.multipliers)
    # the recommendation's histogram, as secure mode asks for it
    cfg = recommend.RecommendConfig(hist_epsilon=eps, hist_delta=DELTA)
    z = recommend.hist_multiplier(cfg, integer_orders=True)
    assert epsilon_rdp([_skellam(recommend.HIST_RELEASE, 1.0, z)], DELTA) <= eps * (1 + 1e-3)


def test_the_secure_strategy_calibrates_at_integer_orders():
    pytest.importorskip("flwr")
    from fedpriv.flower.secure_strategy import SecureDPFedAvg

    s = SecureDPFedAvg(clipping_norm=1.0, epsilon=20.0, delta=DELTA, num_rounds=10)
    assert s.noise_multiplier == pytest.approx(calibrate([PlannedRelease("u", 10, 1.0)], 20.0, DELTA, integer_orders=True).multiplier("u"), rel=1e-12)
    assert epsilon_rdp([_skellam("u", 1.0, s.noise_multiplier, 10)], DELTA) <= 20.0 * (1 + 1e-3)


# ---------------------------------------------------------------------- (d) central mode unchanged
def test_central_plans_and_ledgers_keep_their_orders_and_multipliers():
    ga = [Release("g", "gaussian", 1.0, 2.0, 3)]
    assert np.array_equal(rdp_curve(ga)[0], RDP_ORDERS) and not _is_int(RDP_ORDERS)
    assert np.array_equal(rdp_curve([Release("q", "gaussian", 1.0, 1.2, 50, 0.01)])[0], SAMPLED_RDP_ORDERS)
    assert not needs_integer_orders(ga)
    # pinned before the change
    cal = calibrate_plan("adadpals", ALSConfig.from_overrides({}, "adadpals"), False, 5.0, DELTA)
    assert cal["users"] == pytest.approx(9.526734650213644, rel=1e-12)
    assert cal["item_stats_A"] == pytest.approx(3.0380414034443577, rel=1e-12)
    plan = budget_plan("adadpals", ALSConfig.from_overrides({}, "adadpals"), 5.0, DELTA)
    assert not plan.integer_orders and plan.summary()["epsilon_rdp"] == pytest.approx(4.999828855985658, rel=1e-12)
    assert calibrate([PlannedRelease("g", 10, 1.0)], 20.0, DELTA).multiplier("g") == pytest.approx(0.9629659163092771, rel=1e-12)
    sampled = calibrate([PlannedRelease("a", 1, 0.2), PlannedRelease("b", 5, 0.8, 0.01)], 2.0, DELTA)
    assert sampled.multipliers["a"] == pytest.approx(10.646769427552487, rel=1e-12)
    assert sampled.multipliers["b"] == pytest.approx(0.8433182230597914, rel=1e-12)
    # the histogram: central z as before
    assert recommend.hist_multiplier(recommend.RecommendConfig()) == pytest.approx(4.53132082803196, rel=1e-12)
    cfg20 = recommend.RecommendConfig(hist_epsilon=20.0, hist_delta=DELTA)
    assert recommend.hist_multiplier(cfg20, integer_orders=False) == pytest.approx(0.30453247076319545, rel=1e-12)
    assert math.isclose(epsilon_rdp(ga, DELTA), epsilon_rdp(ga, DELTA, integer_orders=False))
