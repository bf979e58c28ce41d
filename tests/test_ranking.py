"""Recommendations a user would take (issue 33): ranking metrics against a direct computation,
the private popularity baseline, the popularity-aware ranking, the model API, the guards and the
summary."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import fedpriv
from fedpriv.algorithms import ranking
from fedpriv.cli import main
from fedpriv.errors import ConfigError
from fedpriv.run import InProcess, Job

SPEC = "synthetic-mf:users=300,items=60,ratings=6000,seed=3"


@pytest.fixture(scope="module")
def run():
    plan = Job("adadpals", SPEC, epsilon=5.0, noise_seed=2, params={"rank": 3, "steps": 2}).prepare()
    return plan, plan.execute(InProcess())


def _direct(state, train, test, k, threshold, blend):
    """Recall@k and NDCG@k computed user by user, the plain way."""
    from fedpriv.algorithms.shards import shard_users

    recalls, ndcgs, recommended = [], [], []
    for u in np.unique(test.users):
        rel = set(test.items[(test.users == u) & (test.ratings >= threshold)].tolist())
        if not rel:
            continue
        seen = set(train.items[train.users == u].tolist())
        scores = ranking.ranking_scores(shard_users(train, np.array([u])), state, np.arange(state.n_items), blend)[0]
        order = [i for i in np.argsort(-scores, kind="stable") if i not in seen][:k]
        hits = [1.0 if i in rel else 0.0 for i in order]
        recalls.append(sum(hits) / min(k, len(rel)))
        ndcgs.append(sum(h / math.log2(j + 2) for j, h in enumerate(hits)) / sum(1 / math.log2(j + 2) for j in range(min(k, len(rel)))))
        recommended += order
    return float(np.mean(recalls)), float(np.mean(ndcgs)), len(recalls), recommended


def test_ranking_metrics_match_a_direct_computation(run):
    plan, out = run
    train, test = plan.split.train, plan.split.test
    threshold = ranking.relevance_threshold(out.state.rating_range)
    assert threshold == pytest.approx(4.2)  # the top 20% of the 1-5 scale
    got = ranking.evaluate_ranking(out.state, train, test, k=5, threshold=threshold, blend=0.3)
    recall, ndcg, users, recommended = _direct(out.state, train, test, 5, threshold, 0.3)
    assert got["users"] == users > 0
    assert got["recall"] == pytest.approx(recall, rel=1e-9) and got["ndcg"] == pytest.approx(ndcg, rel=1e-9)
    assert got["coverage"] == pytest.approx(len(set(recommended)) / out.state.n_items)
    assert got["median_train_count"] == pytest.approx(float(np.median(train.item_counts()[recommended])))
    # the run's metrics.json carries them beside the non-private references
    m = out.report
    assert m["ranking"]["k"] == 10 and m["ranking"]["users"] > 0 and 0 <= m["ranking"]["recall"] <= 1
    pop = ranking.popular_reference(train, test, k=10, threshold=threshold)
    assert m["references"]["popular_recall"] == pytest.approx(pop["recall"])
    assert m["references"]["global_mean_test_rmse"] == pytest.approx(float(np.sqrt(np.mean((test.ratings - train.ratings.mean()) ** 2))), rel=1e-6)


def test_the_private_popularity_baseline_releases_the_counts_once():
    plan = Job("popular", SPEC, epsilon=2.0, noise_seed=4).prepare()
    out = plan.execute(InProcess())
    assert [r["name"] for r in out.ledger] == ["mean", "counts"]
    assert out.report.epsilon_spent <= 2.0 * (1 + 1e-6)
    z = out.state.multipliers
    assert z["mean"] / z["counts"] == pytest.approx(math.sqrt(0.9 / 0.08), rel=1e-6)  # the counts take the budget
    model = out.model
    recs = model.recommend([0, 1], [4, 2], k=5)
    order = [i for i in np.argsort(-out.state.counts_hat, kind="stable") if model.item_ids[i] not in (0, 1)][:5]
    assert [r["item"] for r in recs] == [int(model.item_ids[i]) for i in order]  # the same list for everyone


def test_recommendations_are_popularity_aware_and_beat_rating_order(run):
    """Ranking by predicted rating alone puts rarely rated items on top; the popularity-aware
    score does not (the median training count of the top 10 is far higher)."""
    plan, out = run
    train = plan.split.train
    counts = train.item_counts()
    model = out.model
    recs = model.recommend([0, 1, 2], [5, 3, 1], k=10)
    by_rating = np.argsort(-model.predict([0, 1, 2], [5, 3, 1]), kind="stable")
    by_rating = [i for i in by_rating if i not in (0, 1, 2)][:10]
    assert np.median([counts[r["item"]] for r in recs]) > np.median(counts[by_rating])
    lo, hi = model.state.rating_range
    assert all(lo <= r["rating"] <= hi for r in recs)


def test_model_api(run, tmp_path, capsys):
    plan, out = run
    model = out.model
    pred = model.predict([0, 1], [5, 1], targets=[2, 3, 4])
    assert pred.shape == (3,) and np.all((pred >= 1) & (pred <= 5))
    sims = model.similar_items(5, k=4)
    assert len(sims) == 4 and 5 not in [s["item"] for s in sims]
    assert [s["similarity"] for s in sims] == sorted((s["similarity"] for s in sims), reverse=True)
    frame = model.recommend([0, 1], [5, 1], k=3, as_frame=True)
    assert list(frame.columns) == ["rank", "item", "score", "rating", "name"] and list(frame["rank"]) == [1, 2, 3]
    assert repr(model).startswith("Model(adadpals, 60 items, rank 3, epsilon")
    assert repr(plan.dataset).startswith("Dataset(synthetic-mf: 300 users, 60 items, 6,000 ratings")
    res = fedpriv.train("adadpals", SPEC, epsilon=5, rank=2, steps=1, noise_seed=1)
    assert repr(res).startswith("Result(adadpals, epsilon") and "Recall@10" in repr(res)
    bias = fedpriv.train("bias", SPEC, epsilon=5, noise_seed=1).model
    with pytest.raises(ConfigError, match="no item embeddings"):
        bias.similar_items(5)
    # the command line's table has a header
    path = res.save_model(tmp_path / "m")
    (tmp_path / "mine.csv").write_text("item,rating\n0,5\n1,2\n")
    assert main(["recommend", "--model", str(path), "--ratings", str(tmp_path / "mine.csv"), "--k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["rank", "item", "score", "rating", "name"] and len(lines) == 4


def test_guards_refuse_to_overwrite_and_flag_a_large_delta(tmp_path, capsys):
    out, model = tmp_path / "out", tmp_path / "model"
    args = ["run", "bias", "--data", SPEC, "--epsilon", "2", "--out", str(out), "--save-model", str(model), "--quiet"]
    assert main(args) == 0
    first = (out / "metrics.json").read_text()
    capsys.readouterr()
    assert main(args) == 2  # an earlier run's results: refused before training, nothing touched
    assert "--out" in capsys.readouterr().err and (out / "metrics.json").read_text() == first
    assert main([*args[:-5], "--out", str(tmp_path / "o2"), "--save-model", str(model), "--quiet"]) == 2
    assert "earlier model" in capsys.readouterr().err and not (tmp_path / "o2").exists()
    assert main([*args, "--overwrite", "--delta", "0.05"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert "1/n" in metrics["delta_warning"] and metrics["delta"] == 0.05
    assert "warning" in fedpriv.RunReport.from_metrics(metrics).summary()
    assert "delta_warning" not in json.loads(first)


@pytest.mark.parametrize(("call", "field", "suggestion"), [
    (lambda: Job("adadpal", SPEC, epsilon=1).prepare(), "algorithm", "'adadpals'"),
    (lambda: Job("adadpals", SPEC, epsilon=1, params={"rnak": 3}).prepare(), "rnak", "'rank'"),
    (lambda: fedpriv.train("adadpals", SPEC, epsilon=1, engine="inproces"), "engine", "'inprocess'"),
])
def test_unknown_names_get_the_closest_known_name(call, field, suggestion):
    with pytest.raises(ConfigError) as info:
        call()
    assert info.value.field == field and f"did you mean {suggestion}?" in str(info.value)


def test_the_summary_explains_the_run(run):
    _, out = run
    text = out.report.summary(out="x/metrics.json")
    assert "Recall@10" in text and "most-popular list" in text and "global-mean predictor" in text and "x/metrics.json" in text
    default = Job("adadpals", SPEC, epsilon=1.0, noise_seed=1).prepare().execute(InProcess())
    assert "the noise-aware rule chose the bias model: snr" in default.report.summary()
    assert default.report["noise_aware"]["factor_snr"] == 350.0


def test_synthetic_ratings_can_depend_on_preferences():
    from fedpriv.data.synthetic import make_mf

    plain, chosen = make_mf(1500, 200, 30000, seed=2), make_mf(1500, 200, 30000, seed=2, select=2.0)
    again = make_mf(1500, 200, 30000, seed=2, select=0.0)
    assert np.array_equal(plain.interactions.items, again.interactions.items)  # the default generator is unchanged
    for syn in (plain, chosen):
        assert len(syn.interactions.ratings) == 30000 and np.bincount(syn.interactions.users, minlength=1500).min() >= 5

    def affinity(syn):
        i = syn.interactions
        return float(np.mean(np.einsum("ij,ij->i", syn.user_factors[i.users], syn.item_factors[i.items]) + syn.item_bias[i.items]))

    assert affinity(chosen) > affinity(plain) + 0.1  # users rate what they like
    with pytest.raises(ConfigError, match="select"):
        make_mf(10, 5, 20, select=-1)


def test_the_blend_follows_the_noise_aware_statistic():
    """0.3 in the middle of the snr range, 0.2 at the edges (validation, README); public numbers only."""
    from fedpriv.algorithms.defaults import snr

    assert ranking.blend_for(None, None, 100, 0) == ranking.BLEND  # a non-private model
    low = ranking.blend_for(1.0, 1e-5, 9742, 610)
    mid = ranking.blend_for(5.0, 1e-5, 1682, 943)
    high = ranking.blend_for(5.0, 1e-5, 10000, 56000)
    assert snr(1.0, 1e-5, 9742, 610) < 2 <= snr(5.0, 1e-5, 1682, 943) < 350 <= snr(5.0, 1e-5, 10000, 56000)
    assert (low, mid, high) == (0.2, 0.3, 0.2)


def test_the_private_bias_model_ranks_by_its_released_popularity():
    """The bias model releases no counts, but its step's statistics carry the items' noised
    weight sums (the bias coordinate of A): its top 10 reads them, so it does not lose to the
    most-popular list (ranked by predicted rating alone it fell to about half its recall)."""
    recalls, popular = [], None
    for seed in (1, 2, 3):
        result = fedpriv.train("bias", "synthetic-mf:users=400,items=200,ratings=20000,seed=1", epsilon=5, noise_seed=seed)
        state = result.model.state
        assert state.item_support is not None and state.counts_hat is None
        recalls.append(result.report.get("ranking")["recall"])
        popular = result.report.get("references")["popular_recall"]
    assert "released popularity" in result.report.get("ranking")["score"]
    assert min(recalls) >= popular, (recalls, popular)


@pytest.mark.parametrize("with_torch", [False, True], ids=["numpy", "torch"])
def test_top_k_lists_are_the_stable_sort_ties_to_the_lower_item(monkeypatch, with_torch):
    """The evaluation's top-k lists (fedpriv.algorithms.metrics.top_k) on both back ends equal
    the first k of a stable descending sort (the rule of Model.recommend), with many ties (small
    integer scores, excluded items at -inf) and k above the number of items."""
    import sys

    from fedpriv.algorithms.metrics import top_k

    if with_torch:
        import torch  # noqa: F401 - top_k uses torch where it is loaded
    else:
        monkeypatch.delitem(sys.modules, "torch", raising=False)
    rng = np.random.default_rng(0)
    for _ in range(300):
        rows, n, k = int(rng.integers(1, 20)), int(rng.integers(1, 60)), int(rng.integers(1, 15))
        S = rng.integers(0, 5, (rows, n)).astype(float)
        S[rng.random(S.shape) < 0.2] = -np.inf
        assert np.array_equal(top_k(S, k), np.argsort(-S, axis=1, kind="stable")[:, : min(k, n)])
    S = rng.normal(size=(4, 1000))
    assert np.array_equal(top_k(S, 10), np.argsort(-S, axis=1)[:, :10])


def test_a_shared_scores_lists_are_top_ks_with_the_users_training_items_excluded():
    """The most-popular reference makes its lists from one score per item
    (ranking.shared_score_lists), without a users x items matrix: they equal top_k's lists of
    the broadcast scores with each user's training items at -inf, with many tied scores,
    repeated ratings of an item, users without ratings and users who rated all but fewer
    than k items (their lists end with rated items, by index, as top_k's tied -inf scores
    do)."""
    from fedpriv.algorithms.metrics import top_k
    from fedpriv.algorithms.shards import UserShard

    rng = np.random.default_rng(1)
    for trial in range(200):
        n_items, n_users, k = int(rng.integers(1, 40)), int(rng.integers(1, 12)), int(rng.integers(1, 12))
        score = rng.integers(0, 4, n_items).astype(float) if trial % 2 else rng.normal(size=n_items)
        per_user = rng.integers(0, n_items + 3, n_users)
        per_user[0] = max(0, n_items - 1)  # rated nearly everything
        items = np.concatenate([rng.choice(n_items, int(c), replace=c > n_items) for c in per_user]) if per_user.sum() else np.zeros(0, np.int64)
        indptr = np.concatenate([[0], np.cumsum(per_user)])
        shard = UserShard(np.arange(n_users), indptr, items.astype(np.int64), np.ones(len(items)))
        S = np.broadcast_to(score, (n_users, n_items)).copy()
        S[shard.local_user_of_rating, shard.items] = -np.inf
        assert np.array_equal(ranking.shared_score_lists(score, shard, k), top_k(S, k)), trial


def test_the_most_popular_reference_matches_a_direct_computation(run):
    """popular_reference's metrics (its fast lists, its hits found by key) equal a user-by-user
    computation of the most-popular list with each user's training items left out."""
    plan, _ = run
    train, test = plan.split.train, plan.split.test
    counts = train.item_counts().astype(np.float64)
    got = ranking.popular_reference(train, test, k=5, threshold=4.2)
    recalls, ndcgs = [], []
    for u in np.unique(test.users):
        rel = set(test.items[(test.users == u) & (test.ratings >= 4.2)].tolist())
        if not rel:
            continue
        seen = set(train.items[train.users == u].tolist())
        order = [i for i in np.argsort(-counts, kind="stable") if i not in seen][:5]
        hits = [1.0 if i in rel else 0.0 for i in order]
        recalls.append(sum(hits) / min(5, len(rel)))
        ndcgs.append(sum(h / math.log2(j + 2) for j, h in enumerate(hits)) / sum(1 / math.log2(j + 2) for j in range(min(5, len(rel)))))
    assert got["users"] == len(recalls) > 0
    assert got["recall"] == pytest.approx(float(np.mean(recalls)), rel=1e-12)
    assert got["ndcg"] == pytest.approx(float(np.mean(ndcgs)), rel=1e-12)
