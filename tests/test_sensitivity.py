"""Adversarial users against the declared L2 sensitivities, for every private algorithm and
every release it makes (issue 5).

Each release's pre-noise sum is computed with the engines' own code: the client functions
(``als.client_mean``, ``als.client_counts``, ``protocol.client_step``) over user shards, then
the aggregator functions (``als.release_mean``, ``als.release_counts``, ``protocol.aggregate``)
with a recording ledger in place of :class:`~fedpriv.privacy.ledger.PrivacyLedger`: it keeps
the exact sum, the sensitivity the aggregator declares for it, and returns the sum unchanged.
The public state (mean, counts, weights, item embeddings or encoder) is fixed, then the
releases are computed with and without one adversarial user; the L2 norm of the difference
(upper triangles for symmetric releases) must stay within ``als.sensitivity(name, ...)``.

The list of releases comes from ``als.plan_releases``: a planned release without an entry in
:data:`PRE_NOISE`, or a release the aggregator makes outside the plan, fails the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from flwr.app import Array
from conftest import als_config

from fedpriv.algorithms import als, protocol, registry
from fedpriv.algorithms.encoder import FeatureTable
from fedpriv.algorithms.shards import shard_users, split_users
from fedpriv.data.features import ItemFeatures
from fedpriv.data.interactions import Interactions
from fedpriv.errors import DataError
from fedpriv.flower import codec
from fedpriv.privacy.randomness import RunSecrets, user_keys
from fedpriv.privacy.symmetric import upper

RANGE = (1.0, 5.0)
PRIVATE = tuple(a for a in als.ALGORITHMS if registry.get(a).private)
TOL = 1 + 1e-5
STEP = 0  # the alternating step (round index) whose release is checked


# ----------------------------------------------------------------------------- recording ledger
@dataclass
class Record:
    name: str
    value: np.ndarray  # the exact (pre-noise) sum handed to the ledger
    sensitivity: float
    symmetric: bool
    sampling_rate: float | None


class RecordingLedger:
    """Aggregator-side stand-in for PrivacyLedger: records the exact sums, adds no noise."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def gaussian(self, name, value, *, sensitivity, noise_multiplier, symmetric=False, sampling_rate=None):
        assert noise_multiplier > 0
        self.records.append(Record(name, np.array(value, dtype=np.float64), float(sensitivity), bool(symmetric), sampling_rate))
        return value


# ----------------------------------------------------------------------------- pre-noise sums
def _users_sum(shards, state, table, ledger) -> None:
    total = np.sum([als.client_user_count(s) for s in shards], axis=0)
    als.release_user_count(total, state, ledger)


def _mean_sum(shards, state, table, ledger) -> None:
    total = np.sum([als.client_mean(s, state.config, state.rating_range, state.private) for s in shards], axis=0)
    als.release_mean(total, state, ledger)


def _counts_sum(shards, state, table, ledger) -> None:
    total = np.sum([als.client_counts(s, state.config, state.n_items, state.private) for s in shards], axis=0)
    als.release_counts(total, state, ledger)


def _step_sums(shards, state, table, ledger) -> None:
    parts = [protocol.client_step(s, state, STEP, table) for s in shards]
    protocol.aggregate(parts, state, ledger)


#: How each planned release's exact sum is computed (the engines' client and aggregator code).
PRE_NOISE = {
    "users": _users_sum,
    "mean": _mean_sum,
    "counts": _counts_sum,
    "item_stats_A": _step_sums,
    "item_stats_b": _step_sums,
    "gravity": _step_sums,
    "item_stats_H": _step_sums,
    "item_stats_g": _step_sums,
    "dpsgd_grad": _step_sums,
    "encoder_grad": _step_sums,
    "cooc": _step_sums,  # topk: tests/test_topk.py runs its head items through moves()
    "sketch": _step_sums,  # topk-lowrank: likewise, with honest and deviant broadcasts
}
#: Releases whose bound one user can attain (used to show that the adversaries are strong).
ATTAINABLE = ("users", "mean", "counts", "item_stats_b", "dpsgd_grad", "encoder_grad")


def releases(shards, state, table) -> list[Record]:
    """Every release of the plan, in plan order: pre-processing ones, then one step's."""
    plan = als.plan_releases(state.algorithm, state.config, state.implicit)
    missing = [p.name for p in plan if p.name not in PRE_NOISE]
    assert not missing, f"planned releases without a pre-noise computation in this test: {missing}"
    out: list[Record] = []
    done = []
    for p in plan:
        fn = PRE_NOISE[p.name]
        if fn in done:
            continue
        done.append(fn)
        ledger = RecordingLedger()
        fn(shards, state, table, ledger)
        out.extend(ledger.records)
    # exactly the planned releases, each as many times per step as planned
    per_step = {p.name: (p.count // state.config.steps if PRE_NOISE[p.name] is _step_sums else p.count) for p in plan}
    seen = {}
    for r in out:
        seen[r.name] = seen.get(r.name, 0) + 1
    assert seen == per_step, f"{state.algorithm}: releases made {seen}, planned {per_step}"
    rates = {p.name: p.sampling_rate for p in plan}
    for r in out:
        assert r.sampling_rate == rates[r.name], r.name
    return out


def moves(inter: Interactions, user: int, state, table, users_per_shard: int | None) -> dict[str, float]:
    """Per release: L2 norm of (release with ``user``) - (release without ``user``), as a
    fraction of the sensitivity the aggregator declares; also checks that declaration."""
    blocks = [np.arange(inter.n_users)] if not users_per_shard else split_users(inter.n_users, users_per_shard)
    keys = user_keys(RunSecrets(0).client_key(), inter.user_ids)  # the same secret choices in both
    with_ = [shard_users(inter, b, keys) for b in blocks]
    without = [shard_users(inter, b[b != user], keys) for b in blocks if len(b[b != user])]
    r1, r0 = releases(with_, state, table), releases(without, state, table)
    out: dict[str, float] = {}
    for a, b in zip(r1, r0, strict=True):
        assert a.name == b.name and a.value.shape == b.value.shape
        declared = als.sensitivity(a.name, state.config, state.rating_range)
        assert a.sensitivity == pytest.approx(declared, rel=1e-12) and math.isfinite(declared) and declared > 0
        assert np.all(np.isfinite(a.value)) and np.all(np.isfinite(b.value)), a.name
        diff = a.value - b.value
        if a.symmetric:
            diff = upper(diff)
        ratio = float(np.linalg.norm(diff)) / declared
        out[a.name] = max(out.get(a.name, 0.0), ratio)
    return out


# ----------------------------------------------------------------------------- public state
def item_features(n_items: int, n_tags: int = 0, heavy_items=(), heavy_tags: int = 0, seed: int = 0) -> ItemFeatures:
    """Public multi-hot features: genre, year and (when ``n_tags``) tag fields. ``heavy_items``
    carry ``heavy_tags`` active tags each, with enormous values; other items 0 to a few tags."""
    rng = np.random.default_rng(seed)
    n_genres, n_years = 7, 4
    blocks = [
        sp.csr_matrix((rng.random((n_items, n_genres)) < 0.3).astype(np.float32)),
        sp.csr_matrix((np.ones(n_items, np.float32), (np.arange(n_items), rng.integers(n_years, size=n_items))), shape=(n_items, n_years)),
    ]
    fields = {"genre": slice(0, n_genres), "year": slice(n_genres, n_genres + n_years)}
    names = [f"genre={j}" for j in range(n_genres)] + [f"year={j}" for j in range(n_years)]
    if n_tags:
        tags = (rng.random((n_items, n_tags)) < 1.5 / n_tags).astype(np.float32)
        for i in heavy_items:
            tags[i, rng.choice(n_tags, size=heavy_tags, replace=False)] = rng.choice([1e30, -1e30, 3e38, 1.0], size=heavy_tags)
        blocks.append(sp.csr_matrix(tags))
        fields["tag"] = slice(n_genres + n_years, n_genres + n_years + n_tags)
        names += [f"tag={j}" for j in range(n_tags)]
    return ItemFeatures(matrix=sp.hstack(blocks, format="csr"), fields=fields, columns=names)


def public_state(algorithm: str, cfg: als.ALSConfig, inter: Interactions, features, implicit: bool = False, inflate: float = 30.0):
    """The public state an engine would broadcast at step 0 (released values replaced by fixed
    public ones), with item embeddings inflated so that solved user vectors hit ``user_clip``.
    Returns (state, feature table or None)."""
    cfg.validate()
    plan = als.plan_releases(algorithm, cfg, implicit)
    state = als.PublicState(algorithm=algorithm, config=cfg, n_items=inter.n_items, n_users=inter.n_users, rating_range=RANGE, implicit=implicit)
    state.multipliers = {p.name: 1.0 for p in plan}
    if als.needs_mean(algorithm, implicit):
        state.mean = 3.0
    if als.needs_counts(algorithm):
        rng = np.random.default_rng(5)
        state.counts_hat = inter.item_counts() + rng.normal(0, 3, inter.n_items)  # noisy, some < 1
    server = protocol.server_setup(state, features)
    if getattr(server, "encoder", None) is None:  # no encoder server (the bias model keeps only its public features)
        state.item_factors = state.item_factors * inflate
        if cfg.item_bias:
            state.item_bias = np.linspace(-1.0, 1.0, inter.n_items)
        return state, None
    with torch.no_grad():
        for emb in server.encoder.embeddings:
            emb.mul_(inflate)
        server.encoder.offset.add_(torch.linspace(-1.0, 1.0, len(server.encoder.offset)))
    server.publish()
    return state, server.encoder.table


# ----------------------------------------------------------------------------- adversaries
def with_adversary(rng, n_users: int, n_items: int, adv: int, adv_items, adv_ratings, per_user=(5, 15)) -> Interactions:
    """Ordinary users with in-range ratings (including the ends), plus user ``adv`` rating
    ``adv_items`` with ``adv_ratings``."""
    users, items, vals = [], [], []
    for u in range(n_users):
        if u == adv:
            users.append(np.full(len(adv_items), u))
            items.append(np.asarray(adv_items))
            vals.append(np.asarray(adv_ratings, dtype=np.float64))
            continue
        n = int(rng.integers(*per_user))
        users.append(np.full(n, u))
        items.append(rng.choice(n_items, size=n, replace=False))
        vals.append(rng.choice([1.0, 5.0, 2.5, 3.0, 4.5], size=n))
    return Interactions(np.concatenate(users), np.concatenate(items), np.concatenate(vals), n_users, n_items)


N_ITEMS, N_USERS = 60, 12
HEAVY = (0, 1, 2, 3)  # items with thousands of active features
FEATURES = item_features(N_ITEMS, n_tags=4000, heavy_items=HEAVY, heavy_tags=2500)


@st.composite
def adversaries(draw):
    n = draw(st.sampled_from([0, 1, 10]))
    values = st.sampled_from([RANGE[0], RANGE[1], 1e6, -1e6, 3.0])
    ratings = draw(st.lists(values, min_size=n, max_size=n))
    # sometimes the heavy-feature items, always distinct
    pool = draw(st.sampled_from(["heavy", "any"]))
    return n, ratings, pool


@st.composite
def configs(draw):
    """Values for every key (each algorithm's config takes those it reads: conftest.als_config)."""
    return dict(
        rank=draw(st.sampled_from([2, 3])),
        steps=draw(st.sampled_from([1, 3])),
        user_clip=draw(st.sampled_from([0.3, 1.5, 4.0])),
        rating_clip=draw(st.sampled_from([0.5, 2.0, 10.0])),
        beta=draw(st.sampled_from([0.1, 1.0, 7.0])),
        mu=draw(st.sampled_from([0.0, 0.5, 1.0])),
        weight_mode=draw(st.sampled_from(["clip", "normalize"])),
        k=draw(st.sampled_from([1, 7])),
        count_cap=draw(st.sampled_from([1.0, 50.0])),
        mean_cap=draw(st.sampled_from([1.0, 50.0])),
        item_bias=draw(st.booleans()),
        user_bias=draw(st.booleans()),
        weighted_reg=draw(st.booleans()),
        bias_share=draw(st.sampled_from([0.05, 0.25, 0.9])),
        gravity=draw(st.sampled_from([0.0, 0.5])),
        sgd_clip=draw(st.sampled_from([0.1, 0.7, 5.0])),
        sgd_sampling_rate=1.0,  # Poisson releases: every user sampled, so each one's contribution is checked
        features=draw(st.sampled_from(["genre,year", "tag", "genre,tag,id"])),
        enc_hidden=draw(st.sampled_from([0, 4])),
        ssp_steps=2,
        ssp_resamples=draw(st.sampled_from([0, 2])),
        convex_threshold=draw(st.sampled_from([1.0, 3.5, 5.0])),
        newton_steps=2,
    )


@pytest.mark.parametrize("algorithm", PRIVATE)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(adv=adversaries(), values=configs(), implicit=st.booleans(), position=st.sampled_from([0, 5, N_USERS - 1]), users_per_shard=st.sampled_from([None, 4]), seed=st.integers(0, 2**16))
def test_one_adversarial_user_moves_each_release_by_at_most_its_sensitivity(algorithm, adv, values, implicit, position, users_per_shard, seed):
    """0, 1 or 10 ratings at the range ends or at +-1e6, possibly on items with thousands of
    public features; every release of the plan moves by at most its declared sensitivity."""
    cfg = als_config(algorithm, **values)
    n, ratings, pool = adv
    implicit = implicit and algorithm != "am-ssp-convex"  # the logistic model needs explicit ratings
    rng = np.random.default_rng(seed)
    adv_items = rng.choice(HEAVY if (pool == "heavy" and n <= len(HEAVY)) else N_ITEMS, size=n, replace=False)
    inter = with_adversary(rng, N_USERS, N_ITEMS, position, adv_items, ratings)
    state, table = public_state(algorithm, cfg, inter, FEATURES, implicit)
    ratio = moves(inter, position, state, table, users_per_shard)
    assert set(ratio) == {p.name for p in als.plan_releases(algorithm, cfg, implicit)}
    over = {k: v for k, v in ratio.items() if v > TOL}
    assert not over, f"{algorithm}: one user moves releases beyond their sensitivity (ratio): {over}"
    if n == 0:  # a user without ratings moves only the user count and the gravity term (0 + kappa)
        assert all(v <= 1e-5 for k, v in ratio.items() if k not in ("users", "gravity")), ratio
    else:
        assert max(ratio.values()) > 0, ratio


def test_the_heavy_feature_items_are_heavy():
    """The adversarial features really are huge: thousands of active tags, enormous values."""
    sub = FEATURES.matrix[:, FEATURES.fields["tag"]].tocsr()
    active = np.diff(sub.indptr)
    assert all(active[i] >= 2500 for i in HEAVY) and active[len(HEAVY):].max() < 20
    assert np.abs(sub[list(HEAVY)].data).max() >= 1e30
    table = FeatureTable.build(FEATURES, N_ITEMS, ["genre", "tag", "id"])  # as the encoder sees them
    assert table.index[1].shape == (N_ITEMS, active.max())


def test_every_planned_release_has_a_pre_noise_computation():
    """Whatever the options, every release an algorithm plans is checked by this file (a new
    release must get an entry in PRE_NOISE and in NODE_REPLY)."""
    for algorithm in PRIVATE:
        for implicit in (False, True):
            for gravity in (0.0, 0.5):
                cfg = als_config(algorithm, gravity=gravity, steps=2, ssp_steps=3)
                plan = als.plan_releases(algorithm, cfg, implicit)
                assert plan, algorithm
                for p in plan:
                    assert p.name in PRE_NOISE and p.name in NODE_REPLY, f"{algorithm}: release {p.name!r} is not covered"
                    assert als.sensitivity(p.name, cfg, RANGE) > 0


# ----------------------------------------------------------------------------- 10^5 ratings
BIG = 100_000


@pytest.fixture(scope="module")
def big_catalogue():
    """A catalogue of 10^5 items, a user rating every one of them (all at 1e6), few others."""
    rng = np.random.default_rng(7)
    adv = 2
    inter = with_adversary(rng, 5, BIG, adv, np.arange(BIG), np.full(BIG, 1e6), per_user=(20, 40))
    return inter, adv, item_features(BIG)


@pytest.mark.parametrize("algorithm", PRIVATE)
def test_a_user_with_1e5_ratings_moves_each_release_by_at_most_its_sensitivity(algorithm, big_catalogue):
    inter, adv, feats = big_catalogue
    assert inter.user_counts()[adv] == BIG
    cfg = als_config(
        algorithm, rank=3, user_clip=1.5, rating_clip=2.0, beta=3.0, weight_mode="normalize", k=50, user_bias=False, gravity=0.5,
        sgd_clip=0.7, sgd_sampling_rate=1.0, features="genre,year,id", ssp_steps=2, newton_steps=2,
    )
    state, table = public_state(algorithm, cfg, inter, feats)
    ratio = moves(inter, adv, state, table, users_per_shard=2)
    assert set(ratio) == {p.name for p in als.plan_releases(algorithm, cfg, False)}
    over = {k: v for k, v in ratio.items() if v > TOL}
    assert not over, f"{algorithm}: the 10^5-rating user exceeds the sensitivity of {over}"
    # the bounds are tight: this user attains them (so the check above is not vacuous)
    attained = {k: v for k, v in ratio.items() if k in ATTAINABLE}
    assert attained and all(v >= 0.99 for v in attained.values()), ratio


# ----------------------------------------------------------------------------- non-private ALS
def test_non_private_als_makes_no_release(small_mf):
    from fedpriv.engine.inprocess import train_inprocess

    cfg = als.ALSConfig(rank=2, steps=1, gravity=0.5)
    assert "als" in als.ALGORITHMS and "als" not in PRIVATE
    assert als.plan_releases("als", cfg, False) == [] and als.plan_releases("als", cfg, True) == []
    assert als.calibrate_plan("als", cfg, False, 1.0, 1e-5) == {}
    inter = small_mf.interactions
    state = als.PublicState(algorithm="als", config=cfg, n_items=inter.n_items, n_users=inter.n_users, rating_range=RANGE)
    assert not state.private
    state.counts_hat = inter.item_counts().astype(float)
    assert protocol.server_setup(state, None) is None
    ledger = RecordingLedger()
    shards = [shard_users(inter)]
    for fn in dict.fromkeys(PRE_NOISE.values()):
        fn(shards, state, None, ledger)
    assert ledger.records == []
    # the aggregator hands back the exact sums without any ledger
    A, b, g = protocol.aggregate([protocol.client_step(shards[0], state, 0)], state, None)
    assert np.all(np.isfinite(A)) and np.abs(b).sum() > 0 and g is not None
    result = train_inprocess("als", inter, cfg, rating_range=RANGE, progress=False)
    assert result.ledger.to_list() == []


# ----------------------------------------------------------------------------- known bugs
def test_client_mean_accepts_a_last_user_without_ratings():
    inter = Interactions(np.array([0, 0]), np.array([0, 1]), np.array([3.0, 4.0]), n_users=2, n_items=2)  # user 1: no ratings
    shard = shard_users(inter)
    total = als.client_mean(shard, als.ALSConfig(), RANGE, True)
    assert total.tolist() == [7.0, 2.0]


# ----------------------------------------------------------------------------- non-finite ratings
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, 1e39])  # 1e39 overflows float32 to inf
def test_interactions_refuse_non_finite_ratings(value):
    with pytest.raises(ValueError, match="finite"):
        Interactions(np.array([0, 0]), np.array([0, 1]), np.array([3.0, value]), n_users=1, n_items=2)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_loaders_refuse_non_finite_ratings(tmp_path, value):
    from fedpriv.data.loaders import load_dataset

    (tmp_path / "ml-100k").mkdir()
    (tmp_path / "ml-100k" / "u.data").write_text(f"1\t1\t3\t1\n2\t1\t{value}\t1\n")
    with pytest.raises(DataError, match="not a finite number") as info:
        load_dataset("ml-100k", tmp_path / "ml-100k", rating_range=(-math.inf, math.inf))
    assert info.value.line == 2


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_loaders_refuse_ratings_that_overflow_float32(tmp_path):
    from fedpriv.data.loaders import load_dataset

    (tmp_path / "ml").mkdir()
    (tmp_path / "ml" / "ratings.csv").write_text("userId,movieId,rating,timestamp\n1,1,4,1\n1,2,1e39,3\n")
    with pytest.raises(DataError, match="overflows a float32"):
        load_dataset("ml-latest", tmp_path / "ml", rating_range=(0, math.inf))


# ----------------------------------------------------------------------------- Flower codec
def _vector_reply(client):
    def encode(shard, state, table):
        return codec.encode_vector(client(shard, state), shard.n_users)

    return encode


def _step_reply(shard, state, table):
    return codec.encode_contribution(protocol.client_step(shard, state, STEP, table), state, shard.n_users)


#: Per release: (the reply a node sends, as in fedpriv.flower.client_app; how the server decodes it).
NODE_REPLY = {
    "users": (_vector_reply(lambda sh, st_: als.client_user_count(sh)), lambda rd, st_, n_params: codec.decode_vector(rd, "users", 1, st_, 1)),
    "mean": (_vector_reply(lambda sh, st_: als.client_mean(sh, st_.config, st_.rating_range, True)), lambda rd, st_, n_params: codec.decode_vector(rd, "mean", 2, st_, 1)),
    "counts": (_vector_reply(lambda sh, st_: als.client_counts(sh, st_.config, st_.n_items, True)), lambda rd, st_, n_params: codec.decode_vector(rd, "counts", st_.n_items, st_, 1)),
    **{
        name: (_step_reply, lambda rd, st_, n_params: codec.decode_contribution(rd, st_, protocol.stats_dim(st_), 1, n_params))
        for name in ("item_stats_A", "item_stats_b", "gravity", "item_stats_H", "item_stats_g", "dpsgd_grad", "encoder_grad")
    },
}


def _float_arrays(rd):
    rec = rd.array_records["contrib"]
    return [k for k in rec if rec[k].numpy().dtype.kind == "f"]


def _replace(rd, key, fn):
    rec = rd.array_records["contrib"]
    rec[key] = Array(np.ascontiguousarray(fn(rec[key].numpy())))
    return rd


def _codec_cases() -> list:
    cases = [pytest.param(a, 0.0, id=f"{a}-nogravity") for a in PRIVATE]
    for a in PRIVATE:
        cases.append(pytest.param(a, 0.5, id=f"{a}-gravity"))
    return cases


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("algorithm,gravity", _codec_cases())
def test_codec_accepts_a_genuine_adversarial_node_and_rejects_non_finite_or_inflated_replies(algorithm, gravity):
    """A node holding only the adversarial user: its genuine replies pass the server's bound
    check (declared n_users = 1); the same replies with a non-finite entry or inflated values
    are rejected, for every release and contribution kind (stats, convex, gradient, flat)."""
    cfg = als_config(algorithm, rank=3, user_clip=1.5, rating_clip=2.0, beta=2.0, weight_mode="normalize", gravity=gravity, sgd_clip=0.7, sgd_sampling_rate=1.0, features="tag,id", ssp_steps=2, newton_steps=2)
    rng = np.random.default_rng(3)
    inter = with_adversary(rng, N_USERS, N_ITEMS, 0, np.arange(20), np.where(np.arange(20) % 2, 1e6, -1e6))
    state, table = public_state(algorithm, cfg, inter, FEATURES)
    n_params = protocol.client_encoder(state, table).n_params() if algorithm == "am-dpsgd" else 0
    node = shard_users(inter, np.array([0]), user_keys(RunSecrets(0).client_key(), inter.user_ids))
    plan = als.plan_releases(algorithm, cfg, False)
    for encode, decode in {id(NODE_REPLY[p.name][0]): NODE_REPLY[p.name] for p in plan}.values():
        rd = encode(node, state, table)
        sent = next(rd.array_records["contrib"][k].numpy() for k in ("values", "b", "grad") if k in rd.array_records["contrib"])
        decoded = decode(rd, state, n_params)
        assert np.array_equal(decoded if isinstance(decoded, np.ndarray) else decoded.b, sent)
        for key in _float_arrays(encode(node, state, table)):
            for bad in (np.nan, np.inf):
                rd = _replace(encode(node, state, table), key, lambda x: np.where(np.arange(x.size).reshape(x.shape) == 0, bad, x))
                with pytest.raises(codec.RejectedReply, match="non-finite"):
                    decode(rd, state, n_params)
            rd = encode(node, state, table)
            if np.linalg.norm(rd.array_records["contrib"][key].numpy()) > 0:
                with pytest.raises(codec.RejectedReply, match="over bound"):
                    decode(_replace(rd, key, lambda x: x * 1e6), state, n_params)
