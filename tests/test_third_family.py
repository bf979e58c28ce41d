"""Issue 59: a family is one object. A third family, the private per-item mean rating, lives in
tests/toy_family.py (its config, state, rounds and family object) with its registration
(tests/toy_family_node.py, for node processes); nothing in the package names it. It runs on the
in-process engine and on the Flower engines (the ServerApp's logic over an in-memory grid, and
Flower's simulation runtime on Ray) through the package's generic block engines, in central and
secure aggregation, with identical ledgers; its replies are checked against its own bounds."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import toy_family

from fedpriv.algorithms.families import FAMILIES_ENV, families, family_of
from fedpriv.errors import ConfigError

DATA = "synthetic-mf:users=90,items=25,ratings=1800,seed=4"
PACKAGE = Path(__file__).resolve().parents[1] / "fedpriv"


@pytest.fixture
def family():
    with toy_family.registered() as fam:
        yield fam


def _local_flower(tmp_path):
    from fedpriv.flower.server_app import run_job
    from fedpriv.run import FlowerCallback
    from fedpriv.testing.local_grid import LocalGrid

    return FlowerCallback(runner=lambda job, n: run_job(LocalGrid(n), job), users_per_node=15, work_dir=tmp_path)


@pytest.mark.parametrize("aggregation", ["central", "secure"])
def test_the_third_family_runs_on_both_engines_with_identical_ledgers(tmp_path, family, aggregation):
    from fedpriv.run import InProcess, Job

    plan = Job(toy_family.NAME, DATA, epsilon=2.0, noise_seed=5, params={"aggregation": aggregation}).prepare()
    assert plan.family is family and family_of(toy_family.NAME) is family
    ip = plan.execute(InProcess(users_per_shard=15), second_opinion=False)
    fl = plan.execute(_local_flower(tmp_path / aggregation), second_opinion=False)
    assert ip.report.engine == "inprocess" and fl.report.engine == "flower"
    assert ip.ledger == fl.ledger and [r["name"] for r in ip.ledger] == [toy_family.RELEASE]
    assert {r["mechanism"] for r in ip.ledger} == {"gaussian" if aggregation == "central" else "skellam"}
    assert ip.report.epsilon_spent == pytest.approx(2.0, rel=1e-3)
    assert np.allclose(ip.state.means, fl.state.means, rtol=1e-9, atol=1e-9)
    assert fl.report.get("train_rmse") == pytest.approx(ip.report.get("train_rmse"), rel=1e-9)
    # the release means something: close to the exact item means at a large epsilon
    big = Job(toy_family.NAME, DATA, epsilon=1e4, noise_seed=5).prepare().execute(second_opinion=False)
    exact = plan.dataset.test_means
    assert np.abs(big.state.means - exact).mean() < 0.5 * np.abs(ip.state.means - exact).mean() + 1e-3


def test_the_third_family_runs_on_flowers_simulation_runtime(tmp_path, family, monkeypatch):
    """The nodes are Ray workers: each serves the family its operator named (FEDPRIV_FAMILIES)."""
    from fedpriv.run import FlowerSimulation, InProcess, Job

    monkeypatch.setenv(FAMILIES_ENV, "toy_family_node")
    plan = Job(toy_family.NAME, DATA, epsilon=2.0, noise_seed=5).prepare()
    ip = plan.execute(InProcess(users_per_shard=30), second_opinion=False)
    fl = plan.execute(FlowerSimulation(users_per_node=30, work_dir=tmp_path), second_opinion=False)
    assert fl.report.engine == "flower" and fl.report.get("nodes") == 3
    assert fl.ledger == ip.ledger and np.allclose(ip.state.means, fl.state.means, rtol=1e-9, atol=1e-9)


def test_an_over_bound_reply_of_the_third_family_is_rejected(tmp_path, family):
    """A node whose reply exceeds the family's declared per-user bound is rejected and logged,
    never summed; the positive control: the same node within the bound is summed."""
    from fedpriv.flower import block_client
    from fedpriv.run import Job

    plan = Job(toy_family.NAME, DATA, epsilon=2.0, noise_seed=5).prepare()
    real = toy_family.ItemMeanFamily.client_round

    def inflated(self, kind, block, state):
        (v,) = real(self, kind, block, state)
        return (v * (1.0 if 0 in block.user_ids else 50.0),)  # every node but the first cheats

    flower = _local_flower(tmp_path / "bad")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(toy_family.ItemMeanFamily, "client_round", inflated)
        bad = plan.execute(flower, second_opinion=False)
    rejected = bad.report.get("rejected_replies")
    assert len(rejected) == 5 and all("over bound" in r["reason"] for r in rejected), rejected
    good = plan.execute(_local_flower(tmp_path / "good"), second_opinion=False)
    assert good.report.get("rejected_replies") == [] and block_client is not None


def test_the_package_knows_nothing_of_the_third_family(family):
    """No file of the package names it; it leaves the catalogue with its test; a config key it
    does not read is refused by its own parser."""
    text = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    assert toy_family.NAME not in text and "toy_family" not in text
    from fedpriv.run import Job

    with pytest.raises(ConfigError, match="unknown key"):
        Job(toy_family.NAME, DATA, epsilon=2.0, params={"rank": 3}).prepare()


def test_the_catalogue_forgets_a_family_after_its_test():
    assert all(f is not toy_family.FAMILY for f in families())
    with pytest.raises(ConfigError, match="unknown algorithm"):
        family_of(toy_family.NAME)
