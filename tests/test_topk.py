"""The top-k family (fedpriv.algorithms.topk): private ``topk`` (EASE), private ``topk-lowrank``
(the low-rank sketch), and non-private ``ease`` and ``ials``.

- its ranking metrics against a direct computation;
- the sensitivity of its release (the co-occurrence of the head items) against adversarial users,
  through the same harness as every other release (tests/test_sensitivity.py);
- the noise-aware rule's fallback to private popularity, and its choice above it;
- a saved model's ``recommend`` (the same lists as the evaluation's scores; an item-item model
  that personalizes);
- the secure aggregator and the Flower grid give what the in-process engine gives.
"""

from __future__ import annotations

import numpy as np
import pytest

import fedpriv
from fedpriv.algorithms import als, ranking, topk
from fedpriv.algorithms.shards import shard_users
from fedpriv.data.splits import random_split

DATA = "synthetic-mf:users=300,items=60,ratings=6000,seed=3,select=1.5"


@pytest.fixture(scope="module")
def data():
    return fedpriv.load_data(DATA)


def _direct_recall_ndcg(scores: np.ndarray, train, test, users: np.ndarray, k: int, threshold: float) -> tuple[float, float]:
    """Recall@k and NDCG@k by hand: per user, the top k of the unrated items."""
    recalls, ndcgs = [], []
    for row, u in zip(scores, users):
        s = row.astype(np.float64).copy()
        s[train.items[train.users == u]] = -np.inf
        top = np.argsort(-s, kind="stable")[:k]
        rel = set(test.items[(test.users == u) & (test.ratings >= threshold)].tolist())
        if not rel:
            continue
        hits = np.array([i in rel for i in top], dtype=float)
        recalls.append(hits.sum() / min(k, len(rel)))
        disc = 1.0 / np.log2(np.arange(2, k + 2))
        ndcgs.append(float((hits * disc).sum() / disc[: min(k, len(rel))].sum()))
    return float(np.mean(recalls)), float(np.mean(ndcgs))


def test_ease_metrics_equal_a_direct_computation(data):
    res = fedpriv.train("ease", data)
    state = res.model.state
    split = random_split(data.interactions, seed=1234)
    got = ranking.evaluate_ranking(state, split.train, split.test, threshold=4.0)
    users = np.unique(split.test.users[split.test.ratings >= 4.0])
    scores = topk.scores(shard_users(split.train, users), state, np.arange(state.n_items))
    recall, ndcg = _direct_recall_ndcg(scores, split.train, split.test, users, got["k"], 4.0)
    assert got["users"] == len(users)
    assert got["recall"] == pytest.approx(recall, abs=1e-12) and got["ndcg"] == pytest.approx(ndcg, abs=1e-12)
    # the model is EASE on the exact binary matrix: a direct solve gives the same B
    X = np.zeros((split.train.n_users, state.n_items))
    X[split.train.users, split.train.items] = 1.0
    assert np.allclose(state.item_item, topk.ease(X.T @ X, topk.NONPRIVATE_REG), atol=1e-5)
    # and it personalizes: it beats the most-popular list on this preference-dependent set
    assert got["recall"] > ranking.popular_reference(split.train, split.test, threshold=4.0)["recall"]


@pytest.mark.parametrize("n_rated", [0, 1, 7, 60])  # 60: every item, 40 of them in the head
def test_one_user_moves_the_cooccurrence_by_at_most_its_sensitivity(n_rated):
    """An adversarial user with 0, 1, 7 or every item rated, through the harness of
    tests/test_sensitivity.py (the engines' client and aggregator code, a recording ledger)."""
    from test_sensitivity import RANGE, moves, with_adversary

    rng = np.random.default_rng(n_rated)
    inter = with_adversary(rng, 12, 60, 5, rng.choice(60, size=n_rated, replace=False), np.full(n_rated, 5.0))
    cfg = als.ALSConfig.from_overrides({"topk_items": "40"}, "topk")
    state = als.PublicState("topk", cfg, inter.n_items, inter.n_users, RANGE)
    state.multipliers = {p.name: 1.0 for p in als.plan_releases("topk", cfg, False)}
    state.counts_hat = inter.item_counts() + rng.normal(0, 2, inter.n_items)
    state.mean = 3.0
    als.server_init(state)
    head = topk.head(state)
    assert "cooc" in state.multipliers and len(head) == 40
    h = len(set(inter.items[inter.users == 5].tolist()) & set(head.tolist()))  # the adversary's head items
    # x unit-norm over h items: ||upper(x x^T)||^2 = (sum x^4 + (sum x^2)^2) / 2 = (1/h + 1) / 2 <= 1,
    # the declared bound, attained by a user with one head item
    expected = np.sqrt((1 / h + 1) / 2) if h else 0.0
    for shard_size in (None, 4):
        ratio = moves(inter, 5, state, None, shard_size)
        assert ratio["cooc"] <= 1 + 1e-9 and ratio["cooc"] == pytest.approx(expected, abs=1e-9), (ratio, h)


def test_the_rule_falls_back_to_private_popularity_and_personalizes_above_its_signal(data):
    low = fedpriv.train("topk", data, epsilon=0.5, noise_seed=1)
    pop = fedpriv.train("popular", data, epsilon=0.5, noise_seed=1)
    assert low.model.state.config.options.topk_items == 0 and low.model.state.item_item is None
    assert {r["name"] for r in low.ledger} == {"users", "mean", "counts"}  # no statistic: its budget went to the counts
    assert "private popularity" in low.metrics["noise_aware"]["model"]
    # the fallback ranks like private popularity (the released counts); same shares as popular
    assert low.model.state.config.share_counts >= pop.model.state.config.share_counts
    s = topk.TopKRule()
    assert s.choose(0.5, 1e-5, 60, 300)["topk_items"] == 0
    high = s.choose(20.0, 1e-5, 60, 300)
    assert high["topk_items"] == 60 and high["share_counts"] == topk.SHARE_COUNTS
    big = s.choose(5.0, 1e-5, 100_000, 70_000)
    assert big["topk_items"] == topk.HEAD_MAX  # the head, not the catalogue
    res = fedpriv.train("topk", data, epsilon=20.0, noise_seed=1)
    assert res.model.state.item_item.shape == (60, 60) and {r["name"] for r in res.ledger} >= {"cooc"}
    assert res.epsilon == pytest.approx(20.0, rel=1e-3) and res.epsilon <= 20.0 * (1 + 1e-6)


def test_a_saved_model_recommends_from_the_users_own_history(data, tmp_path):
    res = fedpriv.train("topk", data, epsilon=20.0, noise_seed=2)
    res.save_model(tmp_path / "m")
    model = fedpriv.load_model(tmp_path / "m")
    assert np.array_equal(model.state.item_item, res.model.state.item_item)
    ids = model.item_ids
    a = model.recommend(items=[ids[0], ids[1], ids[2]], ratings=[5, 5, 5], k=10)
    b = model.recommend(items=[ids[30], ids[40], ids[50]], ratings=[5, 5, 5], k=10)
    assert len(a) == len(b) == 10
    items_a, items_b = [r["item"] for r in a], [r["item"] for r in b]
    assert items_a != items_b  # personal lists, not the popularity list
    assert not {ids[0], ids[1], ids[2]} & set(items_a)  # the user's own items are not recommended
    # the saved model's scores are the evaluation's scores
    shard = shard_users(random_split(data.interactions, seed=1234).train, np.array([0]))
    assert np.allclose(topk.scores(shard, model.state, np.arange(60)), topk.scores(shard, res.model.state, np.arange(60)))


def test_secure_mode_releases_the_statistic_as_a_secure_sum(data):
    """Secure aggregation: the co-occurrence is a Skellam secure sum (its noise sized against
    one colluding node), the ledger records it, and the lists are close to central mode's."""
    central = fedpriv.train("topk", data, epsilon=20.0, noise_seed=3, users_per_node=20)
    secure = fedpriv.train("topk", data, epsilon=20.0, noise_seed=3, aggregation="secure", users_per_node=20)
    mech = {r["name"]: r["mechanism"] for r in secure.ledger}
    assert mech["cooc"] == "skellam"
    assert secure.epsilon <= 20.0 * (1 + 1e-3)
    rc, rs = central.metrics["ranking"]["recall"], secure.metrics["ranking"]["recall"]
    assert abs(rs - rc) <= 0.1 * rc, (rc, rs)


@pytest.mark.flower  # a Flower grid: runs on the newest supported Flower (scripts/test.sh)
@pytest.mark.parametrize("algorithm", ["topk", "topk-lowrank"])
@pytest.mark.parametrize("aggregation", ["central", "secure"])
def test_the_flower_grid_gives_the_in_process_lists_under_a_noise_seed(tmp_path, aggregation, algorithm):
    """The same plan on the in-process engine and on the Flower grid (real ServerApp and
    ClientApp over in-process messages), for both private forms: identical ledgers and released
    models (central), the secure sum's quantization apart (secure), and the same top-10 lists."""
    from fedpriv.flower.server_app import run_job
    from fedpriv.run import FlowerCallback, InProcess, Job
    from fedpriv.testing.local_grid import LocalGrid

    plan = Job(algorithm, DATA, epsilon=20.0, noise_seed=5, params={"aggregation": aggregation, "topk_items": 40}).prepare()
    ip = plan.execute(InProcess(users_per_shard=20))
    fl = plan.execute(FlowerCallback(runner=lambda job, n: run_job(LocalGrid(n), job), users_per_node=20, work_dir=tmp_path))
    assert fl.report.engine == "flower" and fl.report["rejected_replies"] == []
    assert fl.ledger == ip.ledger and {"cooc", "sketch"} & {r["name"] for r in ip.ledger}
    atol = 1e-6 if aggregation == "central" else 1e-3
    model = "item_item" if algorithm == "topk" else "item_factors"
    assert np.allclose(getattr(fl.state, model), getattr(ip.state, model), atol=atol)
    split = random_split(fedpriv.load_data(DATA).interactions, seed=1234)
    shard = shard_users(split.train, np.arange(40))
    every = np.arange(ip.state.n_items)
    top = lambda st: np.argsort(-topk.scores(shard, st, every), axis=1, kind="stable")[:, :10]  # noqa: E731
    if aggregation == "central":
        assert np.array_equal(top(fl.state), top(ip.state))
    else:  # quantized secure sums: the same lists but for near ties
        assert np.mean(top(fl.state) == top(ip.state)) > 0.9
    recall = [ranking.evaluate_ranking(st, split.train, split.test, threshold=4.0)["recall"] for st in (fl.state, ip.state)]
    assert recall[0] == pytest.approx(recall[1], abs=1e-12 if aggregation == "central" else 0.02)


def test_held_out_users_are_ranked_by_the_family_and_by_popular(data):
    """The held-out-users protocol (split="heldout"): the held-out users' histories are scored
    by the released model's own ranking; popular's lists are its released counts there too (they
    scored 0 before, through a factor model it does not have)."""
    pop = fedpriv.train("popular", data, epsilon=20.0, noise_seed=1, split="heldout")
    top = fedpriv.train("topk", data, epsilon=20.0, noise_seed=1, split="heldout")
    ref = fedpriv.train("ease", data, split="heldout")
    key = next(k for k in pop.metrics if k.startswith("test_recall_at_"))
    assert pop.metrics[key] > 0
    assert ref.metrics[key] > pop.metrics[key] and top.metrics[key] > pop.metrics[key], (pop.metrics[key], top.metrics[key], ref.metrics[key])


# ---- the low-rank form (topk-lowrank): a private sketch of the co-occurrence, O(items x d) per client


def _lowrank_state(inter, rng, factors=None):
    cfg = als.ALSConfig.from_overrides({"topk_items": "40", "rank": "8"}, "topk-lowrank")
    state = als.PublicState("topk-lowrank", cfg, inter.n_items, inter.n_users, (1.0, 5.0))
    state.multipliers = {p.name: 1.0 for p in als.plan_releases("topk-lowrank", cfg, False)}
    state.counts_hat = inter.item_counts() + rng.normal(0, 2, inter.n_items)
    state.mean = 3.0
    topk.LowRankStep().setup(state, None)
    if factors is not None:
        state.item_factors = factors
    return state


@pytest.mark.parametrize("n_rated", [1, 7, 60])
@pytest.mark.parametrize("broadcast", ["honest", "deviant"])
def test_one_user_moves_the_sketch_by_at_most_its_sensitivity_whatever_the_broadcast(n_rated, broadcast):
    """x x^T Q with unit-norm x and an orthonormal Q moves by at most 1. The client computes Q
    itself from the broadcast factors, so a server that broadcasts huge, non-orthonormal factors
    (``deviant``) cannot make one user's contribution larger: the positive control multiplies by
    the raw factors instead and moves far beyond 1."""
    from test_sensitivity import moves, with_adversary

    rng = np.random.default_rng(n_rated)
    inter = with_adversary(rng, 12, 60, 5, rng.choice(60, size=n_rated, replace=False), np.full(n_rated, 5.0))
    big = None if broadcast == "honest" else (rng.normal(0, 1e3, (60, 8)) + 1e4).astype(np.float32)
    state = _lowrank_state(inter, rng, big)
    assert "sketch" in state.multipliers and len(topk.head(state)) == 40
    for shard_size in (None, 4):
        ratio = moves(inter, 5, state, None, shard_size)
        assert 0 < ratio["sketch"] <= 1 + 1e-9, ratio
    if broadcast == "deviant":  # positive control: without the client's own orthonormalization
        X = topk._rows(shard_users(inter, np.array([5])), state, topk.head(state))
        raw = np.asarray(X.T @ (X @ np.asarray(state.item_factors, dtype=np.float64)[topk.head(state)]))
        assert np.linalg.norm(raw) > 100


def test_the_lowrank_rule_falls_back_and_sizes_its_head_by_the_signal(data):
    rule = topk.LowRankRule()
    assert rule.choose(0.5, 1e-5, 60, 300)["topk_items"] == 0
    S = rule.signal(5.0, 1e-5, 70_000)
    big = rule.choose(5.0, 1e-5, 100_000, 70_000)
    assert big["topk_items"] == round(topk.LOWRANK_HEAD_PER_ROOT_SIGNAL * np.sqrt(S)) and big["topk_reg"] == topk.LOWRANK_REG_UNITS
    low = fedpriv.train("topk-lowrank", data, epsilon=0.5, noise_seed=1)
    assert low.model.state.config.options.topk_items == 0 and {r["name"] for r in low.ledger} == {"users", "mean", "counts"}


def test_topk_lowrank_personalizes_through_the_ledger_and_its_saved_model(data, tmp_path):
    res = fedpriv.train("topk-lowrank", data, epsilon=20.0, noise_seed=2, topk_items=40)
    state = res.model.state
    count = {r["name"]: r["count"] for r in res.ledger}
    assert count["sketch"] == state.config.steps == 3  # one release per power step
    assert res.epsilon <= 20.0 * (1 + 1e-6) and res.epsilon == pytest.approx(20.0, rel=1e-3)
    assert state.item_factors.shape == (60, state.config.rank)
    assert np.all(state.item_factors[np.setdiff1d(np.arange(60), topk.head(state))] == 0)  # nothing outside the head
    raw = topk._head_scores(shard_users(random_split(data.interactions, seed=1234).train, np.arange(20)), state, topk.head(state))
    assert raw is not None and np.std(raw, axis=1).min() > 0  # a personal score for every user (benchmarks/topk.py has its recall)
    res.save_model(tmp_path / "m")
    model = fedpriv.load_model(tmp_path / "m")
    ids = model.item_ids
    head = topk.head(state)
    a = [r["item"] for r in model.recommend(items=[ids[i] for i in head[:3]], ratings=[5, 5, 5], k=10)]
    b = [r["item"] for r in model.recommend(items=[ids[i] for i in head[-3:]], ratings=[5, 5, 5], k=10)]
    assert a != b and not {ids[i] for i in head[:3]} & set(a)


def test_topk_lowrank_secure_mode_is_a_skellam_sketch(data):
    secure = fedpriv.train("topk-lowrank", data, epsilon=20.0, noise_seed=3, aggregation="secure", users_per_node=50, topk_items=40)
    central = fedpriv.train("topk-lowrank", data, epsilon=20.0, noise_seed=3, users_per_node=50, topk_items=40)
    assert {r["mechanism"] for r in secure.ledger if r["name"] == "sketch"} == {"skellam"}
    assert secure.epsilon <= 20.0 * (1 + 1e-3)
    rc, rs = central.metrics["ranking"]["recall"], secure.metrics["ranking"]["recall"]
    assert abs(rs - rc) <= 0.1 * rc, (rc, rs)


def test_ials_is_implicit_als_ranked_by_its_own_preferences(data):
    """The non-private iALS reference: every rating is the target 1 (whatever its value), the
    gravity term pulls the unobserved entries to 0, and the ranking is u . v of the user's own
    solved vector; it beats the most-popular list on this preference-dependent set."""
    from fedpriv.algorithms import als as als_mod

    res = fedpriv.train("ials", data)
    state = res.model.state
    assert state.config.gravity > 0 and not state.config.item_bias and state.item_factors.shape == (60, state.config.rank)
    split = random_split(data.interactions, seed=1234)
    shard = shard_users(split.train, np.arange(30))
    assert np.all(als_mod.client_targets(shard, state) == 1.0)  # implicit: the rating's value does not enter
    every = np.arange(60)
    got = ranking.ranking_scores(shard, state, every)
    assert np.allclose(got, als_mod.client_user_vectors(shard, state) @ state.item_factors.astype(np.float64).T)
    r = ranking.evaluate_ranking(state, split.train, split.test, threshold=4.0)
    assert r["recall"] > ranking.popular_reference(split.train, split.test, threshold=4.0)["recall"]
