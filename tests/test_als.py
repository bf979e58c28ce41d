import dataclasses

import numpy as np
import pytest

from fedpriv.algorithms.als import ALSConfig
from fedpriv.data.interactions import Interactions
from fedpriv.engine.inprocess import train_inprocess
from fedpriv.privacy.randomness import RunSecrets
from fedpriv.errors import ConfigError
from fedpriv.algorithms.evaluation import evaluate_rmse


def _planted(n_users=400, n_items=150, rank=3, density=0.5, seed=0):
    rng = np.random.default_rng(seed)
    U = rng.normal(size=(n_users, rank)) / np.sqrt(rank)
    V = rng.normal(size=(n_items, rank))
    mask = rng.random((n_users, n_items)) < density
    u, i = np.nonzero(mask)
    r = 3.0 + np.einsum("nd,nd->n", U[u], V[i])
    return Interactions(u, i, r, n_users, n_items), (U, V)


def test_als_recovers_a_planted_low_rank_matrix():
    inter, _ = _planted()
    rng = np.random.default_rng(1)
    test = rng.random(len(inter)) < 0.1
    train, held = inter.subset(~test), inter.subset(test)
    cfg = ALSConfig(rank=3, steps=25, reg_user=1e-4, reg_item=1e-4, user_bias=False, item_bias=False)
    res = train_inprocess("als", train, cfg, rating_range=(-100, 100), progress=False)
    rmse, _ = evaluate_rmse(res.state, train, held, train.item_counts())
    assert rmse < 0.02  # signal std is about 1


def test_private_run_spends_the_target_and_beats_noise_on_easy_data():
    inter, _ = _planted(n_users=3000, n_items=60, rank=1, density=0.6, seed=2)
    cfg = ALSConfig(rank=1, steps=2, reg_item_private=5.0)
    res = train_inprocess("adadpals", inter, cfg, rating_range=(-100, 100), epsilon=5.0, progress=False, secrets=RunSecrets(2))  # reproducible: a utility bar
    from fedpriv.privacy.accounting import epsilon_rdp

    assert epsilon_rdp(res.ledger, 1e-5) == pytest.approx(5.0, rel=1e-3)
    rmse, _ = evaluate_rmse(res.state, inter, inter, inter.item_counts())
    baseline = np.sqrt(np.mean((inter.ratings - inter.ratings.mean()) ** 2))
    assert rmse < 0.8 * baseline


@pytest.mark.parametrize("algorithm", ["als", "adadpals", "dpals-uniform", "dpals-tail"])
def test_shards_give_the_same_model(small_mf, algorithm):
    """Sharding users over clients changes nothing but floating-point summation order."""
    cfg = ALSConfig(rank=3, steps=2)
    eps = None if algorithm == "als" else 3.0
    kw = dict(rating_range=(1, 5), epsilon=eps, progress=False)
    one = train_inprocess(algorithm, small_mf.interactions, cfg, secrets=RunSecrets(3), **kw)
    many = train_inprocess(algorithm, small_mf.interactions, cfg, users_per_shard=7, secrets=RunSecrets(3), **kw)
    assert np.allclose(one.state.item_factors, many.state.item_factors, rtol=1e-4, atol=1e-5)
    assert one.ledger.to_list() == many.ledger.to_list()


def test_bad_config_names_the_field():
    with pytest.raises(ConfigError, match="rank"):
        ALSConfig.from_overrides({"rank": "-1"})  # rank 0 is the bias model (no factors)
    with pytest.raises(ConfigError, match="nope"):
        ALSConfig.from_overrides({"nope": "1"})
    with pytest.raises(ConfigError, match="reg_item_private"):
        ALSConfig.from_overrides({"reg_item_private": "abc"})
    assert ALSConfig.from_overrides({"rank": "4", "user_bias": "false"}).rank == 4


def test_keys_an_algorithm_does_not_read_are_errors_that_name_the_field():
    """`--set ssp_lr=...` on dpals-tail used to be accepted and do nothing; a bad bool or a
    truncated number is an error too, naming the field."""
    from fedpriv.run import run

    spec = "synthetic-mf:users=30,items=20,ratings=300,seed=1"
    for algorithm, key, value in (("dpals-tail", "ssp_lr", "0.1"), ("adadpals", "k", "10"), ("als", "mu", "0.5"),
                                  ("am-dpsgd", "ssp_steps", "5"), ("dpsgd", "features", "id"), ("adadpals", "reg_item", "0.2")):
        with pytest.raises(ConfigError, match="does not use") as info:
            run(algorithm, spec, epsilon=1.0, overrides={key: value}, progress=False)
        assert info.value.field == key
    for key, value in (("weighted_reg", "ture"), ("rank", "2.5"), ("steps", "two")):
        with pytest.raises(ConfigError) as info:
            ALSConfig.from_overrides({key: value}, "adadpals")
        assert info.value.field == key
    # the keys each algorithm does read stay accepted
    assert ALSConfig.from_overrides({"k": "10"}, "dpals-uniform").k == 10
    assert ALSConfig.from_overrides({"ssp_lr": "0.2", "mu": "0.25"}, "am-ssp").options.ssp_lr == 0.2
    assert ALSConfig.from_overrides({"sgd_clip": "0.5", "encoder_sgd_lr": "0.1"}, "am-dpsgd").options.sgd_clip == 0.5


def test_dpals_uniform_lives_in_its_own_module():
    """Adding an algorithm is one module plus its registration: no other file of the package
    names dpals-uniform (the engines look it up in the registry)."""
    from pathlib import Path

    import fedpriv

    pkg = Path(fedpriv.__file__).parent
    naming = sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*.py") if "dpals-uniform" in p.read_text())
    assert naming == ["algorithms/dpals_uniform.py"]
    from fedpriv.algorithms import als, registry

    assert "dpals-uniform" in als.ALGORITHMS and registry.get("dpals-uniform").keys == ("k",)


def test_a_new_algorithm_is_one_registration(small_mf):
    """A made-up member of the family (each user keeps its first k ratings) registered from
    here trains, is accounted, and gets its own config keys, with no engine change."""
    from fedpriv.algorithms import registry

    def first_k(shard, state):
        cfg = state.config
        rank = np.arange(shard.n_ratings) - np.repeat(shard.indptr[:-1], np.diff(shard.indptr))
        return np.where(rank < cfg.k, np.sqrt(cfg.beta / cfg.k), 0.0)

    registry.register(registry.AlgorithmSpec("test-first-k", first_k, keys=("k",)))
    try:
        cfg = ALSConfig.from_overrides({"k": "5", "rank": "2", "steps": "1"}, "test-first-k")
        res = train_inprocess("test-first-k", small_mf.interactions, cfg, rating_range=(1, 5), epsilon=2.0, progress=False, secrets=RunSecrets(1))
        assert {r.name for r in res.ledger.releases} == {"mean", "item_stats_A", "item_stats_b"}
        assert np.all(np.isfinite(res.state.item_factors))
        with pytest.raises(ConfigError, match="does not use"):
            ALSConfig.from_overrides({"mu": "0.5"}, "test-first-k")
    finally:
        registry._SPECS.pop("test-first-k")  # noqa: SLF001 - the test's own registration
    with pytest.raises(ConfigError, match="unknown algorithm"):
        registry.get("test-first-k")


class _CountingStep:
    """A made-up kind of alternating step: the family's item-statistics step whose server solve
    is twice as regularised, counting the calls each party makes."""

    def __init__(self):
        from fedpriv.algorithms import steps

        self.inner, self.calls = steps.ITEM_STATS, {"setup": 0, "client": 0, "release": 0, "server": 0}

    def setup(self, state, features):
        self.calls["setup"] += 1
        return self.inner.setup(state, features)

    def client(self, shard, state, step, table=None):
        self.calls["client"] += 1
        return self.inner.client(shard, state, step, table)

    def sums(self, parts, state):
        return self.inner.sums(parts, state)

    def release(self, sums, state, ledger):
        self.calls["release"] += 1
        return self.inner.release(sums, state, ledger)

    def server(self, release, state, server):
        self.calls["server"] += 1
        A, b, g = release
        cfg = state.config
        state.config = dataclasses.replace(cfg, reg_item_private=cfg.reg_item_private * 2.0)
        try:
            self.inner.server((A, b, g), state, server)
        finally:
            state.config = cfg


COUNTING_STEP = _CountingStep()


def test_an_algorithm_brings_its_own_step_and_release_plan(small_mf):
    """The engine runs the spec's own step object (client, aggregator, server) and calibrates the
    spec's own step releases: here b gets 80% of each step's budget instead of the default share."""
    from fedpriv.algorithms import registry
    from fedpriv.algorithms.family import unit_rating_weights
    from fedpriv.privacy.records import PlannedRelease

    def releases(cfg, share):
        return [PlannedRelease("item_stats_b", cfg.steps, 0.8 * share), PlannedRelease("item_stats_A", cfg.steps, 0.2 * share)]

    def weights(shard, state):
        w = unit_rating_weights(shard, state)
        n = np.repeat(np.diff(shard.indptr), np.diff(shard.indptr))
        return w * np.sqrt(state.config.beta / np.maximum(n, 1))  # sum_i w_ij^2 = beta

    registry.register(registry.AlgorithmSpec("test-own-step", weights, step=f"{__name__}:COUNTING_STEP", step_releases=releases))
    try:
        cfg = ALSConfig.from_overrides({"rank": "2", "steps": "3"}, "test-own-step")
        res = train_inprocess("test-own-step", small_mf.interactions, cfg, rating_range=(1, 5), epsilon=2.0, users_per_shard=40, progress=False, secrets=RunSecrets(2))
        shards = -(-small_mf.interactions.n_users // 40)
        assert COUNTING_STEP.calls == {"setup": 1, "client": 3 * shards, "release": 3, "server": 3}
        counts = {}
        for r in res.ledger.releases:
            counts[r.name] = counts.get(r.name, 0) + r.count
        assert counts == {"mean": 1, "item_stats_b": 3, "item_stats_A": 3}
        z = res.state.multipliers
        assert z["item_stats_A"] / z["item_stats_b"] == pytest.approx(2.0, rel=1e-6)  # shares 0.2 vs 0.8: z ~ 1/sqrt(share)
        assert np.all(np.isfinite(res.state.item_factors))
    finally:
        registry._SPECS.pop("test-own-step")  # noqa: SLF001 - the test's own registration


def test_the_config_module_is_light_and_pam_configs_are_strict():
    """Config modules import neither torch nor dp-accounting; pam's keys go through the same
    strict parser (it used to read 'ture' as False and truncate 2.5 to 2)."""
    import subprocess
    import sys

    code = "import sys, fedpriv.algorithms.config; print(sorted(m for m in ('torch', 'dp_accounting') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
    from fedpriv.algorithms.config import PAMConfig

    for key, value in (("epochs", "2.5"), ("schedule", "1"), ("nope", "1")):
        if key == "schedule":
            with pytest.raises(ConfigError, match="schedule"):
                PAMConfig.from_overrides({key: "sometimes"})
            continue
        with pytest.raises(ConfigError) as info:
            PAMConfig.from_overrides({key: value})
        assert info.value.field == key
    assert PAMConfig.from_overrides({"epochs": "3", "ridge": "0.5"}).epochs == 3


def test_releases_declare_their_own_sensitivity():
    """The sensitivity of a release comes from what the release declared (no switch on names):
    a new release name is one registration; an undeclared one is a KeyError naming it; a name
    cannot be declared twice with another bound; the built-ins are declared."""
    from fedpriv.algorithms import als, registry

    assert {"users", "mean", "counts", "bias", "item_stats_A", "item_stats_b", "gravity", "item_stats_H", "item_stats_g", "dpsgd_grad",
            "encoder_grad"} <= set(registry.release_names())
    cfg = ALSConfig(beta=4.0, user_clip=0.5)
    assert als.sensitivity("item_stats_A", cfg, (1.0, 5.0)) == pytest.approx(2.0 * 0.25)

    def bound(c, rr):
        return 3.0 * c.beta

    registry.register_release("test_release", bound)
    try:
        assert als.sensitivity("test_release", cfg, (1.0, 5.0)) == 12.0
        registry.register_release("test_release", bound)  # the same declaration again: fine
        with pytest.raises(ValueError, match="declared twice"):
            registry.register_release("test_release", lambda c, rr: 1.0)
    finally:
        registry._SENSITIVITIES.pop("test_release")  # noqa: SLF001 - the test's own registration
    with pytest.raises(KeyError, match="test_release"):
        als.sensitivity("test_release", cfg, (1.0, 5.0))
