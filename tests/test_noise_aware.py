"""Noise-aware defaults (fedpriv.algorithms.defaults) and the bias stage of the ALS family:
the rule reads the released user count, the rest of the plan is calibrated around that release,
and no default run is worse than the private bias model at the same epsilon."""

import numpy as np
import pytest

from fedpriv.algorithms import defaults
from fedpriv.algorithms.als import ALSConfig, plan_releases
from fedpriv.algorithms.plans import budget_plan
from fedpriv.data.synthetic import make_mf
from fedpriv.data.splits import random_split
from fedpriv.engine.inprocess import train_inprocess
from fedpriv.errors import ConfigError
from fedpriv.algorithms.evaluation import evaluate_rmse
from fedpriv.privacy.accounting import PlannedRelease, calibrate, epsilon_rdp
from fedpriv.privacy.randomness import RunSecrets

RANGE = (1.0, 5.0)


def test_a_pinned_release_keeps_its_multiplier_and_the_rest_spend_what_is_left():
    plan = [PlannedRelease("users", 1, 0.01), PlannedRelease("mean", 1, 0.02), PlannedRelease("bias", 1, 0.97)]
    first = calibrate(plan, 2.0, 1e-5)
    other = [PlannedRelease("users", 1, 0.01), PlannedRelease("mean", 1, 0.02), PlannedRelease("item_stats_b", 2, 0.3), PlannedRelease("item_stats_A", 2, 0.3)]
    cal = calibrate(other, 2.0, 1e-5, pinned={"users": 30.0})
    assert cal.multipliers["users"] == 30.0
    assert cal.epsilon == pytest.approx(2.0, rel=1e-3) and cal.epsilon <= 2.0
    assert first.multipliers["users"] != 30.0
    with pytest.raises(ConfigError, match="not in the plan"):
        calibrate(plan, 2.0, 1e-5, pinned={"counts": 3.0})


def test_the_rule_fits_factors_only_when_the_signal_per_item_is_large():
    # ML-100K-sized data: the bias model alone at every epsilon up to 20
    for eps in (0.5, 1, 2, 5, 10, 20):
        assert defaults.choose("adadpals", eps, 1e-5, 1682, 943)["rank"] == 0
    # the 10M-rating set: factors from epsilon 5, a larger rank from 10
    assert defaults.choose("adadpals", 1, 1e-5, 10000, 70000)["rank"] == 0
    assert defaults.choose("adadpals", 5, 1e-5, 10000, 70000)["rank"] == 4
    assert defaults.choose("adadpals", 20, 1e-5, 10000, 70000)["rank"] == 8
    assert defaults.choose("dpals-tail", 5, 1e-5, 10000, 70000)["k"] == 100  # DPALS keeps 100 items per user with factors
    assert "k" not in defaults.choose("dpals-tail", 1, 1e-5, 10000, 70000)  # the bias model alone samples nothing
    assert defaults.snr(5, 1e-5, 100, 1000) > defaults.snr(1, 1e-5, 100, 1000) > defaults.snr(1, 1e-5, 400, 1000)


def test_the_bias_model_lightens_its_ridge_and_widens_its_clip_as_the_signal_grows():
    """The stage of the ALS family and the bias algorithm share one rule: on ML-100K a ridge of
    3 noise stds and clip 0.5 at epsilon 1 (snr 3.3), clip 1 at 2 (snr 6.5), ridge 1 at 5 (snr 15),
    clip 2 at 20 (snr 51)."""
    def picks(alg, eps, n_items=1682, n_users=943):
        c = defaults.choose(alg, eps, 1e-5, n_items, n_users)
        return (c["reg_noise_units"] if alg == "bias" else c["bias_ridge_units"]), c["rating_clip"]

    for alg in ("bias", "adadpals", "dpals-uniform"):
        assert picks(alg, 1) == (3.0, 0.5) and picks(alg, 2) == (3.0, 1.0) and picks(alg, 5) == (1.0, 1.0) and picks(alg, 20) == (1.0, 2.0)
    assert "rank" not in defaults.choose("bias", 20, 1e-5, 1682, 943)  # the bias model's rank is fixed at 0
    # a run of the bias algorithm releases the count, lets the rule choose, and spends exactly epsilon
    split = random_split(make_mf(1500, 400, 45000, rank=3, seed=7).interactions, seed=1234)
    res = train_inprocess("bias", split.train, ALSConfig.from_overrides({}, "bias"), rating_range=RANGE, epsilon=10.0, progress=False, secrets=RunSecrets(1))
    assert [r.name for r in res.ledger.releases][:2] == ["users", "mean"]
    assert (res.state.config.reg_noise_units, res.state.config.rating_clip) == (1.0, 2.0)  # snr 93
    assert epsilon_rdp(res.ledger.releases, 1e-5) == pytest.approx(10.0, rel=1e-3)
    fixed = ALSConfig.from_overrides({"defaults": "fixed"}, "bias")
    res = train_inprocess("bias", split.train, fixed, rating_range=RANGE, epsilon=10.0, progress=False, secrets=RunSecrets(1))
    assert "users" not in [r.name for r in res.ledger.releases] and res.state.config.reg_noise_units == 3.0


def test_a_default_run_releases_the_count_then_spends_exactly_its_budget_on_the_rules_plan(small_mf):
    inter = small_mf.interactions
    cfg = ALSConfig.from_overrides({}, "adadpals")
    assert (cfg.defaults, cfg.bias_stage, cfg.given) == ("noise-aware", True, frozenset())
    res = train_inprocess("adadpals", inter, cfg, rating_range=RANGE, epsilon=2.0, progress=False, secrets=RunSecrets(1))
    chosen = res.state.config
    assert (chosen.rank, chosen.steps) == (0, 0)  # 300 users: the bias model alone
    assert [r.name for r in res.ledger.releases] == ["users", "mean", "bias"]
    assert epsilon_rdp(res.ledger.releases, 1e-5) == pytest.approx(2.0, rel=1e-3)
    assert {p.name for p in plan_releases("adadpals", chosen, False)} == set(res.state.multipliers)
    # keys set explicitly are the rule's to leave alone
    given = ALSConfig.from_overrides({"rank": "2", "steps": "1", "factor_floor": "1"}, "adadpals")
    assert given.given == {"factor_floor", "rank", "steps"} and given.to_dict()["given"] == "factor_floor,rank,steps"
    res = train_inprocess("adadpals", inter, given, rating_range=RANGE, epsilon=2.0, progress=False, secrets=RunSecrets(1))
    assert (res.state.config.rank, res.state.config.steps) == (2, 1)
    assert [r.name for r in res.ledger.releases] == ["users", "mean", "counts", "bias", "item_stats_A", "item_stats_b"]
    assert epsilon_rdp(res.ledger.releases, 1e-5) == pytest.approx(2.0, rel=1e-3)
    # the factor floor: items the stage saw too little of keep no factors
    floor = res.state.multipliers["bias"] * np.sqrt(2.0)
    low = res.state.item_support < floor
    assert low.any() and np.all(res.state.item_factors[low] == 0)
    # the old behaviour on request
    fixed = ALSConfig.from_overrides({"defaults": "fixed", "bias_stage": "false"}, "adadpals")
    assert (fixed.rank, fixed.steps) == (8, 3)


def test_the_bias_stage_is_refused_where_there_are_no_item_statistics():
    with pytest.raises(ConfigError, match="bias_stage"):
        plan_releases("dpsgd", ALSConfig.from_overrides({"bias_stage": "true"}, "dpsgd"), False)
    with pytest.raises(ConfigError, match="steps"):
        ALSConfig.from_overrides({"steps": "0", "bias_stage": "false", "defaults": "fixed"}, "adadpals")


@pytest.mark.parametrize("name,users,items,ratings", [("synthetic-1.5k", 1500, 400, 45000), ("synthetic-400", 400, 200, 20000)])
def test_no_default_run_is_worse_than_the_private_bias_model(name, users, items, ratings):
    """Defaults of the ALS family's private members against the private bias model, at every
    epsilon of the issue: test RMSE over 8 noise seeds. Each run draws its own noise, so a
    default is worse when its mean exceeds the bias model's by more than 0.005 and by more than
    three standard errors of the difference (below the threshold of the rule the two compute the
    same estimator, from different releases)."""
    inter = make_mf(users, items, ratings, rank=3, seed=7).interactions
    split = random_split(inter, seed=1234)
    counts = split.train.item_counts()

    def scores(algorithm, eps):
        out = []
        for seed in range(1, 9):
            res = train_inprocess(algorithm, split.train, ALSConfig.from_overrides({}, algorithm), rating_range=RANGE, epsilon=eps, progress=False, secrets=RunSecrets(seed))
            out.append(evaluate_rmse(res.state, split.train, split.test, counts)[0])
        return np.array(out)

    worse = {}
    for eps in (0.5, 1, 2, 5, 10, 20):
        ref = scores("bias", eps)
        for algorithm in ("adadpals", "dpals-uniform", "dpals-tail"):
            got = scores(algorithm, eps)
            diff = got.mean() - ref.mean()
            se = np.sqrt(got.var(ddof=1) / len(got) + ref.var(ddof=1) / len(ref))
            if diff > max(0.005, 3 * se):
                worse[(algorithm, eps)] = (round(got.mean(), 4), round(ref.mean(), 4), round(se, 4))
    assert not worse, f"{name}: default worse than the private bias model (default, bias, SE): {worse}"


def test_the_one_shot_releases_of_the_dp_sgd_baselines_spend_at_most_a_fifth():
    for algorithm, eps in (("dpsgd", 5.0), ("am-dpsgd", 1.0)):
        summary = budget_plan(algorithm, ALSConfig.from_overrides({}, algorithm), eps, 1e-5).summary()
        assert summary["epsilon_one_shot"] <= 0.2 * eps, (algorithm, summary["epsilon_one_shot"])
        assert summary["epsilon_rdp"] == pytest.approx(eps, rel=1e-3)


def test_a_secure_default_run_releases_the_bias_stage_as_a_secure_sum(small_mf):
    inter = small_mf.interactions
    cfg = ALSConfig.from_overrides({"aggregation": "secure"}, "adadpals")
    res = train_inprocess("adadpals", inter, cfg, rating_range=RANGE, epsilon=2.0, progress=False, users_per_shard=100, secrets=RunSecrets(1))
    assert [r.name for r in res.ledger.releases] == ["users", "mean", "bias"]
    assert all(r.mechanism == "skellam" for r in res.ledger.releases)
    assert epsilon_rdp(res.ledger.releases, 1e-5) <= 2.0 + 1e-6
    assert np.isfinite(res.state.item_bias).all()


def test_on_implicit_data_no_default_ranks_worse_than_the_private_bias_model():
    """Held-out users of implicit data (all observed entries 1, gravity 0.1 as `fedpriv run`
    sets it): the bias stage must keep the items' weighted popularity (a user's own bias would
    absorb the ones) and pull every item towards 0 by gravity * n. Before that fix the default
    AdaDPALS ranked noise: Recall@20 0.001 against the bias model's 0.12 on Last.fm at eps 5."""
    from fedpriv.data.splits import heldout_users_split
    from fedpriv.algorithms.evaluation import evaluate_recall

    inter = make_mf(2000, 300, 60000, rank=3, seed=11).interactions
    split = heldout_users_split(inter, valid_fraction=0.1, test_fraction=0.1, positive_threshold=3.5, seed=5)
    counts = split.train.item_counts()

    def recall(algorithm, eps, seed):
        cfg = ALSConfig.from_overrides({"gravity": "0.1"}, algorithm)
        res = train_inprocess(algorithm, split.train, cfg, rating_range=(0.0, 1.0), implicit=True, epsilon=eps, progress=False, secrets=RunSecrets(seed))
        if algorithm != "bias":
            assert "users" in [r.name for r in res.ledger.releases] and res.state.n_users > 0
        return evaluate_recall(res.state, split.test_history, split.test_targets, split.test_users, counts, 20)[0]

    for eps in (1.0, 5.0):
        ref = np.mean([recall("bias", eps, s) for s in (1, 2, 3)])
        pop = recall("adadpals", 1e6, 1)  # next to no noise: the stage ranks by popularity
        assert ref > 0.5 * pop > 0
        for algorithm in ("adadpals", "dpals-uniform"):
            got = np.mean([recall(algorithm, eps, s) for s in (1, 2, 3)])
            assert got >= ref - 0.02, (algorithm, eps, got, ref)


def test_am_ssp_with_the_bias_stage_fits_the_residual_on_both_engines(tmp_path):
    """`--set bias_stage=true` for AM-SSP: the item biases come from the stage's release and stay
    fixed, the encoder outputs the rank coordinates only, and the two engines release the same
    model (same ledger, same test RMSE)."""
    from fedpriv.algorithms import ssp
    from fedpriv.testing.local_grid import LocalGrid
    from fedpriv.flower.server_app import run_job
    from fedpriv.run import run

    cfg = ALSConfig.from_overrides({"bias_stage": "true", "rank": "2"}, "am-ssp")
    assert ssp.out_dim(cfg) == 2 and ssp.out_dim(ALSConfig.from_overrides({"rank": "2"}, "am-ssp")) == 3
    data = "synthetic-mf:users=80,items=40,ratings=2400,seed=5"
    over = {"bias_stage": "true", "rank": "2", "steps": "2", "ssp_steps": "20"}
    kw = dict(epsilon=5.0, progress=False, noise_seed=2, second_opinion=False)
    m_in, led_in = run("am-ssp", data, overrides={**over, "users_per_shard": "20"}, **kw)
    m_fl, led_fl = run("am-ssp", data, overrides={**over, "users_per_node": "20"}, engine="flower", flower_runner=lambda job, n: run_job(LocalGrid(n), job), work_dir=tmp_path, **kw)
    assert led_in == led_fl
    names = [r["name"] for r in led_in]
    assert names.count("bias") == 1 and names.index("mean") < names.index("bias") < names.index("item_stats_A")
    assert m_fl["test_rmse"] == pytest.approx(m_in["test_rmse"], rel=1e-6)
    with pytest.raises(ConfigError, match="bias_stage"):
        plan_releases("am-dpsgd", ALSConfig.from_overrides({"bias_stage": "true"}, "am-dpsgd"), False)


def test_the_factor_floor_gives_the_same_model_on_both_engines(tmp_path):
    """The stage's released weight sums (item_support) stay on the server, which alone solves
    the items: a run with factors and a factor floor releases the same model on both engines."""
    from fedpriv.testing.local_grid import LocalGrid
    from fedpriv.flower.server_app import run_job
    from fedpriv.run import run

    data = "synthetic-mf:users=80,items=40,ratings=2400,seed=5"
    over = {"rank": "2", "steps": "2", "factor_floor": "10"}
    kw = dict(epsilon=20.0, progress=False, noise_seed=2, second_opinion=False)
    m_in, led_in = run("adadpals", data, overrides={**over, "users_per_shard": "20"}, **kw)
    m_off, _ = run("adadpals", data, overrides={**over, "factor_floor": "0", "users_per_shard": "20"}, **kw)
    assert m_off["test_rmse"] != m_in["test_rmse"]  # the floor removes some items' factors here
    m_fl, led_fl = run("adadpals", data, overrides={**over, "users_per_node": "20"}, engine="flower", flower_runner=lambda job, n: run_job(LocalGrid(n), job), work_dir=tmp_path, **kw)
    assert led_in == led_fl and "bias" in [r["name"] for r in led_in]
    assert m_fl["test_rmse"] == pytest.approx(m_in["test_rmse"], rel=1e-6)


def test_the_rule_returns_a_new_config_and_leaves_the_given_keys():
    from fedpriv.algorithms.defaults import noise_aware_config

    cfg = ALSConfig.from_overrides({"rank": "4"}, "adadpals")
    assert cfg.given == {"rank"}
    new = noise_aware_config(cfg, "adadpals", 1.0, 1e-5, 1000, 500)
    assert new is not cfg and new.rank == 4 and new.given == {"rank"}  # the user's key stays
    assert cfg == ALSConfig.from_overrides({"rank": "4"}, "adadpals")  # the input is untouched
    assert ALSConfig.from_dict(new.to_dict()) == new  # the JSON form round-trips, given included


def test_the_explanation_never_claims_a_threshold_the_snr_did_not_reach():
    """Factors set by hand below the threshold are explained as given, not as snr >= 350."""
    from fedpriv.algorithms import defaults
    from fedpriv.algorithms.config import ALSConfig

    for algorithm in ("am-dpsgd", "adadpals"):
        cfg = ALSConfig.from_overrides({"rank": "4", "steps": "2"}, algorithm)
        model = defaults.explain(algorithm, cfg, 1.0, 1e-5, 1682, 943)["model"]
        assert "rank or steps given" in model and ">= 350" not in model, model
