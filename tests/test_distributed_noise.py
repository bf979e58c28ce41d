"""Distributed Skellam noise (fedpriv.privacy.distributed): exact modular sums, the range check,
the minimum number of contributors, and the accounting through the ledger."""

import json
import math

import numpy as np
import pytest

from fedpriv.errors import PrivacyError
from fedpriv.privacy import distributed as dn
from fedpriv.privacy.accounting import RdpAccountant, epsilon_rdp
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.privacy.records import Release, records_from_list


def _plan(n_nodes=5, users=50, min_contributors=None):
    return dn.plan_round([("b", 300, 2.0, 1.5), ("A", 1000, 0.5, 3.0)], max_users=users, n_nodes=n_nodes, min_contributors=min_contributors)


def _node_values(rng, plan, users_per_node):
    """A node's sums of clipped per-user contributions (each user's part has L2 <= sensitivity)."""
    out = {}
    for p in plan.parts:
        x = rng.normal(size=(users_per_node, p.length))
        x *= p.sensitivity / np.linalg.norm(x, axis=1, keepdims=True)
        out[p.name] = x.sum(axis=0)
    return out


def test_the_modular_sum_is_the_exact_sum_of_the_nodes_quantized_noised_words():
    plan = _plan()
    rng = np.random.default_rng(0)
    values = [_node_values(rng, plan, 10) for _ in range(5)]
    words, exact = [], np.zeros(plan.length, dtype=object)
    for i, v in enumerate(values):
        w = dn.encode(plan, v, np.random.default_rng(100 + i))
        words.append(w)
        # the same node again, with the same generator: its integers before the modulus
        g = np.random.default_rng(100 + i)
        for p in plan.parts:
            q = np.rint(np.asarray(v[p.name]) * p.scale).astype(np.int64)
            noise = dn.skellam_share(g, plan.share_variance(p), p.length, name=p.name)
            exact[p.offset : p.offset + p.length] += (q + noise).astype(object)
    total = words[0]
    for w in words[1:]:
        total = dn.add_words(plan, total, w)
    out = dn.decode(plan, total, 5)
    for p in plan.parts:
        want = np.array([int(x) for x in exact[p.offset : p.offset + p.length]], dtype=np.float64) / p.scale
        np.testing.assert_array_equal(out[p.name], want)
        # and it is the real sum, up to rounding and the noise
        real = sum(v[p.name] for v in values)
        assert np.std(out[p.name] - real) == pytest.approx(dn.released_std(plan, p, 5) / p.scale, rel=0.15)
    assert plan.bits < 64  # narrower than a word: the range bound chose it


def test_noise_shares_add_up_to_the_planned_noise_and_more_contributors_add_more():
    plan = _plan(n_nodes=8, min_contributors=4)
    p = plan.part("A")
    zero = {q.name: np.zeros(q.length) for q in plan.parts}
    for n in (4, 8):
        total = np.zeros(plan.length, dtype=np.uint64)
        for i in range(n):
            total = dn.add_words(plan, total, dn.encode(plan, zero, np.random.default_rng(i)))
        noise = dn.decode(plan, total, n)["A"] * p.scale
        # shares sized against one colluder (the default): n shares of std^2 / (4 - 1) each
        assert np.std(noise) == pytest.approx(p.std * math.sqrt(n / 3), rel=0.1)
    # the planned std is the central z * Delta2, times kappa (~1)
    assert p.std == pytest.approx(p.noise_multiplier * p.delta2, rel=1e-9)
    assert p.delta2 <= p.sensitivity * p.scale * (1 + 1.01 * dn.ROUNDING_SHARE)


def test_too_few_contributors_or_a_wrapped_sum_releases_nothing():
    plan = _plan(n_nodes=5, min_contributors=4)
    ledger = PrivacyLedger(seed=1)
    total = np.zeros(plan.length, dtype=np.uint64)
    for i in range(3):
        total = dn.add_words(plan, total, dn.encode(plan, {q.name: np.zeros(q.length) for q in plan.parts}, np.random.default_rng(i)))
    with pytest.raises(PrivacyError, match="fewer than the 4"):
        ledger.skellam_round(plan, lambda: dn.decode(plan, total, 3), 3)
    assert ledger.releases == []
    # a node that sends words beyond its bounds (here: half the modulus) makes the sum leave its range
    bad = np.full(plan.length, np.uint64(1 << (plan.bits - 2)), dtype=np.uint64)
    total4 = dn.add_words(plan, total, bad)
    with pytest.raises(PrivacyError, match="outside its range"):
        ledger.skellam_round(plan, lambda: dn.decode(plan, total4, 4), 4)
    assert ledger.releases == []
    # an honest node's words are refused at the source when its values exceed the declared bound
    with pytest.raises(PrivacyError, match="declared bound"):
        dn.encode(plan, {"b": np.full(300, 1e9), "A": np.zeros(1000)}, np.random.default_rng(0))


def test_a_plan_that_cannot_fit_64_bits_is_an_error_naming_the_bound():
    with pytest.raises(PrivacyError, match="bits"):
        dn.plan_round([("b", 10, 1.0, 1.0)], max_users=10**14, n_nodes=3)
    plan = _plan()
    assert dn.DistributedPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    broken = plan.to_dict() | {"bits": 8}
    with pytest.raises(PrivacyError, match="does not fit"):
        dn.DistributedPlan.from_dict(broken)


@pytest.mark.parametrize("z", [0.6, 1.0, 4.0, 30.0])
def test_skellam_accounting_never_exceeds_the_gaussian_it_replaces(z):
    """At every order, the Skellam record's RDP is at most the Gaussian's with the same z; the
    epsilon of a plan is therefore at most the central one (and equal to 4 digits)."""
    plan = dn.plan_round([("s", 5000, 1.0, z)], max_users=1000, n_nodes=10)
    p = plan.part("s")
    rho, xi = dn.skellam_zcdp(p.delta2, p.delta1, p.std)
    for alpha in (1.0, 1.5, 2, 8, 64, 1024):
        assert xi + rho * alpha <= alpha / (2 * z * z)
    sk = Release("s", "skellam", p.delta2, dn.released_std(plan, p, 10), 20, None, 5000, l1_sensitivity=p.delta1)
    ga = Release("s", "gaussian", 1.0, z, 20, None, 5000)
    # Skellam records are accounted at integer orders only (the bound is proven there): compare there
    e_sk, e_ga = epsilon_rdp([sk], 1e-5), epsilon_rdp([ga], 1e-5, integer_orders=True)
    assert e_sk <= e_ga
    assert e_sk == pytest.approx(e_ga, rel=1e-4)


def test_the_ledger_records_a_secure_round_and_json_recomputes_its_epsilon(tmp_path):
    plan = _plan()
    ledger = PrivacyLedger(budget=(50.0, 1e-5), accountant=RdpAccountant())
    total = np.zeros(plan.length, dtype=np.uint64)
    for i in range(5):
        total = dn.add_words(plan, total, dn.encode(plan, _node_values(np.random.default_rng(i), plan, 10), np.random.default_rng(50 + i)))
    out = ledger.skellam_round(plan, lambda: dn.decode(plan, total, 5), 5)
    assert set(out) == {"b", "A"}
    assert [(r.name, r.mechanism) for r in ledger.releases] == [("b", "skellam"), ("A", "skellam")]
    path = tmp_path / "ledger.json"
    ledger.write(path)
    again = records_from_list(json.loads(path.read_text()))
    assert again == ledger.releases
    eps = RdpAccountant().epsilon(again, 1e-5)
    assert eps == pytest.approx(epsilon_rdp(ledger.releases, 1e-5), rel=1e-12)
    # and it is the Gaussian epsilon of z = 1.5 and z = 3 composed at integer orders (to 4 digits)
    ga = [Release("b", "gaussian", 1.0, 1.5, 1, None, 300), Release("A", "gaussian", 1.0, 3.0, 1, None, 1000)]
    assert eps == pytest.approx(epsilon_rdp(ga, 1e-5, integer_orders=True), rel=1e-4)
    # a budget the round would exceed refuses before unmasking
    tight = PrivacyLedger(budget=(0.5, 1e-5), accountant=RdpAccountant())
    called = []
    with pytest.raises(PrivacyError, match="budget"):
        tight.skellam_round(plan, lambda: called.append(1), 5)
    assert called == [] and tight.releases == []


def test_node_noise_draws_are_sanctioned(strictly_guarded_rng):
    plan = _plan()
    dn.encode(plan, {q.name: np.zeros(q.length) for q in plan.parts}, np.random.default_rng(3))
    assert strictly_guarded_rng == []
