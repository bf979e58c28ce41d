"""Per-user budget bounds: sum_i w_ij^2 <= beta for every user, whatever the user's data, and
the per-user contribution to each release within its declared L2 sensitivity."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import keyed_shard, adversarial_interactions
from fedpriv.algorithms import als
from fedpriv.algorithms.kernels import upper
from fedpriv.algorithms.options import DPSGDOptions
from fedpriv.data.interactions import Interactions
from fedpriv.errors import ConfigError
from fedpriv.data.ids import mix_uniform
from fedpriv.privacy.randomness import RunSecrets, user_keys, user_uniform
from fedpriv.privacy.weights import adaptive_omega, clip_user_weights, sampled_user_weights


def _per_user_sq(w, indptr):
    return np.add.reduceat(w * w, indptr[:-1]) if len(w) else np.zeros(0)


def _adversarial_csr(n_items=2000, seed=0):
    """Users with 1 rating, 10^5 ratings (with repeats of items allowed by the weights API),
    all items, and ordinary users."""
    rng = np.random.default_rng(seed)
    rows = [np.array([0]), rng.integers(0, n_items, 100_000), np.arange(n_items), rng.integers(0, n_items, 30)]
    items = np.concatenate(rows).astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
    return items, indptr


@pytest.mark.parametrize("mode", ["clip", "normalize"])
@pytest.mark.parametrize("mu", [0.0, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("beta", [0.1, 1.0, 7.0])
def test_adaptive_weights_respect_the_user_budget(mode, mu, beta):
    items, indptr = _adversarial_csr()
    counts = np.random.default_rng(1).normal(50, 200, 2000)  # noisy counts, some negative
    omega = adaptive_omega(counts, mu, n_users=4, beta=beta, beta_bar_ratio=3.0)
    w = clip_user_weights(omega, items, indptr, beta, mode)
    assert np.all(w >= 0) and np.all(np.isfinite(w))
    assert np.all(_per_user_sq(w, indptr) <= beta * (1 + 1e-12))
    if mode == "normalize":
        assert np.allclose(_per_user_sq(w, indptr), beta, rtol=1e-9)


def test_adaptive_omega_matches_eq16():
    n = np.array([1.0, 10.0, 100.0])
    om = adaptive_omega(n, 0.5, n_users=50, beta=2.0, beta_bar_ratio=0.5)
    # eq. 16: omega_i = n_i^-mu / sqrt(sum n^(1-2mu) / (n * beta_bar)); here sum n^0 = 3
    assert np.allclose(om, n**-0.5 / math.sqrt(3 / (50 * 1.0)))
    assert np.sum(n * om**2) == pytest.approx(50 * 1.0)
    with pytest.raises(ConfigError):
        adaptive_omega(n, -1.0, 5, 1.0)


@pytest.mark.parametrize("mode", ["uniform", "tail"])
def test_sampling_weights_keep_k_items(mode):
    items, indptr = _adversarial_csr()
    users = np.repeat(np.arange(4), np.diff(indptr))
    counts = np.arange(2000, dtype=float)
    keys = user_keys(RunSecrets().client_key(), np.arange(4))[users]
    w = sampled_user_weights(user_uniform(keys, 2, items.astype(np.uint64)), items, indptr, 25, 1.0, mode=mode, counts_hat=counts)
    kept = np.add.reduceat((w > 0).astype(int), indptr[:-1])
    assert list(kept) == [1, 25, 25, 25]
    assert np.all(_per_user_sq(w, indptr) <= 1.0 + 1e-12)
    if mode == "tail":  # the user rating every item keeps the 25 least counted ones
        s, e = indptr[2], indptr[3]
        assert set(items[s:e][w[s:e] > 0]) == set(range(25))


def test_mix_uniform_is_deterministic_and_uniform():
    a = mix_uniform(np.uint64(7), np.arange(100_000), np.arange(100_000) % 13)
    assert np.array_equal(a, mix_uniform(np.uint64(7), np.arange(100_000), np.arange(100_000) % 13))
    assert 0 <= a.min() and a.max() < 1 and abs(a.mean() - 0.5) < 0.01


def test_user_keys_follow_the_raw_id_not_the_position():
    """A user's secret key is a function of its raw id: renumbering moves no one's choices."""
    key = RunSecrets().client_key()
    raw = np.array([3, 10, 42, 97])
    k_all = user_keys(key, raw)
    k_less = user_keys(key, raw[[0, 2, 3]])  # raw user 10 removed, the others renumbered
    assert np.array_equal(k_all[[0, 2, 3]], k_less)
    assert len(set(user_keys(RunSecrets().client_key(), raw).tolist()) & set(k_all.tolist())) == 0  # fresh secrets differ
    assert np.array_equal(user_keys(RunSecrets(5).client_key(), raw), user_keys(RunSecrets(5).client_key(), raw))


# ------------------------------------------------------------------ release-level sensitivity
def _state(algorithm, inter, cfg):
    st_ = als.PublicState(algorithm=algorithm, config=cfg, n_items=inter.n_items, n_users=inter.n_users, rating_range=(1.0, 5.0))
    st_.mean = 3.0
    st_.counts_hat = inter.item_counts().astype(float) + 3.0
    als.server_weights(st_)
    als.server_init(st_)
    st_.item_factors = st_.item_factors * 30  # large factors: user vectors hit the clip
    st_.item_bias = np.linspace(-1, 1, inter.n_items)
    return st_


def _stats_without(inter, user, state):
    keep = inter.users != user
    parts = als.client_item_stats(keyed_shard(inter.subset(keep)), state)
    return als.sum_item_stats([parts], inter.n_items, parts.A.shape[-1])


@pytest.mark.parametrize("algorithm", ["dpals-uniform", "dpals-tail", "adadpals"])
@settings(max_examples=12, deadline=None)
@given(
    n_ratings=st.sampled_from([0, 1, 3, 400]),
    rating=st.sampled_from([1.0, 5.0, 1e6, -1e6]),
    weight_mode=st.sampled_from(["clip", "normalize"]),
    seed=st.integers(0, 10_000),
)
def test_one_user_moves_each_release_by_at_most_its_sensitivity(algorithm, n_ratings, rating, weight_mode, seed):
    n_items, n_users = 400, 30
    inter = adversarial_interactions(np.random.default_rng(seed), n_users, n_items, 1500, n_ratings, rating)
    cfg = als.ALSConfig(rank=3, user_clip=1.5, rating_clip=2.0, beta=2.0, k=7, weight_mode=weight_mode, mu=0.5)
    state = _state(algorithm, inter, cfg)
    A1, b1, _ = als.sum_item_stats([als.client_item_stats(keyed_shard(inter), state)], n_items, cfg.rank + 1)
    A0, b0, _ = _stats_without(inter, n_users - 1, state)
    sA = als.sensitivity("item_stats_A", cfg, state.rating_range)
    sb = als.sensitivity("item_stats_b", cfg, state.rating_range)
    assert np.linalg.norm(upper(A1) - upper(A0)) <= sA * (1 + 1e-5)
    assert np.linalg.norm(b1 - b0) <= sb * (1 + 1e-5)
    # mean and counts contributions of that user
    one = keyed_shard(inter, np.array([n_users - 1]))
    assert np.linalg.norm(als.client_mean(one, cfg, (1.0, 5.0), True)) <= als.sensitivity("mean", cfg, (1.0, 5.0)) * (1 + 1e-9)
    assert np.linalg.norm(als.client_counts(one, cfg, n_items, True)) <= als.sensitivity("counts", cfg, (1.0, 5.0)) * (1 + 1e-9)


@settings(max_examples=10, deadline=None)
@given(n_ratings=st.sampled_from([1, 3, 300]), rating=st.sampled_from([1.0, 5.0, 1e6]), seed=st.integers(0, 1000))
def test_dpsgd_user_gradient_is_clipped(n_ratings, rating, seed):
    from fedpriv.algorithms import dpsgd

    rng = np.random.default_rng(seed)
    items = rng.choice(400, size=n_ratings, replace=False)
    inter = Interactions(np.zeros(n_ratings, int), items, np.full(n_ratings, rating), 1, 400)
    cfg = als.ALSConfig(rank=3, options=DPSGDOptions(sgd_clip=0.7, sgd_sampling_rate=1.0))
    state = _state("dpsgd", inter, cfg)
    g = dpsgd.client_gradient(keyed_shard(inter), state, round_index=0)
    assert np.linalg.norm(g.b) <= 0.7 * (1 + 1e-9)
    assert len(g.item_ids) <= n_ratings


@pytest.mark.parametrize("algorithm", ["adadpals", "dpals-tail"])
def test_a_shard_keeps_its_rating_weights_while_their_inputs_hold(algorithm, monkeypatch):
    """client_rating_weights computes a shard's weights once per run: a later step gets the same
    read-only array without running the rule; new released counts, a new omega or another
    configuration compute them again (the positive controls), and the kept weights always
    equal the rule's."""
    import dataclasses

    from fedpriv.algorithms import registry

    inter = adversarial_interactions(np.random.default_rng(1), 30, 200, 900, 40, 5.0)
    state = _state(algorithm, inter, als.ALSConfig(rank=3, k=5))
    shard = keyed_shard(inter)
    spec = registry.get(algorithm)
    calls = []
    counted = dataclasses.replace(spec, rating_weights=lambda sh, st_: calls.append(1) or spec.rating_weights(sh, st_))
    monkeypatch.setattr(registry, "get", lambda name: counted if name == algorithm else spec)

    def fresh():
        return spec.rating_weights(shard, state)

    w1 = als.client_rating_weights(shard, state)
    w2 = als.client_rating_weights(shard, state)
    assert w2 is w1 and len(calls) == 1 and not w1.flags.writeable
    assert np.array_equal(w1, fresh())
    state.counts_hat = state.counts_hat + 7.0  # new released counts (and, for adadpals, a new omega)
    als.server_weights(state)
    w3 = als.client_rating_weights(shard, state)
    assert len(calls) == 2 and np.array_equal(w3, fresh())
    state.config = dataclasses.replace(state.config, beta=state.config.beta / 2)
    w4 = als.client_rating_weights(shard, state)
    assert len(calls) == 3 and np.array_equal(w4, fresh())
