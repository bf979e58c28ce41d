"""DP model personalization through the one training loop (fedpriv.engine.loop.train_rounds):
pam and pam-single-model on the in-process and the Flower engine, central and secure, release
the same model with identical ledgers; both engines print progress lines; --save-model writes a
personalization model whose shared embedding a user personalizes locally."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedpriv.algorithms import pam
from fedpriv.engine import loop

DATA = "synthetic-personal:users=120,samples=8,d=5,k=2,noise=0.1,seed=1"


def _flower(tmp_path):
    from fedpriv.flower.block_server import run_block_job
    from fedpriv.run import FlowerCallback
    from fedpriv.testing.local_grid import LocalGrid

    return FlowerCallback(runner=lambda job, n: run_block_job(LocalGrid(n), job), users_per_node=30, work_dir=tmp_path)


@pytest.mark.parametrize("aggregation", ["central", "secure"])
@pytest.mark.parametrize("algorithm", ["pam", "pam-single-model"])
def test_pam_runs_through_the_shared_loop_on_both_engines(tmp_path, monkeypatch, algorithm, aggregation):
    from fedpriv.run import InProcess, Job

    calls = []
    real = loop.train_rounds
    monkeypatch.setattr(loop, "train_rounds", lambda *a, **k: calls.append(type(a[0]).__name__) or real(*a, **k))
    import fedpriv.engine.blocks as personal
    import fedpriv.flower.block_server as pam_server

    monkeypatch.setattr(personal, "train_rounds", loop.train_rounds)
    monkeypatch.setattr(pam_server, "train_rounds", loop.train_rounds)
    # users_per_node means the same on both engines: 4 nodes of 30 users (in process: 4 shards)
    params = {"aggregation": aggregation, "users_per_node": 30, **({"epochs": 3} if algorithm == "pam" else {})}
    plan = Job(algorithm, DATA, epsilon=4.0, noise_seed=6, params=params).prepare()
    ip = plan.execute(InProcess())
    fl = plan.execute(_flower(tmp_path))
    assert calls == ["BlockTransport", "_GridBlockTransport"]  # both engines went through the one loop
    assert fl.ledger == ip.ledger and ip.ledger
    assert {r["mechanism"] for r in ip.ledger} == {"gaussian" if aggregation == "central" else "skellam"}
    assert ip.report.epsilon_spent <= 4.0 * (1 + 1e-6)
    assert fl.report.metrics["test_mse"] == pytest.approx(ip.report.metrics["test_mse"], rel=1e-9)
    a, b = (ip.model.U, fl.model.U) if algorithm == "pam" else (ip.model.theta, fl.model.theta)
    assert a is not None and np.allclose(a, b, rtol=1e-9, atol=1e-12)


def test_pam_prints_progress_lines_on_both_engines(tmp_path, capsys):
    from fedpriv.run import InProcess, Job

    plan = Job("pam", DATA, epsilon=4.0, noise_seed=6, params={"epochs": 3}).prepare()
    plan.execute(_flower(tmp_path), progress=True)
    out = capsys.readouterr().out
    rounds = [line for line in out.splitlines() if line.startswith("[fedpriv] round")]
    assert [line.split()[2] for line in rounds] == ["info", "init", "step1", "step2", "step3", "evaluate"], out
    assert "epsilon" in rounds[-1] and "test MSE" in out
    plan.execute(InProcess(), progress=True)  # tqdm's bar over the steps, on stderr
    assert "pam" in capsys.readouterr().err


def test_save_model_writes_a_personalization_model(tmp_path, capsys):
    from fedpriv import load_model
    from fedpriv.cli import main
    from fedpriv.data.personal import make_personal

    out, model_dir = tmp_path / "out", tmp_path / "model"
    assert main(["run", "pam", "--data", DATA, "--epsilon", "4", "--noise-seed", "3", "--set", "epochs=3", "--out", str(out), "--save-model", str(model_dir), "--quiet"]) == 0
    model = load_model(model_dir)
    assert model.algorithm == "pam" and model.U.shape == (5, 2) and np.allclose(model.U.T @ model.U, np.eye(2), atol=1e-8)
    assert json.loads((model_dir / "ledger.json").read_text()) == json.loads((out / "ledger.json").read_text())
    assert model.epsilon_spent == pytest.approx(json.loads((out / "metrics.json").read_text())["epsilon_spent"])
    saved = json.loads((model_dir / "model.json").read_text())
    assert "test_mse" not in json.dumps(saved) and "synthetic-personal:" not in json.dumps(saved)  # no metric, no data spec
    # a user personalizes on their own samples: the prediction error is near the data's noise
    data = make_personal(120, 8, 5, 2, 0.1, seed=1)
    v = model.personalize(data.X[0], data.y[0])
    assert v.shape == (2,)
    residual = model.predict(data.X[0], v) - data.y[0]
    assert np.sqrt(np.mean(residual**2)) < np.sqrt(np.mean(data.y[0] ** 2))
    # the recommend command explains that this model has no items
    assert main(["recommend", "--model", str(model_dir), "--ratings", str(tmp_path / "none.csv")]) == 2
    assert "personalization model" in capsys.readouterr().err
    # pam-own-data releases nothing shared: --save-model is refused before anything is written
    assert main(["run", "pam-own-data", "--data", DATA, "--out", str(tmp_path / "o2"), "--save-model", str(tmp_path / "m2"), "--quiet"]) == 2
    assert not (tmp_path / "m2").exists()


def test_the_personal_family_declares_its_rounds():
    """What the loop drives: the private initialization, then one round per epoch (full) or per
    disjoint group; pam-single-model one step; the secure parts carry their sensitivities."""
    from fedpriv.algorithms.config import PAMConfig

    for schedule, groups in (("full", [None, None, None]), ("disjoint", [0, 1, 2])):
        state, _ = pam.new_pam_state("pam", PAMConfig(epochs=3, schedule=schedule), 5, 2, 8, 2.0, 1e-6)
        fam = pam.PERSONAL
        assert list(fam.setup_kinds(state)) == ["pam_init"] and fam.n_steps(state) == 3
        assert [fam.group(state, t) for t in range(3)] == groups
        assert [(n, w) for n, w, *_ in fam.secure_parts("pam_step", state)] == [("am_A", 55), ("am_b", 10)]
    single, _ = pam.new_pam_state("pam-single-model", PAMConfig(), 5, 2, 8, 2.0, 1e-6)
    assert list(pam.PERSONAL.setup_kinds(single)) == [] and pam.PERSONAL.n_steps(single) == 1
