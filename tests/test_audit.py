"""Empirical privacy audit: Clopper-Pearson bounds, the epsilon lower bound, and the audit of the
real releases of adadpals, dpals-uniform / -tail and am-ssp (sound when calibrated, powerful when
the noise is cut), on neighbouring data sets written and read back through the real loader (the
audited user's removal renumbers every other user; only the secret randomness is fixed)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binomtest

from conftest import load_script
from fedpriv.algorithms.als import ALSConfig
from fedpriv.data.spec import load_spec, parse_data_spec
from fedpriv.privacy.audit import audit_gaussian_release, clopper_pearson, epsilon_lower_bound, select_threshold
from fedpriv.privacy.ledger import PrivacyLedger

DATA = "synthetic-mf:users=150,items=60,ratings=2500,seed=3"


@pytest.fixture(scope="module")
def script():
    return load_script("audit")


@pytest.fixture(scope="module")
def ds():
    return load_spec(parse_data_spec(DATA))


def _cfg(script, **more) -> ALSConfig:
    return ALSConfig.from_overrides({**script.AUDIT_OVERRIDES, "rank": 2, "steps": 2, **more})


# DPALS keeps k items per user: with k = 5 (the users of DATA rate about 17 items) the sampling
# is active for most of them, so their keys decide their contributions
SAMPLING = {"k": 5}


# ---------------------------------------------------------------------------- statistics
@pytest.mark.parametrize("alpha", [0.05, 0.01])
def test_clopper_pearson_known_values(alpha):
    lo, hi = clopper_pearson(0, 10, alpha)
    assert lo == 0.0 and hi == pytest.approx(1 - (alpha / 2) ** (1 / 10), rel=1e-12)
    lo, hi = clopper_pearson(10, 10, alpha)
    assert hi == 1.0 and lo == pytest.approx((alpha / 2) ** (1 / 10), rel=1e-12)
    # k = 3, n = 10, alpha = 0.05: the textbook exact interval (0.0667, 0.6525)
    if alpha == 0.05:
        lo, hi = clopper_pearson(3, 10, alpha)
        assert (lo, hi) == pytest.approx((0.066739, 0.652453), abs=1e-6)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), frac=st.floats(0, 1), alpha=st.floats(0.001, 0.5))
def test_clopper_pearson_matches_scipy_exact_interval(n, frac, alpha):
    k = int(round(frac * n))
    lo, hi = clopper_pearson(k, n, alpha)
    ref = binomtest(k, n).proportion_ci(confidence_level=1 - alpha, method="exact")
    assert lo == pytest.approx(ref.low, abs=1e-9) and hi == pytest.approx(ref.high, abs=1e-9)
    assert lo <= k / n <= hi


def test_epsilon_lower_bound_values():
    # identical distributions: FPR + FNR = 1, nothing can be claimed
    assert epsilon_lower_bound(500, 1000, 500, 1000, 1e-5) == 0.0
    assert epsilon_lower_bound(1000, 1000, 0, 1000, 1e-5) == 0.0
    assert epsilon_lower_bound(0, 0, 0, 0, 1e-5) == 0.0
    # a perfect test on 1000 + 1000 trials: log((1 - delta - hi) / hi), hi = 1 - (alpha/2)^(1/n)
    hi = 1 - 0.025 ** (1 / 1000)
    assert epsilon_lower_bound(0, 1000, 0, 1000, 1e-5, 0.05) == pytest.approx(math.log((1 - 1e-5 - hi) / hi))
    # the two inequalities are symmetric in (FPR, FNR)
    assert epsilon_lower_bound(10, 1000, 300, 1000, 1e-5) == epsilon_lower_bound(300, 1000, 10, 1000, 1e-5) > 0


@settings(max_examples=50, deadline=None)
@given(n=st.integers(10, 3000), a=st.floats(0, 1), b=st.floats(0, 1))
def test_epsilon_lower_bound_never_claims_from_a_coin_flip(n, a, b):
    """Rates that add up to at least one are those of a blind test: the bound is 0."""
    fp = int(math.ceil(a * n))
    fn = min(n, int(math.ceil((1 - a) * n + b)))
    assert epsilon_lower_bound(fp, n, fn, n, 1e-5) == 0.0


def test_threshold_selection_picks_the_separating_threshold():
    rng = np.random.default_rng(0)
    s0, s1 = rng.normal(0, 1, 4000), rng.normal(3, 1, 4000)
    t, eps = select_threshold(s0, s1, 1e-5, 0.05, 200)
    assert 0.5 < t < 3.5 and eps > 1.0


def test_audit_of_a_release_that_ignores_the_data_claims_nothing():
    ledger = PrivacyLedger(seed=5)

    def release(values):
        return {n: ledger.gaussian(n, np.zeros_like(v), sensitivity=1.0, noise_multiplier=1.0) for n, v in values.items()}

    res = audit_gaussian_release(release, {"x": np.ones(4)}, {"x": np.zeros(4)}, trials=4000, delta=1e-5)["x"]
    assert res["lower_bound"] == 0.0 and res["difference_norm"] == 2.0
    assert abs(res["empirical_separation"]) < 0.1


def test_audit_of_a_plain_gaussian_mechanism_is_sound_and_has_power():
    from fedpriv.privacy.accounting import epsilon_rdp
    from fedpriv.privacy.ledger import Release

    for z, expect_above in ((1.0, None), (0.25, 2.0)):
        ledger = PrivacyLedger(seed=11)

        def release(values, z=z, ledger=ledger):
            return {n: ledger.gaussian(n, v, sensitivity=1.0, noise_multiplier=z) for n, v in values.items()}

        res = audit_gaussian_release(release, {"x": np.array([0.6, 0.8, 0.0])}, {"x": np.zeros(3)}, trials=6000, delta=1e-5)["x"]
        eps = epsilon_rdp([Release("x", "gaussian", 1.0, z, 1, None, 3)], 1e-5)
        assert 0 < res["lower_bound"] <= eps
        assert res["empirical_separation"] == pytest.approx(1 / z, rel=0.1)
        if expect_above:
            assert res["lower_bound"] > expect_above


# ---------------------------------------------------------------------------- real releases
@pytest.mark.parametrize("algorithm", ["adadpals", "am-ssp"])
def test_calibrated_releases_pass_the_audit(script, ds, algorithm):
    cfg = _cfg(script)
    entries = script.audit_setting(algorithm, 2.0, ds, cfg, trials=2000, seed=3)
    assert {"users", "mean", "counts", "item_stats_A", "item_stats_b"} <= set(entries)
    d = cfg.rank + 1
    assert entries["item_stats_A"]["dim"] == ds.interactions.n_items * d * (d + 1) // 2
    assert entries["item_stats_b"]["dim"] == ds.interactions.n_items * d
    for name, e in entries.items():
        assert e["ok"] and e["lower_bound"] <= e["accounted_epsilon"], name
        assert e["accounted_epsilon"] == e["claimed_epsilon"] > 0, name
        assert e["noise_multiplier"] == pytest.approx(e["calibrated_noise_multiplier"]), name
        assert e["sensitivity_ok"], name
        # the audited user is a worst case: it reaches the clipping bounds
        floor = 0.8 if name == "item_stats_A" else 0.999  # A: the fixed bias coordinate caps the upper triangle (<= 0.901)
        assert e["difference_over_sensitivity"] > floor, name
        assert e["empirical_separation"] == pytest.approx(e["expected_separation"], abs=0.15), name
        # D' = D minus the audited user, both read back by the loader: everybody else renumbered
        assert e["renumbered_users"] == ds.interactions.n_users > 0, name
        assert e["n_items"] == ds.interactions.n_items, name
    assert entries["item_stats_b"]["user_vector_norm"] == pytest.approx(cfg.user_clip)


@pytest.mark.parametrize("algorithm", ["dpals-uniform", "dpals-tail"])
def test_audit_of_keyed_sampling_algorithms_runs(script, ds, algorithm):
    """DPALS's users sample their items with their secret keys: the audit keys every user of D
    and D' from one set of secrets, by raw id, so the renumbered users sample the same items."""
    entries = script.audit_setting(algorithm, 2.0, ds, _cfg(script, **SAMPLING), trials=2000, seed=5)
    assert {"mean", "item_stats_A", "item_stats_b"} <= set(entries)
    for name, e in entries.items():
        assert e["sensitivity_ok"] and e["difference_norm"] > 0, name
        assert e["ok"] and e["lower_bound"] <= e["accounted_epsilon"], name
        assert e["renumbered_users"] > 0 and e["renumbered_users"] == ds.interactions.n_users, name
        assert e["n_items"] == ds.interactions.n_items and e["n_users_with"] == e["n_users_without"] + 1, name
    assert entries["item_stats_b"]["difference_over_sensitivity"] > 0.999


def test_audit_catches_choices_keyed_by_dense_index(script, ds, monkeypatch):
    """Power against the bug the raw-id keys prevent: keyed by dense index, the renumbered users
    of D' sample other items than on D, and the difference exceeds the sensitivity."""
    real = script.user_keys
    monkeypatch.setattr(script, "user_keys", lambda key, raw_ids: real(key, np.arange(len(raw_ids))))
    entries = script.audit_setting("dpals-uniform", 2.0, ds, _cfg(script, **SAMPLING), trials=400, seed=5, releases=("item_stats_b",))
    assert not entries["item_stats_b"]["sensitivity_ok"]
    assert entries["item_stats_b"]["difference_over_sensitivity"] > 2


def test_neighbours_renumber_every_other_user_and_keep_their_contributions(script, ds, tmp_path):
    """The audited user gets the smallest raw id (dense id 0 in D, every other user moves by one);
    the other users' exact item statistics are bit for bit the same on D and D' (same raw id,
    same key, same sampled items), so the difference is the audited user's alone."""
    from fedpriv.algorithms import protocol
    from fedpriv.engine.inprocess import new_state
    from fedpriv.privacy.randomness import RunSecrets

    cfg = _cfg(script, **SAMPLING)
    state, _ = new_state("dpals-uniform", cfg, ds.interactions, ds.rating_range, ds.implicit, 2.0, 1e-5)
    state.mean = 3.0
    protocol.server_setup(state, ds.item_features)
    user = script.stats_user(0, state)
    raw = script.audited_raw_id(ds.interactions)
    assert raw < ds.interactions.user_ids.min()
    d = script.write_and_load(tmp_path / "d", ds, user, raw)
    d_prime = script.write_and_load(tmp_path / "d-prime", ds)
    assert d_prime.interactions.n_items == d.interactions.n_items == ds.interactions.n_items
    assert np.array_equal(d_prime.interactions.user_ids, ds.interactions.user_ids)
    pair = script.neighbours(d, d_prime, raw, user, RunSecrets(7))
    assert pair.user == 0 and pair.renumbered_users == d_prime.interactions.n_users
    others, everyone = pair.shards[1], pair.shards_prime[0]
    assert np.array_equal(others.user_keys, everyone.user_keys)
    assert not np.array_equal(others.user_ids, everyone.user_ids)  # renumbered
    a, b = protocol.client_step(others, state, 0), protocol.client_step(everyone, state, 0)
    assert np.array_equal(a.item_ids, b.item_ids) and np.array_equal(a.A, b.A) and np.array_equal(a.b, b.b)


@pytest.mark.parametrize("algorithm", ["adadpals", "am-ssp"])
def test_audit_detects_noise_cut_by_ten(script, ds, algorithm):
    """Power: with the multipliers divided by 10 the lower bound exceeds the epsilon the
    calibrated mechanism claims (the ledger still accounts the noise actually drawn)."""
    entries = script.audit_setting(algorithm, 1.0, ds, _cfg(script), trials=2000, seed=4, broken_noise_factor=10.0, releases=("counts", "item_stats_A", "item_stats_b"))
    assert set(entries) == {"counts", "item_stats_A", "item_stats_b"}
    for name, e in entries.items():
        assert e["exceeds_claimed"] and e["lower_bound"] > e["claimed_epsilon"], name
        assert e["ok"] and e["lower_bound"] <= e["accounted_epsilon"], name
        assert e["noise_multiplier"] == pytest.approx(e["calibrated_noise_multiplier"] / 10), name


def test_script_writes_json_and_fails_on_undetected_break(script, tmp_path):
    out = tmp_path / "audit.json"
    args = ["--data", DATA, "--algorithms", "adadpals", "--epsilon", "1", "--trials", "400", "--set", "rank=2", "--releases", "item_stats_b", "--out", str(out)]
    assert script.main(args) == 0
    rep = json.loads(out.read_text())
    e = rep["results"]["adadpals"]["1"]["item_stats_b"]
    assert rep["all_ok"] and e["ok"] and e["trials"] == 400
    # a noise cut of 1.01 cannot be detected with 400 trials: the power check fails the run
    assert script.main([*args, "--broken-noise-factor", "1.01"]) == 1
