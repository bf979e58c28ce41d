import math

import numpy as np
import pytest

from fedpriv.errors import ConfigError
from fedpriv.privacy.accounting import (
    PlannedRelease,
    calibrate,
    epsilon_pld,
    epsilon_rdp,
    gaussian_epsilon_closed_form,
    zcdp_rho,
)
from fedpriv.privacy.ledger import Release


def _releases(cal, plan):
    return [Release(p.name, "gaussian", 1.0, cal.multipliers[p.name], p.count, p.sampling_rate) for p in plan]


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 5.0, 20.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-6])
def test_calibration_meets_target_and_closed_form(epsilon, delta):
    plan = [PlannedRelease("mean", 1, 0.02), PlannedRelease("counts", 1, 0.08), PlannedRelease("A", 5, 0.09), PlannedRelease("b", 5, 0.09)]
    cal = calibrate(plan, epsilon, delta)
    rels = _releases(cal, plan)
    eps = epsilon_rdp(rels, delta)
    assert eps <= epsilon * (1 + 1e-9)
    assert abs(eps - epsilon) / epsilon < 1e-3
    # independent closed form: composed Gaussians have RDP curve rho * alpha
    rho = sum(p.count / (2 * cal.multipliers[p.name] ** 2) for p in plan)
    assert rho == pytest.approx(zcdp_rho(rels))
    assert abs(gaussian_epsilon_closed_form(rho, delta) - epsilon) / epsilon < 1e-3
    # shares are respected: z_k^2 proportional to 1 / share_k
    assert cal.multipliers["mean"] ** 2 * 0.02 == pytest.approx(cal.multipliers["A"] ** 2 * 0.09)


def test_closed_form_single_gaussian_known_value():
    # a single Gaussian with z = 1: rho = 0.5; brute-force the conversion over a fine grid
    a = 1 + np.geomspace(1e-3, 1e4, 200_000)
    brute = np.min(0.5 * a + np.log1p(-1 / a) - np.log(1e-5 * a) / (a - 1))
    assert gaussian_epsilon_closed_form(0.5, 1e-5) == pytest.approx(brute, rel=1e-6)


def test_pld_is_a_tighter_second_opinion():
    rels = [Release("x", "gaussian", 1.0, 2.0, 10)]
    e_rdp, e_pld = epsilon_rdp(rels, 1e-5), epsilon_pld(rels, 1e-5)
    assert 0 < e_pld <= e_rdp
    assert e_pld > 0.8 * e_rdp


def test_poisson_sampling_amplifies():
    full = [Release("g", "gaussian", 1.0, 1.0, 100)]
    sampled = [Release("g", "gaussian", 1.0, 1.0, 100, sampling_rate=0.01)]
    assert epsilon_rdp(sampled, 1e-5) < 0.2 * epsilon_rdp(full, 1e-5)


def test_more_releases_cost_more():
    one = epsilon_rdp([Release("g", "gaussian", 1.0, 3.0, 1)], 1e-5)
    four = epsilon_rdp([Release("g", "gaussian", 1.0, 3.0, 4)], 1e-5)
    # four releases at z equal one release at z / 2 (same rho)
    assert four == pytest.approx(epsilon_rdp([Release("g", "gaussian", 1.0, 1.5, 1)], 1e-5), rel=1e-9)
    assert four > one


@pytest.mark.parametrize("eps,delta,field", [(0, 1e-5, "epsilon"), (math.inf, 1e-5, "epsilon"), (1.0, 0.0, "delta"), (1.0, 1.5, "delta")])
def test_calibration_rejects_bad_targets(eps, delta, field):
    with pytest.raises(ConfigError) as e:
        calibrate([PlannedRelease("a", 1, 1.0)], eps, delta)
    assert e.value.field == field


def test_mixed_pure_and_gaussian_ledgers_compose_by_pld():
    """A pure release next to Gaussian ones: dp-accounting's PLDs composed, which is at most
    basic composition (eps_pure + eps_gauss at the same delta) and at least the larger part;
    RDP (pure as eps^2/2-zCDP) is much looser at small delta."""
    from fedpriv.privacy.accounting import PlannedRelease, calibrate, epsilon_bounds, epsilon_mixed_pld
    from fedpriv.privacy.ledger import PrivacyLedger

    z = calibrate([PlannedRelease("g", 3, 1.0)], 2.0, 1e-6).multiplier("g")
    led = PrivacyLedger(seed=0)
    for _ in range(3):
        led.gaussian("g", np.zeros(2), sensitivity=1.0, noise_multiplier=z)
    assert epsilon_mixed_pld(led, 1e-6) is None  # Gaussian only: RDP as before
    assert epsilon_bounds(led, 1e-6)[0] == pytest.approx(2.0, rel=1e-3)
    led.select("pick", "rnm", np.zeros((4, 3)), np.ones(3), epsilon=1.0)
    spent, rdp, pure = epsilon_bounds(led, 1e-6)
    assert pure is None and spent == epsilon_mixed_pld(led, 1e-6)
    assert 2.0 < spent <= 3.0 + 1e-3 and rdp > spent
