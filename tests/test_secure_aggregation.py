"""Secure aggregation in the in-process engine: every release is a sum of the nodes' quantized,
noised words (fedpriv.algorithms.secure, fedpriv.privacy.distributed); no code after the nodes
sees an exact sum; the privacy loss is the central calibration's."""

import numpy as np
import pytest

from fedpriv.algorithms import secure
from fedpriv.algorithms.als import ALSConfig, plan_releases
from fedpriv.engine.inprocess import ShardTransport, make_shards, new_state
from fedpriv.errors import ConfigError
from fedpriv.algorithms.evaluation import evaluate_rmse
from fedpriv.engine.loop import SecureAggregator, train_rounds
from fedpriv.privacy.accounting import BestOfAccountant, RdpAccountant
from fedpriv.privacy.randomness import RunSecrets

RANGE = (1.0, 5.0)


def _train(small_mf, algorithm, mode, seed=1, steps=2, per_shard=30, **extra):
    from fedpriv.engine.inprocess import train_inprocess

    cfg = ALSConfig.from_overrides({"aggregation": mode, "steps": str(steps), "rank": "3", **extra}, algorithm)
    return train_inprocess(algorithm, small_mf.interactions, cfg, rating_range=RANGE, epsilon=5.0, users_per_shard=per_shard, progress=False, secrets=RunSecrets(seed))


class _NoExactSums(ShardTransport):
    """A transport whose exact-sum paths fail: secure mode must never take them."""

    def vector(self, *a, **k):
        raise AssertionError("secure mode asked for an exact sum")

    def step(self, *a, **k):
        raise AssertionError("secure mode asked for the clients' plain contributions")


@pytest.mark.parametrize("algorithm", ["adadpals", "dpals-uniform", "dpsgd"])
def test_secure_mode_sees_no_exact_sum_and_spends_the_central_epsilon(small_mf, algorithm):
    cfg = ALSConfig.from_overrides({"aggregation": "secure", "steps": "2", "rank": "3"}, algorithm)
    secrets = RunSecrets(4)
    state, ledger = new_state(algorithm, cfg, small_mf.interactions, RANGE, False, 5.0, 1e-5, None, secrets)
    transport = _NoExactSums(make_shards(small_mf.interactions, 40, secrets.client_key()), reproducible=True)
    train_rounds(transport, SecureAggregator(ledger), state)
    assert {r.mechanism for r in ledger.releases} == {"skellam"}
    assert {r.name for r in ledger.releases} == {p.name for p in plan_releases(algorithm, cfg, False)}
    eps = BestOfAccountant().epsilon(ledger.releases, 1e-5)
    assert 4.99 < eps <= 5.0 * (1 + 1e-9)
    assert np.all(np.isfinite(state.item_factors))


def test_secure_and_central_models_are_alike_and_secure_runs_are_reproducible_for_a_seed(small_mf):
    held = small_mf.interactions
    counts = held.item_counts()
    central = [evaluate_rmse(_train(small_mf, "adadpals", "central", seed=s).state, held, held, counts)[0] for s in (1, 2, 3)]
    sec = [evaluate_rmse(_train(small_mf, "adadpals", "secure", seed=s).state, held, held, counts)[0] for s in (1, 2, 3)]
    assert abs(np.mean(sec) - np.mean(central)) < 0.05, (central, sec)
    a, b = _train(small_mf, "adadpals", "secure", seed=7), _train(small_mf, "adadpals", "secure", seed=7)
    np.testing.assert_array_equal(a.state.item_factors, b.state.item_factors)
    c = _train(small_mf, "adadpals", "secure", seed=8)
    assert not np.array_equal(a.state.item_factors, c.state.item_factors)


def test_sampled_releases_are_planned_unsampled_in_secure_mode():
    """No amplification credit for distributed Skellam noise: DP-SGD's gradient release is
    planned (and calibrated) as if every user took part."""
    central = ALSConfig.from_overrides({"aggregation": "central"}, "dpsgd")
    sec = ALSConfig.from_overrides({"aggregation": "secure"}, "dpsgd")
    grad = {p.name: p for p in plan_releases("dpsgd", central, False)}["dpsgd_grad"]
    assert grad.sampling_rate == central.options.sgd_sampling_rate
    assert {p.name: p for p in plan_releases("dpsgd", sec, False)}["dpsgd_grad"].sampling_rate is None


def test_secure_mode_refuses_what_it_cannot_do(small_mf):
    with pytest.raises(ConfigError, match="not private"):
        _train(small_mf, "als", "secure")
    with pytest.raises(ConfigError, match="SSP1"):
        cfg = ALSConfig.from_overrides({"aggregation": "secure"}, "am-ssp1")
        state, _ = new_state("am-ssp1", cfg, small_mf.interactions, RANGE, False, 5.0, 1e-5, None, RunSecrets(1))
        secure.check_secure(state)
    with pytest.raises(ConfigError, match="aggregation"):
        ALSConfig.from_overrides({"aggregation": "trusted"})
    with pytest.raises(ConfigError, match="secure_dropout"):
        ALSConfig.from_overrides({"secure_dropout": "1.5"})


def test_too_many_dropped_nodes_release_nothing(small_mf):
    """A round whose contributors fall below what the shares were sized for is refused before
    anything is unmasked or recorded."""
    cfg = ALSConfig.from_overrides({"aggregation": "secure", "secure_dropout": "0.25", "steps": "1", "rank": "3"}, "adadpals")
    secrets = RunSecrets(5)
    state, ledger = new_state("adadpals", cfg, small_mf.interactions, RANGE, False, 5.0, 1e-5, None, secrets)
    shards = make_shards(small_mf.interactions, 30, secrets.client_key())  # 10 nodes: shares sized for 8

    class Dropping(ShardTransport):
        def secure_sum(self, kind, plan, state, step):
            assert plan.min_contributors == 8
            keep = self.shards
            self.shards = keep[:7]  # three nodes never answer
            try:
                return super().secure_sum(kind, plan, state, step)
            finally:
                self.shards = keep

    from fedpriv.errors import PrivacyError

    with pytest.raises(PrivacyError, match="fewer than the 8"):
        train_rounds(Dropping(shards, reproducible=True), SecureAggregator(ledger, cfg.aggregation.dropout), state)
    assert ledger.releases == []


def test_the_ledger_json_of_a_secure_run_recomputes_its_epsilon(small_mf, tmp_path):
    import json

    from fedpriv.privacy.records import records_from_list

    res = _train(small_mf, "adadpals", "secure", seed=3)
    path = tmp_path / "ledger.json"
    res.ledger.write(path)
    again = records_from_list(json.loads(path.read_text()))
    assert [r.mechanism for r in again] == ["skellam"] * len(again)
    assert RdpAccountant().epsilon(again, 1e-5) == pytest.approx(RdpAccountant().epsilon(res.ledger.releases, 1e-5), rel=1e-12)


def test_the_plan_shows_secure_multipliers():
    from fedpriv.algorithms.plans import budget_plan

    central = budget_plan("dpsgd", ALSConfig.from_overrides({}, "dpsgd"), 5.0, 1e-5)
    sec = budget_plan("dpsgd", ALSConfig.from_overrides({"aggregation": "secure"}, "dpsgd"), 5.0, 1e-5)
    assert sec.multipliers["dpsgd_grad"] > 1.5 * central.multipliers["dpsgd_grad"]  # no amplification credit
    assert any("Secure aggregation" in n for n in sec.notes) and not any("Secure aggregation" in n for n in central.notes)
