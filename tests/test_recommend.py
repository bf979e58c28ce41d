"""Private recommendation from the clients after training (fedpriv.algorithms.recommend)."""

import json

import numpy as np
import pytest

from fedpriv.algorithms import recommend
from fedpriv.algorithms.als import ALSConfig
from fedpriv.algorithms.shards import shard_users
from fedpriv.data.splits import random_split
from fedpriv.privacy.randomness import RunSecrets
from fedpriv.data.synthetic import make_mf
from fedpriv.engine.inprocess import recommend_inprocess, train_inprocess
from fedpriv.errors import ConfigError
from fedpriv.privacy.accounting import BestOfAccountant, epsilon_bounds
from fedpriv.privacy.ledger import PrivacyLedger


@pytest.fixture(scope="module")
def trained():
    syn = make_mf(200, 80, 200 * 30)
    split = random_split(syn.interactions, seed=1234)
    res = train_inprocess("adadpals", split.train, ALSConfig(rank=3, steps=2), rating_range=(1.0, 5.0), epsilon=4.0, progress=False, secrets=RunSecrets(1))
    return split, res


def test_scores_stay_in_the_declared_ranges_whatever_the_users_data(trained):
    """The sensitivity claim: a user's clipped score for candidate a lies in [lo_a, hi_a] for
    any ratings (here adversarial: extreme ratings on the candidates), so replacing the user's
    data moves each score by at most hi_a - lo_a."""
    split, res = trained
    state = res.state
    for source in ("norm", "range"):
        cfg = recommend.RecommendConfig(sensitivity=source, candidates=20, user_clip=0.5)
        cand = recommend.candidate_items(state, 20)
        lo, hi = recommend.public_ranges(state, cand, cfg)
        assert np.all(hi - lo > 0) and np.all(lo >= 1.0) and np.all(hi <= 5.0)
        if source == "norm":  # the public bound holds for unclipped-to-range scores of clipped users
            for rating in (1.0, 5.0):
                from fedpriv.data.interactions import Interactions

                n = 30
                users = np.repeat(np.arange(n), len(cand))
                items = np.tile(cand, n).astype(np.int32)
                rng = np.random.default_rng(0)
                ratings = np.where(rng.random(len(users)) < 0.5, rating, 6.0 - rating).astype(np.float32)
                adv = Interactions(users, items, ratings, n, state.n_items)
                q = recommend.client_scores(shard_users(adv), state, cand, cfg.user_clip)
                assert np.all(q >= lo - 1e-9) and np.all(q <= hi + 1e-9)


def test_quantile_ranges_read_off_a_histogram():
    edges = np.linspace(0.0, 1.0, 11)
    h = np.zeros((2, 10))
    h[0, 2:8] = 10  # mass on bins 2..7
    h[1, 5] = 3
    lo, hi = recommend.quantile_ranges(h, edges, (0.05, 0.95))
    assert lo[0] == pytest.approx(0.2) and hi[0] == pytest.approx(0.8)
    assert lo[1] == pytest.approx(0.5) and hi[1] == pytest.approx(0.6)
    lo, hi = recommend.quantile_ranges(-np.ones((1, 10)), edges, (0.05, 0.95))  # noise made it all negative
    assert lo[0] == 0.0 and hi[0] == 1.0


@pytest.mark.parametrize("source", ["quantile", "norm"])
def test_recommendation_is_accounted_and_reports_only_candidates(trained, source):
    split, res = trained
    cfg = recommend.RecommendConfig(mechanism="mgem", epsilon=1.0, candidates=30, sensitivity=source)
    summary, ledger, picks = recommend_inprocess(res.state, split.train, split.test, cfg, users_per_shard=25)
    cand = recommend.candidate_items(res.state, 30)
    assert np.all(np.isin(picks, cand))
    names = {r.name: r for r in ledger.releases}
    sel = names["recommendation"]
    assert (sel.mechanism, sel.count, sel.groups, sel.accounted_count, sel.pure_epsilon) == ("selection", 200, 200, 1, 1.0)
    eps = epsilon_bounds(ledger, 1e-6)[0]
    if source == "quantile":
        assert names["rec_score_hist"].mechanism == "gaussian"
        assert 1.0 < eps < 1.0 + cfg.hist_epsilon + 0.2  # RDP composition of the two
    else:
        assert set(names) == {"recommendation"} and eps == pytest.approx(1.0, rel=1e-3)
    assert summary["users"] == 200 and 0 <= summary["mse_to_best"] and 0 <= summary["hit_rate"] <= 1
    assert sum(summary["spearman_hist"]["counts"]) == 200


def test_the_private_report_approaches_the_argmax_as_epsilon_grows(trained):
    split, res = trained
    out = {}
    for eps in (0.05, 50.0):
        cfg = recommend.RecommendConfig(mechanism="rnm", epsilon=eps, candidates=30, sensitivity="norm")
        out[eps] = recommend_inprocess(res.state, split.train, split.test, cfg, users_per_shard=50, secrets=RunSecrets(3))[0]  # reproducible: a utility bar
    assert out[50.0]["mse_to_best"] < 0.2 * out[0.05]["mse_to_best"]
    assert out[50.0]["hit_rate"] == pytest.approx(out[50.0]["argmax_hit_rate"], abs=0.05)


def test_malformed_or_overclaiming_reports_are_rejected(trained):
    split, res = trained
    cfg = recommend.RecommendConfig(mechanism="gem", epsilon=1.0, candidates=10, sensitivity="range")
    cand = recommend.candidate_items(res.state, 10)
    lo, hi = recommend.public_ranges(res.state, cand, cfg)
    shard = shard_users(split.train, np.arange(5))
    rep = recommend.client_recommend(shard, res.state, cand, lo, hi, cfg, shard_users(split.test, np.arange(5)))
    assert len(recommend.check_report(rep.picks, rep.records, rep.sums, 5, 10, cfg)) == 1
    bad_cases = [
        (rep.picks[:4], rep.records, rep.sums),  # a user missing
        (np.r_[rep.picks[:4], 10], rep.records, rep.sums),  # outside the candidates
        (rep.picks.astype(float), rep.records, rep.sums),  # not integers
        (rep.picks, [], rep.sums),  # no ledger record: an unaccounted report
        (rep.picks, [{**rep.records[0], "pure_epsilon": 5.0}], rep.sums),  # another epsilon than declared
        (rep.picks, [{**rep.records[0], "count": 2}], rep.sums),
        (rep.picks, rep.records, {**rep.sums, "hits": np.array([np.nan])}),  # non-finite sum
        (rep.picks, rep.records, {**rep.sums, "hits": np.array([6.0])}),  # over its bound
    ]
    for picks, records, sums in bad_cases:
        with pytest.raises(recommend.RejectedReport):
            recommend.check_report(picks, records, sums, 5, 10, cfg)


def test_ledger_select_refuses_the_non_private_reference_and_bad_budgets():
    from fedpriv.errors import PrivacyError

    led = PrivacyLedger(seed=0, budget=(1.0, 1e-6), accountant=BestOfAccountant())
    q = np.zeros((3, 4))
    with pytest.raises(PrivacyError, match="not a private"):
        led.select("x", "rnmh", q, np.ones(4), epsilon=1.0)
    with pytest.raises(PrivacyError, match="budget"):
        led.select("x", "rnm", q, np.ones(4), epsilon=2.0)
    assert led.releases == []
    out = led.select("x", "rnm", q, np.ones(4), epsilon=0.5)
    out2 = led.select("x", "rnm", q, np.ones(4), epsilon=0.5)  # new users under the same name
    assert out.shape == out2.shape == (3,)
    [rec] = led.releases
    assert (rec.count, rec.groups, rec.accounted_count) == (6, 6, 1)
    assert epsilon_bounds(led, 1e-6)[0] == pytest.approx(0.5, rel=1e-3)


def test_bad_recommendation_options_name_the_field():
    from fedpriv.run import RunOptions

    for over, field in (({"recommend": "rnmh"}, "rec_mechanism"), ({"recommend": "gem", "rec_epsilon": "0"}, "rec_epsilon"),
                        ({"recommend": "gem", "rec_sensitivity": "magic"}, "rec_sensitivity"), ({"recommend": "cgem", "rec_params": "lam"}, "rec_params")):
        with pytest.raises(ConfigError) as err:
            RunOptions.pop_from(dict(over))
        assert err.value.field == field


def test_run_writes_the_recommendation_and_composes_its_epsilon(tmp_path):
    from fedpriv.run import run, write_outputs

    metrics, records = run(
        "adadpals", "synthetic-mf:users=150,items=60,ratings=4000,seed=2", epsilon=3.0,
        overrides={"rank": "3", "steps": "2", "recommend": "mgem", "rec_epsilon": "1", "rec_candidates": "25", "users_per_shard": "30"}, progress=False,
    )
    write_outputs(tmp_path / "out", metrics, records)
    rec = metrics["recommendation"]
    assert rec["mechanism"] == "mgem" and rec["users"] > 0
    assert metrics["epsilon_training"] == pytest.approx(3.0, rel=1e-3)
    saved = json.loads((tmp_path / "out" / "ledger.json").read_text())
    assert {"recommendation", "rec_score_hist"} <= {r["name"] for r in saved}
    combined = epsilon_bounds(PrivacyLedger.releases_from_list(saved), 1e-5)[0]
    assert metrics["epsilon_spent"] == pytest.approx(combined) and combined > 3.0


@pytest.mark.flower  # Flower's engine: scripts/test.sh runs it on the newest Flower
def test_flower_and_inprocess_recommendations_agree(tmp_path):
    from fedpriv.flower.server_app import FlowerJob
    from fedpriv.flower.simulation import simulate

    syn = make_mf(60, 40, 60 * 20)
    split = random_split(syn.interactions, seed=1234)
    cfg = ALSConfig(rank=3, steps=1)
    rcfg = recommend.RecommendConfig(mechanism="cgem", epsilon=2.0, candidates=15, sensitivity="quantile")
    from fedpriv.privacy.randomness import RunSecrets

    job = FlowerJob("adadpals", 4.0, 1e-5, cfg, split.train, split.valid, split.test, (1.0, 5.0), tmp_path, users_per_node=6, recommend=rcfg, secrets=RunSecrets(11))
    res = simulate(job, num_nodes=10)
    ref = train_inprocess("adadpals", split.train, cfg, rating_range=(1.0, 5.0), epsilon=4.0, users_per_shard=6, progress=False, secrets=RunSecrets(11))
    summary, ledger, picks = recommend_inprocess(ref.state, split.train, split.test, rcfg, users_per_shard=6, secrets=RunSecrets(11))
    assert np.array_equal(res.rec_picks, picks)
    assert res.rec_ledger.to_list() == ledger.to_list()
    assert res.recommendation["mse_to_best"] == pytest.approx(summary["mse_to_best"], rel=1e-9)
    assert res.recommendation["hit_rate"] == pytest.approx(summary["hit_rate"], rel=1e-9)
    assert res.rejected == []
