"""The secure-aggregation strategy for any Flower app (fedpriv.flower.secure_strategy): a
FedAvg whose updates are clipped, noised by the nodes and securely summed, accounted by the
ledger; shown on the example app of examples/secure-fedavg (a torch model)."""

import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

from fedpriv.errors import ConfigError, PrivacyError
from fedpriv.testing.local_grid import LocalGrid
from fedpriv.flower.secure_strategy import SecureDPFedAvg, flatten, secure_client_app
from fedpriv.privacy.accounting import RdpAccountant

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "secure-fedavg"


def _toy_app(updates: dict[int, np.ndarray], seen: list):
    """Each node moves the model by its own fixed vector (partition-id picks it)."""

    def train(msg: Message, context: Context) -> Message:
        arrays = msg.content["arrays"]
        w = arrays["w"].numpy() + updates[int(context.node_config["partition-id"])]
        seen.append(sorted(msg.content.config_records))
        return Message(RecordDict({"arrays": ArrayRecord({"w": Array(w)}), "metrics": MetricRecord({"secret": 42.0})}), reply_to=msg)

    return secure_client_app(train)


def test_the_strategy_adds_the_mean_of_clipped_updates_plus_skellam_noise():
    rng = np.random.default_rng(0)
    n, dim = 12, 50
    updates = {p: rng.normal(size=dim) * (3.0 if p % 3 == 0 else 0.2) for p in range(n)}
    seen = []
    strategy = SecureDPFedAvg(clipping_norm=1.0, noise_multiplier=2.0, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n)
    init = ArrayRecord({"w": Array(np.zeros(dim))})
    res = strategy.start(grid=LocalGrid(n, client_app=_toy_app(updates, seen)), initial_arrays=init, num_rounds=2)
    clipped = [u * min(1.0, 1.0 / np.linalg.norm(u)) for u in updates.values()]
    expected = 2 * np.mean(clipped, axis=0)
    got = flatten(res.arrays)
    noise = got - expected
    # two rounds of Skellam noise of std z * C (in model units), divided by n each round
    assert np.std(noise) == pytest.approx(np.sqrt(2) * 2.0 / n, rel=0.35)
    assert [r.mechanism for r in strategy.ledger.releases] == ["skellam"] and strategy.ledger.releases[0].count == 2
    assert strategy.epsilon() == pytest.approx(RdpAccountant().epsilon(strategy.ledger.releases, 1e-5))
    assert strategy.counters.rejected == []
    # the nodes' own metrics never left them; the training message carried the secagg records
    assert all("mask_keys" in s and "secagg" in s for s in seen)


def test_epsilon_calibration_and_validation():
    s = SecureDPFedAvg(clipping_norm=1.0, epsilon=2.0, num_rounds=10)
    assert 0.5 < s.noise_multiplier < 20
    with pytest.raises(ConfigError, match="num_rounds"):
        SecureDPFedAvg(clipping_norm=1.0, epsilon=2.0)
    with pytest.raises(ConfigError, match="exactly one"):
        SecureDPFedAvg(clipping_norm=1.0)
    with pytest.raises(ConfigError, match="clipping_norm"):
        SecureDPFedAvg(clipping_norm=0.0, noise_multiplier=1.0)


def test_the_example_app_trains_a_torch_model_under_secure_aggregation(monkeypatch):
    """examples/secure-fedavg: the plain Flower app's ServerApp and ClientApp, over an in-process
    grid; its model gets better than chance and its epsilon is the calibrated one."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    for mod in [m for m in sys.modules if m.startswith("secure_fedavg")]:
        del sys.modules[mod]
    import tomllib

    from secure_fedavg.client_app import app as client_app
    from secure_fedavg.task import model

    cfg = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    strategy = SecureDPFedAvg(clipping_norm=cfg["clipping-norm"], epsilon=cfg["epsilon"], delta=cfg["delta"], num_rounds=cfg["num-server-rounds"], min_train_nodes=20, min_available_nodes=20, min_evaluate_nodes=20,
                              evaluate_metrics=("eval-loss", "eval-acc"))
    grid = LocalGrid(20, client_app=client_app, run_config=cfg)
    res = strategy.start(grid=grid, initial_arrays=ArrayRecord(model().state_dict()), num_rounds=cfg["num-server-rounds"])
    acc = res.evaluate_metrics_clientapp[cfg["num-server-rounds"]]["eval-acc"]
    assert acc > 0.85  # the classes' Bayes accuracy is about 0.9; chance is 0.5
    assert strategy.epsilon() == pytest.approx(cfg["epsilon"], rel=1e-3)


def _eval_app():
    """Each node reports its own loss (10 + partition id) over 5 + partition id examples."""

    def train(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"arrays": msg.content["arrays"]}), reply_to=msg)

    def evaluate(msg: Message, context: Context) -> Message:
        p = int(context.node_config["partition-id"])
        return Message(RecordDict({"metrics": MetricRecord({"loss": 10.0 + p, "num-examples": 5 + p})}), reply_to=msg)

    return train, evaluate


def test_evaluation_is_a_secure_sum_and_a_node_refuses_plaintext_evaluation():
    """Issue 41: the evaluation replies reached the server in plaintext. Now each evaluate reply
    holds masked words only and the server gets the exact weighted average; a plain FedAvg
    evaluate request (positive control: the bare evaluate function answers it with the node's
    own loss) is refused by a node of secure_client_app."""
    from flwr.app import ConfigRecord
    from flwr.clientapp import ClientApp
    from flwr.serverapp.strategy import FedAvg

    n = 6
    replies: list = []
    train, evaluate = _eval_app()
    observe = lambda nid, rep: replies.append((rep.metadata.message_type, rep))  # noqa: E731
    strategy = SecureDPFedAvg(clipping_norm=1.0, noise_multiplier=1.0, min_train_nodes=n, min_available_nodes=n, min_evaluate_nodes=n, evaluate_metrics=("loss",))
    res = strategy.start(grid=LocalGrid(n, client_app=secure_client_app(train, evaluate), reply_observer=observe), initial_arrays=ArrayRecord({"w": Array(np.zeros(3))}), num_rounds=1)
    want = sum((10.0 + p) * (5 + p) for p in range(n)) / sum(5 + p for p in range(n))
    assert res.evaluate_metrics_clientapp[1]["loss"] == pytest.approx(want, abs=1e-6)
    evals = [rep for kind, rep in replies if kind == "evaluate"]
    assert len(evals) == n and strategy.counters.rejected == []
    for rep in evals:  # masked words only: no metric record, no plaintext number of the node's
        assert not rep.has_error() and list(rep.content.metric_records) == [] and list(rep.content.array_records) == ["masked"]
    # a plaintext evaluation request: FedAvg's own evaluate round
    def plain_round(client_app):
        got = []
        grid = LocalGrid(n, client_app=client_app, reply_observer=lambda nid, rep: got.append(rep))
        msgs = FedAvg(min_evaluate_nodes=n, min_available_nodes=n).configure_evaluate(1, ArrayRecord({"w": Array(np.zeros(3))}), ConfigRecord(), grid)
        grid.send_and_receive(list(msgs))
        return got

    bare = ClientApp()
    bare.evaluate()(evaluate)
    leaked = plain_round(bare)  # positive control: the node's own loss reaches the server
    assert sorted(float(r.content["metrics"]["loss"]) for r in leaked) == [10.0 + p for p in range(n)]
    refused = plain_round(secure_client_app(train, evaluate))
    assert len(refused) == n and all(r.has_error() and "plaintext" in r.error.reason for r in refused)
    # evaluation asked for without naming the metrics: refused before any round
    with pytest.raises(ConfigError, match="evaluate_metrics"):
        SecureDPFedAvg(clipping_norm=1.0, noise_multiplier=1.0).start(grid=LocalGrid(2, client_app=secure_client_app(train, evaluate)), initial_arrays=ArrayRecord({"w": Array(np.zeros(3))}), num_rounds=1)
    with pytest.raises(ConfigError, match="evaluate_metrics"):
        SecureDPFedAvg(clipping_norm=1.0, noise_multiplier=1.0, evaluate_metrics="loss")


@pytest.mark.parametrize("defence", [True, False])
def test_a_node_refuses_a_round_with_too_little_noise_for_its_own_policy(defence):
    """A server that plans its rounds with 1e-6 of the noise (here: a strategy configured so, what
    a deviating server would send) gets nothing from nodes whose own policy says epsilon 2 over
    the run, 12 contributors, 1 colluder: each node checks the plan before it draws its share and
    replies with an error (logged), so the round releases nothing and the run stops. Positive control: with the
    permissive policy (no defence) the same rounds are summed, and the server reads the mean of
    the clipped updates to within 1e-3."""
    from fedpriv.flower.node_policy import NodePolicy

    rng = np.random.default_rng(1)
    n, dim = 12, 20
    updates = {p: rng.normal(size=dim) * 0.1 for p in range(n)}
    policy = NodePolicy(aggregation="secure", max_epsilon=2.0, min_contributors=n, colluders=1) if defence else NodePolicy.permissive()
    strategy = SecureDPFedAvg(clipping_norm=1.0, noise_multiplier=1e-6, fraction_evaluate=0.0, min_train_nodes=n, min_available_nodes=n)
    grid = LocalGrid(n, client_app=_toy_app(updates, []), node_policy=policy)
    init = ArrayRecord({"w": Array(np.zeros(dim))})
    if defence:
        with pytest.raises(PrivacyError, match="0 masked replies.*nothing is released"):
            strategy.start(grid=grid, initial_arrays=init, num_rounds=1)
        assert strategy.ledger.releases == []
        refusals = [r for r in strategy.counters.rejected if "node policy: refused" in str(r)]
        assert len(refusals) == n and all("budget 2" in str(r) for r in refusals)
        return
    res = strategy.start(grid=grid, initial_arrays=init, num_rounds=1)
    expected = np.mean([u * min(1.0, 1.0 / np.linalg.norm(u)) for u in updates.values()], axis=0)
    assert np.max(np.abs(flatten(res.arrays) - expected)) < 1e-3


@pytest.mark.deployment
def test_the_example_runs_with_flwr_and_leaves_nothing_behind(tmp_path):
    """``bash examples/secure-fedavg/run.sh`` (``flwr run`` on the local simulation federation):
    one line per round with epsilon and accuracy, a readable summary, its SuperLink stopped, and
    nothing written to ~/.flwr (a fresh HOME here)."""
    import os
    import shutil
    import subprocess

    pytest.importorskip("ray")
    example = tmp_path / "secure-fedavg"
    shutil.copytree(EXAMPLE, example, ignore=shutil.ignore_patterns(".flwr", "__pycache__"))
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", "NODES": "6"}
    r = subprocess.run(["bash", str(example / "run.sh"), "num-server-rounds=3"], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    lines = [line for line in (r.stdout + r.stderr).splitlines() if "[secure-fedavg] round" in line]
    assert len(lines) == 3 and all("epsilon" in line and "accuracy" in line for line in lines), lines
    assert "epsilon 4.99" in (r.stdout + r.stderr) or "epsilon 5.000" in (r.stdout + r.stderr)
    left = subprocess.run(["pgrep", "-f", f"flower-superlink.*{example}/.flwr"], capture_output=True, text=True).stdout.split()
    assert left == [] and not (home / ".flwr").exists()
