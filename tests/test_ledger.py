import json

import numpy as np
import pytest
from conftest import als_config

from fedpriv.algorithms.als import ALGORITHMS
from fedpriv.errors import PrivacyError
from fedpriv.privacy.accounting import BestOfAccountant, epsilon_rdp
from fedpriv.privacy.ledger import PrivacyLedger, Release


def test_gaussian_release_is_recorded_with_its_parameters():
    led = PrivacyLedger(seed=1)
    x = np.zeros(10_000)
    y = led.gaussian("stat", x, sensitivity=2.0, noise_multiplier=3.0)
    assert np.std(y) == pytest.approx(6.0, rel=0.05)
    led.gaussian("stat", x, sensitivity=2.0, noise_multiplier=3.0)
    (rec,) = led.to_list()
    assert rec["name"] == "stat" and rec["mechanism"] == "gaussian"
    assert rec["sensitivity"] == 2.0 and rec["noise_std"] == 6.0 and rec["count"] == 2
    assert rec["noise_multiplier"] == 3.0 and rec["sampling_rate"] is None and rec["dim"] == 10_000


def test_symmetric_noise_is_symmetric_with_the_right_scale():
    led = PrivacyLedger(seed=2)
    out = led.gaussian("A", np.zeros((500, 4, 4)), sensitivity=1.0, noise_multiplier=2.0, symmetric=True)
    assert np.allclose(out, np.swapaxes(out, -1, -2))
    assert np.std(out[:, np.triu_indices(4)[0], np.triu_indices(4)[1]]) == pytest.approx(2.0, rel=0.05)
    assert led.releases[0].dim == 500 * 10


def test_seeded_ledgers_reproduce_and_secure_ones_do_not():
    a = PrivacyLedger(seed=5).gaussian("x", np.zeros(5), sensitivity=1, noise_multiplier=1)
    b = PrivacyLedger(seed=5).gaussian("x", np.zeros(5), sensitivity=1, noise_multiplier=1)
    c = PrivacyLedger(seed=5, secure=True).gaussian("x", np.zeros(5), sensitivity=1, noise_multiplier=1)
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_secure_noise_is_gaussian_with_the_calibrated_scale():
    from scipy import stats

    led = PrivacyLedger(seed=5, secure=True)
    x = led.gaussian("x", np.zeros(200_001), sensitivity=2.0, noise_multiplier=1.5)
    assert stats.kstest(x / 3.0, "norm").pvalue > 1e-4
    assert abs(np.std(x) - 3.0) < 0.03
    sym = led.gaussian("A", np.zeros((300, 4, 4)), sensitivity=1.0, noise_multiplier=1.0, symmetric=True)
    assert np.array_equal(sym, np.swapaxes(sym, -1, -2)) and abs(np.std(sym) - 1.0) < 0.05
    assert [r.count for r in led.releases] == [1, 1]


def test_budget_refuses_a_release_before_drawing():
    led = PrivacyLedger(seed=0, budget=(1.0, 1e-5), accountant=BestOfAccountant())
    led.gaussian("x", np.zeros(3), sensitivity=1.0, noise_multiplier=10.0)
    with pytest.raises(PrivacyError, match="budget"):
        led.gaussian("y", np.zeros(3), sensitivity=1.0, noise_multiplier=0.5)
    assert [r.name for r in led.releases] == ["x"]
    assert epsilon_rdp(led, 1e-5) < 1.0


@pytest.mark.parametrize("kw", [{"sensitivity": 0.0, "noise_multiplier": 1.0}, {"sensitivity": 1.0, "noise_multiplier": float("inf")}, {"sensitivity": float("nan"), "noise_multiplier": 1.0}])
def test_invalid_release_parameters_are_refused(kw):
    with pytest.raises(PrivacyError):
        PrivacyLedger(seed=0).gaussian("x", np.zeros(2), **kw)


def test_non_finite_value_is_refused():
    with pytest.raises(PrivacyError, match="non-finite"):
        PrivacyLedger(seed=0).gaussian("x", np.array([1.0, np.nan]), sensitivity=1, noise_multiplier=1)


def test_ledger_json_round_trip(tmp_path):
    led = PrivacyLedger(seed=0)
    led.gaussian("x", np.zeros(2), sensitivity=1.5, noise_multiplier=2.0, sampling_rate=0.1)
    led.write(tmp_path / "ledger.json")
    back = PrivacyLedger.releases_from_list(json.loads((tmp_path / "ledger.json").read_text()))
    assert back == [Release("x", "gaussian", 1.5, 3.0, 1, 0.1, 2)]


# ---------------------------------------------------------------- completeness guard
def test_guard_catches_a_bypassing_draw(guarded_rng):
    import torch

    with pytest.raises(AssertionError, match="outside the privacy ledger"):
        torch.randn(3)
    with pytest.raises(AssertionError, match="outside the privacy ledger"):
        torch.zeros(3).normal_()
    guarded_rng.clear()
    with pytest.raises(AssertionError, match="outside the privacy ledger"):
        np.random.default_rng(0).normal(size=3)
    with pytest.raises(AssertionError, match="outside the privacy ledger"):
        np.random.Generator(np.random.PCG64(0)).standard_normal(3)
    assert guarded_rng == ["normal", "standard_normal"]
    # a sanctioned draw passes
    led = PrivacyLedger(seed=0)
    led.gaussian("x", np.zeros(3), sensitivity=1.0, noise_multiplier=1.0)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_draws_noise_only_through_the_ledger(small_mf, guarded_rng, algorithm):
    from fedpriv.algorithms.als import ALSConfig, plan_releases
    from fedpriv.engine.inprocess import train_inprocess

    cfg = als_config(algorithm, rank=3, steps=2, ssp_steps=5, ssp_resamples=3 if algorithm == "am-ssp1" else 0)
    from fedpriv.algorithms import registry

    eps = 2.0 if registry.get(algorithm).private else None  # als and ease: non-private references
    res = train_inprocess(algorithm, small_mf.interactions, cfg, rating_range=(1, 5), epsilon=eps, item_features=small_mf.item_features, progress=False)
    assert guarded_rng == []
    # the ledger holds exactly the planned releases, each with its planned count
    planned = {p.name: p.count for p in plan_releases(algorithm, cfg, implicit=False)}
    assert {r.name: r.count for r in res.ledger.releases} == planned
    if eps:
        assert epsilon_rdp(res.ledger, 1e-5) == pytest.approx(eps, rel=1e-3)


def test_private_tuning_draws_only_through_the_ledger(small_mf, guarded_rng):
    from fedpriv.data.splits import random_split
    from fedpriv.privacy.plan import TuningPlan
    from fedpriv.run.tuning import tune

    split = random_split(small_mf.interactions, seed=1)
    res, parent, report, _ = tune("adadpals", split, {"rank": "2", "steps": "1"}, {"mu": ["0", "0.5"]}, TuningPlan(mean=2.0), rating_range=(1, 5), epsilon=2.0, delta=1e-5)
    assert guarded_rng == []
    assert len(parent.releases) == 1 and parent.releases[0].runs >= 1
    # the report holds the selected run only: no K, no other run
    assert set(report) == {"grid", "candidates", "mean_runs", "shape", "score_share", "score_clip", "selected", "selected_noised_score_sum"}
    assert "runs" not in parent.to_list()[0]
    assert epsilon_rdp(parent, 1e-5) == pytest.approx(2.0, rel=1e-3)


@pytest.fixture(scope="module")
def personal_data():
    from fedpriv.data.personal import make_personal

    return make_personal(400, 6, 6, 2, 0.01, seed=3)  # generated before the guard is set


@pytest.fixture(scope="module")
def multitask_data():
    from fedpriv.data.synthetic import make_multitask

    return make_multitask(m=20, d=3, n=500, a=2.0, tasks_per_user=5, seed=3)


@pytest.mark.parametrize("algorithm", ["pam", "pam-single-model", "pam-own-data", "pam-nonprivate", "pam-exp"])
@pytest.mark.parametrize("schedule", ["full", "disjoint"])
def test_personalization_draws_noise_only_through_the_ledger(personal_data, guarded_rng, algorithm, schedule):
    from fedpriv.algorithms import pam
    from fedpriv.engine.blocks import train_blocks

    def train_pam(*args, **kw):
        return train_blocks(pam.FAMILY, *args, **kw)

    private = algorithm in pam.PRIVATE
    state, ledger, _ = train_pam(algorithm, personal_data, pam.PAMConfig(epochs=2, schedule=schedule, net_size=50), epsilon=2.0 if private else None, delta=1e-6)
    assert guarded_rng == []
    if algorithm == "pam-exp":
        assert [(r.name, r.mechanism, r.count, r.pure_epsilon) for r in ledger.releases] == [("exp_U", "exponential", 1, 2.0)]
        return
    assert {r.name: r.accounted_count for r in ledger.releases} == {p.name: p.count for p in (pam.plan_pam_releases(algorithm, pam.PAMConfig(epochs=2, schedule=schedule)) if private else [])}
    if private:
        assert epsilon_rdp(ledger, 1e-6) == pytest.approx(2.0, rel=1e-3)


@pytest.mark.parametrize("method", ["ssp", "noisy_gd"])
def test_multitask_draws_noise_only_through_the_ledger(multitask_data, guarded_rng, method):
    from fedpriv.studies.multitask import MultiTaskConfig, plan_multitask, run_multitask

    cfg = MultiTaskConfig(steps=4)
    res = run_multitask(multitask_data, method, 0.5, 1.5, 1e-5, cfg)
    assert guarded_rng == []
    assert {r.name: r.count for r in res.ledger.releases} == {p.name: p.count for p in plan_multitask(method, cfg)}
    assert res.epsilon == pytest.approx(1.5, rel=1e-3) == epsilon_rdp(res.ledger, 1e-5)


def test_exponential_mechanism_samples_the_softmax_and_is_recorded():
    from fedpriv.privacy.accounting import epsilon_pure, release_event, zcdp_rho

    scores = np.array([0.0, 1.0, 3.0])
    for monotone, c in ((True, 1.0), (False, 2.0)):
        led = PrivacyLedger(seed=4)
        picks = np.bincount([led.exponential("sel", scores, epsilon=1.5, sensitivity=2.0, monotone=monotone) for _ in range(20000)], minlength=3)
        p = np.exp(-1.5 * scores / (c * 2.0))
        p /= p.sum()
        assert np.allclose(picks / 20000, p, atol=0.015)
        [rec] = led.releases
        assert rec.count == 20000 and rec.mechanism == "exponential" and rec.pure_epsilon == 1.5 and rec.noise_std == c * 2.0 / 1.5
        assert zcdp_rho(led) == pytest.approx(20000 * 1.5**2 / 8)
        assert release_event(rec).event.rho == pytest.approx(1.5**2 / 8)
    # pure epsilon by dp-accounting's PLD of generic (epsilon, 0)-DP mechanisms: basic composition
    led = PrivacyLedger(seed=1)
    for eps in (0.5, 0.5, 0.25):
        led.exponential("sel" if eps == 0.5 else "other", scores, epsilon=eps, sensitivity=1.0)
    assert epsilon_pure(led) == pytest.approx(1.25, rel=1e-3)
    led.gaussian("g", np.zeros(2), sensitivity=1.0, noise_multiplier=5.0)
    assert epsilon_pure(led) is None  # a Gaussian release is not pure
    # secure sampler, the budget check, bad input
    led = PrivacyLedger(secure=True, budget=(1.0, 1e-6), accountant=BestOfAccountant())
    assert led.exponential("sel", scores, epsilon=0.5, sensitivity=1.0) in (0, 1, 2)
    with pytest.raises(PrivacyError, match="budget"):
        for _ in range(100):
            led.exponential("sel", scores, epsilon=0.5, sensitivity=1.0)
    for bad in (dict(scores=np.array([np.nan]), epsilon=1.0), dict(scores=np.array([]), epsilon=1.0), dict(scores=scores, epsilon=0.0)):
        with pytest.raises(PrivacyError):
            PrivacyLedger(seed=0).exponential("sel", bad["scores"], epsilon=bad["epsilon"], sensitivity=1.0)
    # round trip through ledger.json
    led = PrivacyLedger(seed=0)
    led.exponential("sel", scores, epsilon=0.7, sensitivity=1.0, monotone=True)
    assert PrivacyLedger.releases_from_list(led.to_list()) == led.releases


def test_laplace_release_is_recorded_and_disjoint_calls_are_accounted_once():
    from fedpriv.privacy.accounting import epsilon_bounds, epsilon_pld, epsilon_pure

    led = PrivacyLedger(seed=3)
    x = led.laplace("sum", np.zeros(200_000), sensitivity=2.0, epsilon=0.5)
    assert np.mean(np.abs(x)) == pytest.approx(4.0, rel=0.02)  # E|Laplace(b)| = b = 2 / 0.5
    [rec] = led.releases
    assert (rec.mechanism, rec.noise_std, rec.pure_epsilon, rec.dim) == ("laplace", 4.0, 0.5, 200_000)
    assert epsilon_pure(led) == pytest.approx(0.5, rel=1e-3)
    assert epsilon_pld(led, 1e-6) <= 0.5 + 1e-3  # dp-accounting's PLD knows the Laplace mechanism
    # 10 calls on disjoint users (e.g. the nodes of one counting-tree level): accounted once
    led = PrivacyLedger(seed=3)
    for _ in range(10):
        led.laplace("level0", np.zeros(1), sensitivity=1.0, epsilon=0.3, disjoint=True)
    led.laplace("level1", np.zeros(1), sensitivity=1.0, epsilon=0.2, disjoint=True)
    assert [(r.count, r.groups, r.accounted_count) for r in led.releases] == [(10, 10, 1), (1, 1, 1)]
    assert epsilon_bounds(led, 1e-6)[0] == pytest.approx(0.5, rel=1e-3)
    # the same calls without the disjoint declaration compose
    led = PrivacyLedger(seed=3)
    for _ in range(10):
        led.laplace("level0", np.zeros(1), sensitivity=1.0, epsilon=0.3)
    assert epsilon_pure(led) == pytest.approx(3.0, rel=1e-3)
    assert PrivacyLedger.releases_from_list(led.to_list()) == led.releases
    with pytest.raises(PrivacyError, match="non-finite"):
        led.laplace("x", np.array([np.inf]), sensitivity=1.0, epsilon=1.0)
    with pytest.raises(PrivacyError, match="budget"):
        PrivacyLedger(seed=0, budget=(1.0, 1e-6), accountant=BestOfAccountant()).laplace("x", np.zeros(1), sensitivity=1.0, epsilon=2.0)


@pytest.mark.parametrize("mechanism", ["rnm", "em", "gem", "mgem", "cgem", "rs", "krr"])
def test_recommendation_draws_only_through_the_ledger(small_mf, guarded_rng, mechanism):
    """Training and the private recommendation (histogram release, then one selection per user
    on every client): every draw is sanctioned by a ledger."""
    from fedpriv.algorithms.als import ALSConfig
    from fedpriv.algorithms.recommend import RecommendConfig
    from fedpriv.data.splits import random_split
    from fedpriv.engine.inprocess import recommend_inprocess, train_inprocess

    split = random_split(small_mf.interactions, seed=1234)
    res = train_inprocess("adadpals", split.train, ALSConfig(rank=3, steps=1), rating_range=(1.0, 5.0), epsilon=2.0, progress=False)
    cfg = RecommendConfig(mechanism=mechanism, epsilon=1.0, candidates=12, sensitivity="quantile")
    summary, led, picks = recommend_inprocess(res.state, split.train, split.test, cfg, users_per_shard=7)
    assert guarded_rng == []
    assert {r.name for r in led.releases} == {"recommendation", "rec_score_hist"}
    assert summary["users"] == split.train.n_users


# ---------------------------------------------------------------- the privacy core's interfaces
def test_records_are_frozen_values_with_their_event():
    import dataclasses

    import dp_accounting

    from fedpriv.privacy.accounting import release_event
    from fedpriv.privacy.records import Release, RepeatAndSelect

    rel = Release("x", "gaussian", 1.0, 2.0, count=3, sampling_rate=0.1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rel.count = 4  # type: ignore[misc]
    assert rel.merged(rel).count == 6 and rel.count == 3
    event = rel.to_event()
    assert isinstance(event, dp_accounting.SelfComposedDpEvent) and event == release_event(rel)
    ras = RepeatAndSelect("t", 3.0, 1.0, 2, [rel])
    assert isinstance(ras.releases, tuple) and isinstance(ras.to_event(), dp_accounting.dp_event.RepeatAndSelectDpEvent)


def test_a_budget_needs_an_accountant_object_which_decides():
    from fedpriv.privacy.accounting import BestOfAccountant, PureAccountant, RdpAccountant

    with pytest.raises(PrivacyError, match="accountant"):
        PrivacyLedger(budget=(1.0, 1e-5))

    class Counting:  # any object with epsilon(records, delta) can be the accountant
        def __init__(self):
            self.calls = 0

        def epsilon(self, records, delta):
            self.calls += 1
            return RdpAccountant().epsilon(records, delta)

    acc = Counting()
    led = PrivacyLedger(seed=0, budget=(1.0, 1e-5), accountant=acc)
    led.gaussian("x", np.zeros(2), sensitivity=1.0, noise_multiplier=10.0)
    assert acc.calls == 1
    pure = PrivacyLedger(seed=0, budget=(0.6, 1e-5), accountant=PureAccountant())
    pure.laplace("a", np.zeros(1), sensitivity=1.0, epsilon=0.5)
    with pytest.raises(PrivacyError, match="budget"):
        pure.laplace("b", np.zeros(1), sensitivity=1.0, epsilon=0.5)
    assert BestOfAccountant().epsilon(pure.releases, 1e-5) == pytest.approx(0.5, rel=1e-6)


def test_merge_goes_through_the_budget_check_all_or_nothing():
    from fedpriv.privacy.accounting import BestOfAccountant
    from fedpriv.privacy.records import Release

    led = PrivacyLedger(seed=0, budget=(1.0, 1e-6), accountant=BestOfAccountant())
    ok = [Release("rec", "selection", 1.0, 2.0, 10, None, 5, 10, 0.5, True)]
    led.merge(ok)
    assert led.releases[0].count == 10
    too_much = [Release("rec", "selection", 1.0, 1.0, 10, None, 5, 10, 0.5, True), Release("more", "selection", 1.0, 1.0, 10, None, 5, 10, 0.9, True)]
    before = led.to_list()
    with pytest.raises(PrivacyError, match="budget"):
        led.merge(too_much)
    assert led.to_list() == before  # nothing of a refused merge is recorded


def test_state_dict_restores_records_and_the_noise_stream():
    a = PrivacyLedger(seed=7)
    a.gaussian("x", np.zeros(3), sensitivity=1.0, noise_multiplier=1.0)
    state = a.state_dict()
    next_a = a.gaussian("y", np.zeros(3), sensitivity=1.0, noise_multiplier=1.0)
    b = PrivacyLedger(seed=123)
    b.load_state_dict(state)
    assert b.to_list() == state["records"]
    assert np.array_equal(b.gaussian("y", np.zeros(3), sensitivity=1.0, noise_multiplier=1.0), next_a)
    assert "seed" not in state and "7" not in str(state["records"])
    with pytest.raises(PrivacyError, match="OS"):
        PrivacyLedger().load_state_dict(state)  # a secret ledger cannot take a seeded stream
