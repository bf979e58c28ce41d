"""The ServerApp's loop under faults, on an in-process grid (tests/fake_grid.py): a job stopped
between rounds resumes from its checkpoint to the same result; a killed node's reply is given up
and logged, and the node rejoins under a new id in the next round."""

import numpy as np
import pytest
from fake_grid import FakeGrid

from fedpriv.algorithms.als import ALSConfig, plan_releases
from fedpriv.data.splits import random_split
from fedpriv.data.synthetic import make_mf
from fedpriv.errors import PrivacyError
from fedpriv.flower.server_app import FlowerJob, JobInterrupted, run_job
from fedpriv.privacy.randomness import RunSecrets


@pytest.fixture(scope="module")
def split():
    syn = make_mf(60, 40, 60 * 20, seed=4)
    return random_split(syn.interactions, seed=1234)


def _job(split, work_dir, algorithm="adadpals", **kw):
    """A job with reproducible noise (seed 7) unless ``secure=True`` (fresh OS randomness)."""
    cfg = ALSConfig(rank=3, steps=3)
    secrets = RunSecrets(None if kw.pop("secure", False) else 7)
    return FlowerJob(algorithm, 4.0, 1e-5, cfg, split.train, split.valid, split.test, (1.0, 5.0), work_dir, users_per_node=6, secrets=secrets, **kw)


def _planned(algorithm, cfg):
    return {p.name: p.count for p in plan_releases(algorithm, cfg, implicit=False)}


@pytest.mark.parametrize("algorithm,stop", [("adadpals", 1), ("adadpals", 2), ("am-dpsgd", 1)])
def test_an_interrupted_job_resumes_to_the_same_result(tmp_path, split, algorithm, stop):
    kw = {}
    if algorithm == "am-dpsgd":  # the encoder family: public item features, a torch server model
        kw["item_features"] = make_mf(60, 40, 60 * 20, seed=4).item_features
    ref = run_job(FakeGrid(10), _job(split, tmp_path / "ref", algorithm, **kw))
    with pytest.raises(JobInterrupted):
        run_job(FakeGrid(10), _job(split, tmp_path / "run", algorithm, interrupt_after=stop, **kw))
    res = run_job(FakeGrid(10), _job(split, tmp_path / "run", algorithm, **kw))  # a new ServerApp, same work dir
    assert res.resumed_from == stop
    assert np.array_equal(res.state.item_factors, ref.state.item_factors)
    if ref.state.encoder_params is not None:
        assert np.array_equal(res.state.encoder_params, ref.state.encoder_params)
    assert res.ledger.to_list() == ref.ledger.to_list()  # nothing lost or counted twice
    assert {r.name: r.count for r in res.ledger.releases} == _planned(algorithm, res.state.config)
    assert res.test_rmse == ref.test_rmse and res.valid_rmse == ref.valid_rmse
    # the resumed job's counters continue the interrupted one's (plus its own info round)
    assert res.rounds == ref.rounds + 1
    steps_run = [r["round"] for r in res.round_log if r["round"].startswith("step")]
    assert steps_run == ["step1", "step2", "step3"]


@pytest.mark.parametrize("secure", [True, False])
def test_a_release_interrupted_is_not_redrawn(tmp_path, split, secure):
    """Secret noise cannot be redrawn identically; a seeded ledger would redraw the very same
    noise, but on a sum that may differ (other nodes reply): both are refused."""
    with pytest.raises(JobInterrupted):
        run_job(FakeGrid(10), _job(split, tmp_path, secure=secure, interrupt_after=1))
    (tmp_path / "release.marker").write_text("1")  # stopped during step 2's release
    with pytest.raises(PrivacyError, match="release twice"):
        run_job(FakeGrid(10), _job(split, tmp_path, secure=secure))


def test_a_checkpoint_of_another_job_is_ignored(tmp_path, split):
    with pytest.raises(JobInterrupted):
        run_job(FakeGrid(10), _job(split, tmp_path, interrupt_after=1))
    other = _job(split, tmp_path)
    other.epsilon = 2.0  # another budget: another job
    res = run_job(FakeGrid(10), other)
    assert res.resumed_from is None


def test_a_killed_node_is_given_up_and_rejoins_next_round(tmp_path, split):
    events = []

    def faults(grid, message_type):
        steps = grid.message_types.count("train")
        if message_type == "train" and steps == 1:
            events.append(("killed", grid.kill(3)))
        if message_type == "get_node_ids" and steps == 1 and len(events) == 1:  # between step 1 and step 2
            events.append(("rejoined", grid.rejoin(3)))

    grid = FakeGrid(10, on_round=faults)
    res = run_job(grid, _job(split, tmp_path / "w"))
    killed, rejoined = events[0][1], events[1][1]
    assert [r["round"] for r in res.rejected] == ["step1"] and res.rejected[0]["node"] == killed
    assert "no reply" in res.rejected[0]["reason"]
    by_round = {r["round"]: r for r in res.round_log}
    assert by_round["step1"]["replies"] == 9
    assert by_round["rejoin"]["replies"] == 1  # the new id was asked for its partition
    assert by_round["step2"]["replies"] == 10 and by_round["step3"]["replies"] == 10
    assert rejoined not in {r["node"] for r in res.rejected}
    assert {r.name: r.count for r in res.ledger.releases} == _planned("adadpals", res.state.config)
    assert np.isfinite(res.test_rmse)
