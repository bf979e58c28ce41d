"""An algorithm defined entirely in this file: its own config dataclass, one release under a name
of its own with its own sensitivity, its own client, release and server functions. Registering
it is all it takes: the one loop runs it on the in-process engine and on the Flower engine (the
ServerApp's logic over an in-memory grid, the same codec and reply checks as over gRPC), in
central and in secure aggregation, with identical ledgers; the neighbouring-data property test
picks its release up from the plan.

The algorithm ("shrunk item residuals"): each user, weighted w = 1/sqrt(n_ratings) so that the
squared weights sum to 1, adds per item (w, w * clip(r - mean - item_bias, c)); the server moves
each item's bias by s1 / (s0 + ridge). Per user, the L2 norm of the (n_items x 2) contribution is
at most sqrt(1 + c^2): that is the release's declared sensitivity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pytest
from neighbour_data import neighbouring_ml100k, synthetic_ratings

from fedpriv.algorithms import als, registry
from fedpriv.algorithms.config import ALSConfig
from fedpriv.algorithms.family import unit_rating_weights
from fedpriv.algorithms.steps import Part
from fedpriv.errors import ConfigError
from fedpriv.privacy.records import PlannedRelease

NAME = "test-item-shrink"
RELEASE = "test_item_residuals"
DATA = "synthetic-mf:users=90,items=25,ratings=1800,seed=4"


@dataclass
class ShrinkOptions:
    """The algorithm's own keys (``--set clip=... ridge=...``)."""

    clip: float = 1.5  # c: bound on a user's residual per rating
    ridge: float = 4.0  # the server's shrinkage of each item's update

    def validate(self) -> None:
        for name in ("clip", "ridge"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"must be > 0, got {getattr(self, name)}", field=name)


class ShrinkStep:
    """The client, release and server functions of one alternating step."""

    def setup(self, state, features):
        als.server_init(state)  # public random item factors, zero item biases
        return None

    def parts(self, state):
        return [Part(RELEASE, 0, (state.n_items, 2))]

    def client(self, shard, state, step, table=None):
        opts = state.config.options
        n = np.diff(shard.indptr).astype(np.float64)
        w = np.repeat(1.0 / np.sqrt(np.maximum(n, 1.0)), np.diff(shard.indptr))
        y = np.clip(shard.ratings - state.mean - state.item_bias[shard.items], -opts.clip, opts.clip)
        out = np.zeros((state.n_items, 2))
        out[:, 0] = np.bincount(shard.items, weights=w, minlength=state.n_items)
        out[:, 1] = np.bincount(shard.items, weights=w * y, minlength=state.n_items)
        return (out,)

    def sums(self, parts, state):
        return (np.sum([p[0] for p in parts], axis=0) if parts else np.zeros((state.n_items, 2)),)

    def release(self, sums, state, ledger):
        return als.release_gaussian(RELEASE, sums[0], state, ledger)

    def server(self, release, state, server):
        s0, s1 = release[:, 0], release[:, 1]
        state.item_bias = state.item_bias + s1 / (np.maximum(s0, 0.0) + state.config.options.ridge)


def _sensitivity(cfg, rating_range):
    return math.sqrt(1.0 + cfg.options.clip**2)


def _releases(cfg, share):
    return [PlannedRelease(RELEASE, cfg.steps, share)]


@pytest.fixture(scope="module", autouse=True)
def registered():
    registry.register_release(RELEASE, _sensitivity)
    registry.register(registry.AlgorithmSpec(NAME, unit_rating_weights, step=ShrinkStep(), step_releases=_releases, contribution="parts",
                                             options=ShrinkOptions, summary="test: shrunk item residuals"))
    yield
    registry._SPECS.pop(NAME)  # noqa: SLF001 - the test's own registration
    registry._SENSITIVITIES.pop(RELEASE)  # noqa: SLF001


def _flower(tmp_path):
    from fedpriv.flower.server_app import run_job
    from fedpriv.run import FlowerCallback
    from fedpriv.testing.local_grid import LocalGrid

    return FlowerCallback(runner=lambda job, n: run_job(LocalGrid(n), job), users_per_node=15, work_dir=tmp_path)


@pytest.mark.parametrize("aggregation", ["central", "secure"])
def test_the_test_algorithm_runs_on_both_engines_with_identical_ledgers(tmp_path, aggregation):
    from fedpriv.run import InProcess, Job

    params = {"clip": 1.2, "ridge": 3.0, "steps": 2, "rank": 2, "aggregation": aggregation}
    plan = Job(NAME, DATA, epsilon=3.0, noise_seed=5, params=params).prepare()
    assert isinstance(plan.config.options, ShrinkOptions) and plan.config.options.clip == 1.2
    ip = plan.execute(InProcess(users_per_shard=15))  # the same 15 users per node as the Flower run
    fl = plan.execute(_flower(tmp_path / aggregation))
    assert ip.report.engine == "inprocess" and fl.report.engine == "flower"
    assert [r["name"] for r in ip.ledger] == ["mean", RELEASE]  # the plan's releases, nothing else
    own = ip.ledger[1]
    assert own["count"] == 2 and own["dim"] == 25 * 2
    assert own["mechanism"] == ("gaussian" if aggregation == "central" else "skellam")
    if aggregation == "central":  # the declared sensitivity, read from the algorithm's own options
        assert own["sensitivity"] == pytest.approx(math.sqrt(1 + 1.2**2))
    assert fl.ledger == ip.ledger
    assert fl.report.epsilon_spent == pytest.approx(ip.report.epsilon_spent, rel=1e-12) and ip.report.epsilon_spent <= 3.0 * (1 + 1e-6)
    assert fl.report["rejected_replies"] == []
    assert fl.report.metrics["test_rmse"] == pytest.approx(ip.report.metrics["test_rmse"], rel=1e-6)
    if aggregation == "central":
        assert np.allclose(fl.state.item_bias, ip.state.item_bias, rtol=1e-6, atol=1e-9)
        assert np.any(ip.state.item_bias != 0)
    else:  # the secure sum's words quantize: the released sums agree to the quantization step
        assert np.allclose(fl.state.item_bias, ip.state.item_bias, atol=1e-6)


def test_its_options_are_typed_strict_and_travel_with_the_config():
    cfg = ALSConfig.from_overrides({"clip": "0.5", "steps": "1"}, NAME)
    assert cfg.options == ShrinkOptions(clip=0.5, ridge=4.0)
    back = ALSConfig.from_dict(cfg.to_dict(), NAME)
    assert back.options == cfg.options and back.steps == 1
    with pytest.raises(ConfigError) as info:
        ALSConfig.from_overrides({"clip": "-1"}, NAME)
    assert info.value.field == "clip"
    with pytest.raises(ConfigError, match=NAME) as info:  # another algorithm refuses the key, naming its reader
        ALSConfig.from_overrides({"ridge": "2"}, "adadpals")
    assert info.value.field == "ridge"
    assert "options" not in ALSConfig.from_overrides({}, "adadpals").to_dict()  # built-ins' JSON unchanged


def test_an_over_bound_parts_reply_is_rejected():
    from fedpriv.algorithms.shards import UserShard
    from fedpriv.flower import codec

    cfg = ALSConfig.from_overrides({"clip": "1", "steps": "1", "rank": "2"}, NAME)
    state = als.PublicState(NAME, cfg, n_items=3, n_users=10, rating_range=(1.0, 5.0), multipliers={RELEASE: 1.0})
    state.item_bias = np.zeros(3)
    shard = UserShard(np.array([0, 1]), np.array([0, 2, 3]), np.array([0, 1, 2], np.int32), np.array([5.0, 1.0, 3.0], np.float32))
    honest = ShrinkStep().client(shard, state, 0)
    assert np.allclose(codec.decode_parts(codec.encode_parts(honest, state, 2), state, 10)[0], honest[0])
    with pytest.raises(codec.RejectedReply, match="over bound"):
        codec.decode_parts(codec.encode_parts((honest[0] * 10,), state, 2), state, 10)
    with pytest.raises(codec.RejectedReply, match="non-finite"):
        codec.decode_parts(codec.encode_parts((honest[0] * np.nan,), state, 2), state, 10)
    with pytest.raises(codec.RejectedReply, match="malformed"):
        codec.decode_parts(codec.encode_parts((np.zeros((4, 2)),), replace(state, n_items=4), 2), state, 10)


def test_removing_a_renumbered_user_moves_its_release_within_the_declared_sensitivity(tmp_path):
    """The neighbouring-data property (as in test_neighbours.py) on the test algorithm: the
    releases checked are the plan's."""
    from fedpriv.data.splits import random_split
    from fedpriv.engine.inprocess import train_inprocess
    from fedpriv.privacy.neighbours import ReplayLedger, influence
    from fedpriv.privacy.randomness import RunSecrets

    users, items, ratings = synthetic_ratings(60, 30, 900, seed=6)
    ids, counts = np.unique(users, return_counts=True)
    cfg = ALSConfig.from_overrides({"clip": "1", "steps": "2", "rank": "2"}, NAME)
    planned = {p.name for p in als.plan_releases(NAME, cfg, False)}
    assert RELEASE in planned
    worst = 0.0
    for n, user in enumerate((int(ids[np.argmax(counts)]), int(ids[len(ids) // 2]))):
        d, d_prime = neighbouring_ml100k(tmp_path / str(n), users, items, ratings, np.arange(1, 36), user)
        common = dict(rating_range=(1.0, 5.0), epsilon=2.0, progress=False, users_per_shard=16)
        on_d = ReplayLedger()
        train_inprocess(NAME, random_split(d.interactions).train, cfg, secrets=RunSecrets(3), ledger=on_d, **common)
        on_d_prime = ReplayLedger(replay=on_d)
        train_inprocess(NAME, random_split(d_prime.interactions).train, cfg, secrets=RunSecrets(3), ledger=on_d_prime, **common)
        moved = influence(on_d, on_d_prime)
        assert set(moved) == planned
        assert all(ratio <= 1 + 1e-5 for ratio in moved.values()), moved
        worst = max(worst, moved[RELEASE])
    assert worst > 0.05  # the removed users do move it: the check is not vacuous
