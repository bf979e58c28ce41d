"""Secure aggregation over Flower messages (an in-process grid running the real ClientApp): the
ServerApp learns only the modular sums of masked words, yet releases exactly what the in-process
engine's simulated arithmetic releases for the same seed; dropouts within the plan are
recovered; beyond it nothing is released."""

import numpy as np
import pytest
from fake_grid import FakeGrid

from fedpriv.algorithms.als import ALSConfig
from fedpriv.data.splits import random_split
from fedpriv.data.synthetic import make_mf
from fedpriv.engine.inprocess import train_inprocess
from fedpriv.errors import PrivacyError
from fedpriv.flower.server_app import FlowerJob, run_job
from fedpriv.privacy.randomness import RunSecrets


@pytest.fixture(scope="module")
def split():
    syn = make_mf(60, 40, 60 * 20, seed=4)
    return random_split(syn.interactions, seed=1234)


def _cfg(**kw):
    return ALSConfig.from_overrides({"rank": "3", "steps": "2", "aggregation": "secure", **kw})


def _job(split, work_dir, cfg, seed=7, **kw):
    return FlowerJob("adadpals", 4.0, 1e-5, cfg, split.train, split.valid, split.test, (1.0, 5.0), work_dir, users_per_node=6, secrets=RunSecrets(seed), checkpoint=False, **kw)


def test_flower_secure_rounds_release_what_the_inprocess_engine_releases(tmp_path, split):
    cfg = _cfg()
    seen = []
    grid = FakeGrid(10, observer=lambda nid, msg: seen.append(msg.metadata.message_type))
    res = run_job(grid, _job(split, tmp_path, cfg))
    ref = train_inprocess("adadpals", split.train, cfg, rating_range=(1.0, 5.0), epsilon=4.0, users_per_shard=6, progress=False, secrets=RunSecrets(7))
    np.testing.assert_allclose(res.state.item_factors, ref.state.item_factors, rtol=1e-6, atol=1e-7)
    assert res.ledger.to_list() == ref.ledger.to_list()
    assert {r["mechanism"] for r in res.ledger.to_list()} == {"skellam"}
    # no plain contribution round: only the secure rounds (keys once; share, mask, unmask per release)
    types = set(seen)
    assert not types & {"query.users", "query.mean", "query.counts", "train", "evaluate"}
    releases = 3 + cfg.steps  # users, mean, counts, then one per step
    measurements = 1  # the evaluation's sums: a secure sum without noise, no ledger record
    assert seen.count("query.secagg_keys") == 10
    for t in ("query.secagg_share", "query.secagg_mask", "query.secagg_unmask"):
        assert seen.count(t) == 10 * (releases + measurements)
    assert res.rejected == []


def test_a_node_lost_after_sharing_is_recovered_and_too_many_losses_release_nothing(tmp_path, split):
    cfg = _cfg(secure_dropout="0.2")  # 10 nodes: shares sized for 8
    killed = []

    def kill_once(grid, message_type):
        if message_type == "query.secagg_mask" and not killed:
            killed.append(grid.kill(3))  # gone after it shared its keys: its pairwise masks are recovered

    res = run_job(FakeGrid(10, on_round=kill_once), _job(split, tmp_path / "one", cfg, seed=None))
    assert killed and {r["mechanism"] for r in res.ledger.to_list()} == {"skellam"}
    assert any(r["node"] == killed[0] for r in res.rejected)
    assert np.all(np.isfinite(res.state.item_factors))

    def kill_three(grid, message_type):
        if message_type == "query.secagg_mask" and not killed[1:]:
            killed.extend(grid.kill(p) for p in (3, 4, 5))

    with pytest.raises(PrivacyError, match="fewer than the 8"):
        run_job(FakeGrid(10, on_round=kill_three), _job(split, tmp_path / "three", cfg, seed=None))


def test_a_node_refuses_to_reveal_both_shares_of_a_neighbour(tmp_path, split):
    """A server that asks a node, in the unmask round, for both shares of one neighbour gets an
    error reply; and a node answers one unmask request per release, so asking again (the
    neighbour now listed as dropped, after its self-mask share was given) is refused too."""
    from flwr.app import Array, ArrayRecord, Context, Message, RecordDict

    from fedpriv.flower.client_app import app

    outcomes = []

    def evil_first(grid, nid, msg):
        if msg.metadata.message_type != "query.secagg_unmask" or outcomes:
            return
        survivors = [int(v) for v in msg.content.array_records["lists"]["survivors"].numpy()]
        victim = next(v for v in survivors if v != nid)
        ctx = Context(run_id=1, node_id=nid, node_config={"partition-id": grid.partition[nid], "num-partitions": 10}, state=grid.states[nid], run_config={})

        def ask(alive, gone):
            lists = ArrayRecord({"survivors": Array(np.array(alive, dtype=np.uint64)), "dropped": Array(np.array(gone, dtype=np.uint64))})
            content = RecordDict({"secagg": msg.content.config_records["secagg"], "lists": lists})
            if "signatures" in msg.content.config_records:  # authenticated nodes: the consistency round's signatures
                content["signatures"] = msg.content.config_records["signatures"]
            try:
                app(Message(content=content, dst_node_id=nid, message_type="query.secagg_unmask"), ctx)
                return False
            except Exception:  # noqa: BLE001 - on a SuperNode: an error reply
                return True

        outcomes.append(("both lists", ask(survivors, [victim])))
        outcomes.append(("self shares", ask(survivors, [])))  # the honest request, answered
        outcomes.append(("then the mask key", ask([v for v in survivors if v != victim], [victim])))

    grid = FakeGrid(10)
    grid.observer = lambda nid, msg: evil_first(grid, nid, msg)
    res = run_job(grid, _job(split, tmp_path, _cfg(), seed=3))
    assert outcomes == [("both lists", True), ("self shares", False), ("then the mask key", True)]
    # the server's real request came third: refused and logged; the other neighbours' shares sufficed
    refused = [r for r in res.rejected if r["round"] == "users:unmask"]
    assert len(refused) == 1 and "holds no shares" in refused[0]["reason"]
    assert {r["mechanism"] for r in res.ledger.to_list()} == {"skellam"}


def test_secure_recommendation_histogram_agrees_across_engines(tmp_path):
    """The private recommendation's score histogram (quantile ranges) is a secure sum too: the
    in-process engine and the Flower rounds give the same ledger and the same reports."""
    from fedpriv.testing.local_grid import LocalGrid
    from fedpriv.run import run

    data = "synthetic-mf:users=60,items=30,ratings=1500,seed=2"
    kw = dict(epsilon=5.0, overrides={"aggregation": "secure", "steps": "1", "rank": "3", "users_per_node": "10", "recommend": "mgem", "rec_sensitivity": "quantile"}, progress=False, noise_seed=11, second_opinion=False)
    m_in, led_in = run("adadpals", data, engine="inprocess", **{**kw, "overrides": {**kw["overrides"], "users_per_shard": "10"}})  # shards = the nodes
    m_fl, led_fl = run("adadpals", data, engine="flower", flower_runner=lambda job, n: run_job(LocalGrid(n), job), work_dir=tmp_path, **kw)
    assert led_in == led_fl
    assert ("rec_score_hist", "skellam") in {(r["name"], r["mechanism"]) for r in led_fl}
    assert m_in["recommendation"]["aggregation"] == "secure"
    for key in ("mse_to_best", "hit_rate"):
        assert m_fl["recommendation"][key] == pytest.approx(m_in["recommendation"][key], rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("algorithm,schedule", [("pam", "full"), ("pam", "disjoint"), ("pam-single-model", "full")])
def test_secure_personalization_agrees_across_engines(tmp_path, algorithm, schedule):
    """pam's statistics (initialization, alternating steps, or the single model's) as secure sums:
    the in-process blocks and the Flower nodes release the same model and ledger; the disjoint
    schedule keeps its parallel composition (groups) in secure mode."""
    from fedpriv.testing.local_grid import LocalGrid
    from fedpriv.flower.block_server import run_block_job
    from fedpriv.run import run

    data = "synthetic-personal:users=120,samples=8,d=5,k=2,noise=0.1,seed=1"
    ov = {"aggregation": "secure", **({"schedule": schedule, "epochs": "3"} if algorithm == "pam" else {})}
    kw = dict(epsilon=5.0, progress=False, noise_seed=4, second_opinion=False)
    m_in, led_in = run(algorithm, data, overrides={**ov, "users_per_shard": "30"}, **kw)
    m_fl, led_fl = run(algorithm, data, overrides={**ov, "users_per_node": "30"}, engine="flower", flower_runner=lambda job, n: run_block_job(LocalGrid(n), job), work_dir=tmp_path, **kw)
    assert led_in == led_fl and {r["mechanism"] for r in led_fl} == {"skellam"}
    assert m_fl["test_mse"] == pytest.approx(m_in["test_mse"], rel=1e-9)
    assert m_fl["epsilon_spent"] == pytest.approx(5.0, rel=1e-3)
    if schedule == "disjoint":
        assert {r["groups"] for r in led_fl if r["name"].startswith("am_")} == {3}


def test_pam_exp_refuses_secure_mode():
    from fedpriv.errors import ConfigError
    from fedpriv.run import run

    with pytest.raises(ConfigError, match="aggregation"):
        run("pam-exp", "synthetic-personal:users=40,samples=8,d=4,k=2,noise=0.1,seed=1", epsilon=5.0, overrides={"aggregation": "secure", "net_size": "10"}, progress=False)
