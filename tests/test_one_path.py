"""One run object behind every entry point (issue 31): the same csv data, with its options,
through ``fedpriv run`` (in-process and ``--engine flower``), ``flwr run .`` (the run-config keys
``data`` and ``data-options``) and the Python API on both engines gives the same epsilon and,
under a noise seed, the same test RMSE; ``--save-model`` works on the Flower engine; a
DataFrame reaches the ``flwr run`` subprocess through the job's work folder; the typed report
round-trips ``metrics.json``; Python errors name keywords and the CLI names flags."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fedpriv
from fedpriv.cli import main
from fedpriv.data.synthetic import make_mf
from fedpriv.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
EPSILON, NOISE_SEED, UPN = 3.0, 7, 15
PARAMS = {"rank": 2, "steps": 2}


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """A csv of string user ids and integer item ids, a rating column named 'stars', and an
    items file that lists two items nobody rated."""
    root = tmp_path_factory.mktemp("one-path")
    syn = make_mf(users=90, items=30, ratings=1800, seed=4).interactions
    users = np.asarray([f"u{u}" for u in syn.users])
    items = np.asarray(syn.item_ids)[syn.items]
    lines = ["uid,iid,stars"] + [f"{u},{i},{r:g}" for u, i, r in zip(users, items, np.clip(np.round(syn.ratings), 1, 5))]
    (root / "ratings.csv").write_text("\n".join(lines) + "\n")
    catalogue = sorted({int(i) for i in syn.item_ids}) + [9001, 9002]
    (root / "items.csv").write_text("item\n" + "\n".join(str(i) for i in catalogue) + "\n")
    options = {"user": "uid", "item": "iid", "rating": "stars", "rating_range": "1,5", "items": str(root / "items.csv")}
    return root, options


def _cli(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


def _cli_args(root: Path, options: dict) -> list[str]:
    args = ["run", "adadpals", "--data", f"csv:{root / 'ratings.csv'}", "--epsilon", str(EPSILON), "--noise-seed", str(NOISE_SEED), "--quiet"]
    for k, v in options.items():
        args += ["--data-opt", f"{k}={v}"]
    for k, v in PARAMS.items():
        args += ["--set", f"{k}={v}"]
    return args


def _superlink_pids(flwr_home: Path) -> list[int]:
    r = subprocess.run(["pgrep", "-f", f"flower-superlink.*{flwr_home}/local-superlink"], capture_output=True, text=True)
    return [int(p) for p in r.stdout.split()]


def _flwr_run_dot(tmp: Path, root: Path, options: dict) -> dict:
    """``flwr run .`` with the csv and its options in the run config (a project-local FLWR_HOME)."""
    from fedpriv.flower.node_policy import POLICY_ENV, NodePolicy

    home, out, seed_file = tmp / "flwr-home", tmp / "flwr-out", tmp / "seed"
    home.mkdir()
    seed_file.write_text(f"{NOISE_SEED}\n")
    # the nodes are the user's: their own policy enables the reproducible noise the run asks for
    # (without it each node refuses the key file the server names: see test_node_policy)
    policy = NodePolicy.for_run(aggregation="central", epsilon=EPSILON, delta=1e-5, nodes=6, reproducible=True).write(tmp / "node-policy.json")
    env = {**os.environ, POLICY_ENV: policy, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", "FLWR_HOME": str(home),
           "FLWR_TELEMETRY_ENABLED": "0", "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"}
    run_config = (f"out='{out}' data='csv:{root / 'ratings.csv'}' data-options='{json.dumps(options)}' epsilon={EPSILON} "
                  f"users-per-node={UPN} set='rank={PARAMS['rank']},steps={PARAMS['steps']}' noise-seed-file='{seed_file}' save-model='{tmp / 'flwr-model'}'")
    try:
        r = subprocess.run(["flwr", "run", ".", "--stream", "--federation-config", "num-supernodes=6", "--run-config", run_config],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    finally:
        for pid in _superlink_pids(home):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while _superlink_pids(home) and time.monotonic() < deadline:
            time.sleep(0.5)
    assert _superlink_pids(home) == []
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.flower  # Flower's engine: scripts/test.sh runs it on the newest Flower
def test_same_csv_through_every_entry_point(table, tmp_path):
    root, options = table
    runs: dict[str, dict] = {}
    code, _, err = _cli([*_cli_args(root, options), "--set", f"users_per_shard={UPN}", "--out", str(tmp_path / "cli-in")])
    assert code == 0, err
    runs["cli inprocess"] = json.loads((tmp_path / "cli-in" / "metrics.json").read_text())
    code, _, err = _cli([*_cli_args(root, options), "--engine", "flower", "--users-per-node", str(UPN), "--out", str(tmp_path / "cli-fl"),
                         "--save-model", str(tmp_path / "model-fl")])
    assert code == 0, err
    runs["cli flower"] = json.loads((tmp_path / "cli-fl" / "metrics.json").read_text())
    runs["flwr run ."] = _flwr_run_dot(tmp_path, root, options)
    data = fedpriv.load_data(f"csv:{root / 'ratings.csv'}", **options)
    api_in = fedpriv.train("adadpals", f"csv:{root / 'ratings.csv'}", epsilon=EPSILON, noise_seed=NOISE_SEED, data_options=options,
                           users_per_shard=UPN, **PARAMS)
    api_fl = fedpriv.train("adadpals", data, epsilon=EPSILON, noise_seed=NOISE_SEED, engine="flower", engine_options={"users_per_node": UPN}, **PARAMS)
    runs["api inprocess"], runs["api flower"] = api_in.metrics, api_fl.metrics

    ref = runs["cli inprocess"]
    assert ref["n_items"] == 32 and ref["engine"] == "inprocess"  # the declared catalogue: 30 rated items and 2 unrated
    for name, m in runs.items():
        assert not m.get("rejected_replies"), (name, m.get("rejected_replies"))
        assert m["n_items"] == ref["n_items"] and m["n_users"] == ref["n_users"], name
        assert m["epsilon_spent"] == pytest.approx(ref["epsilon_spent"], rel=1e-9), name
        assert m["test_rmse"] == pytest.approx(ref["test_rmse"], rel=1e-5), name
        assert m["config"]["rank"] == 2 and m["config"]["steps"] == 2, name
    assert {runs[n]["engine"] for n in ("cli flower", "flwr run .", "api flower")} == {"flower"}
    assert runs["cli flower"]["dataset"] == f"csv:{root / 'ratings.csv'}"  # the user's data is named, not the work folder

    # --save-model on the Flower engine, and the model the API's Flower run brought back: the same release
    saved = fedpriv.load_model(tmp_path / "model-fl")
    assert api_fl.model is not None and api_in.model is not None
    assert np.allclose(saved.state.item_factors, api_in.model.state.item_factors, rtol=1e-4, atol=1e-5)
    assert np.allclose(api_fl.model.state.item_factors, api_in.model.state.item_factors, rtol=1e-4, atol=1e-5)
    flwr_model = fedpriv.load_model(tmp_path / "flwr-model")
    assert np.allclose(flwr_model.state.item_factors, api_in.model.state.item_factors, rtol=1e-4, atol=1e-5)
    assert [str(i) for i in saved.item_ids] == [str(i) for i in api_in.model.item_ids]
    assert saved.info["dataset"] == "csv" and saved.info["engine"] == "flower"  # the public label, not the work folder's kind


@pytest.mark.flower  # Flower's engine: scripts/test.sh runs it on the newest Flower
def test_a_dataframe_reaches_the_flwr_run_subprocess(tmp_path):
    """A DataFrame (string ids, a declared catalogue) is written once to the job's work folder
    and read there by the ServerApp of `flwr run`: same release as in process."""
    import pandas as pd

    rng = np.random.default_rng(3)
    pairs = rng.choice(40 * 20, size=500, replace=False)
    users, items = pairs // 20, pairs % 20
    df = pd.DataFrame({"user": [f"u{u}" for u in users], "item": [f"i{i}" for i in items], "rating": rng.integers(1, 6, 500)})
    catalogue = [f"i{i}" for i in range(22)]
    common = dict(epsilon=4.0, noise_seed=5, data_options={"rating_range": (1, 5), "items": catalogue}, rank=2, steps=1)
    ip = fedpriv.train("adadpals", df, users_per_shard=10, **common)
    fl = fedpriv.train("adadpals", df, engine="flower", engine_options={"users_per_node": 10}, **common)
    assert fl.metrics["engine"] == "flower" and ip.metrics["n_items"] == fl.metrics["n_items"] == 22
    assert fl.ledger == ip.ledger
    assert fl.metrics["test_rmse"] == pytest.approx(ip.metrics["test_rmse"], rel=1e-5)
    assert fl.report.epsilon_spent == pytest.approx(ip.report.epsilon_spent, rel=1e-9)
    assert fl.model is not None and list(fl.model.item_ids) == list(ip.model.item_ids) and sorted(fl.model.item_ids) == sorted(catalogue)


def test_saved_data_round_trip(tmp_path, table):
    """``saved:DIR`` gives back the very data set: ratings, raw ids, catalogue, features, metadata."""
    from fedpriv.data.saved import save_dataset
    from fedpriv.data.spec import load_spec, parse_data_spec

    root, options = table
    ds = fedpriv.load_data(f"csv:{root / 'ratings.csv'}", **options)
    syn = load_spec(parse_data_spec("synthetic-mf:users=30,items=12,ratings=300,seed=1"))
    for original in (ds, syn):
        back = load_spec(parse_data_spec(f"saved:{save_dataset(original, tmp_path / 'd')}"))
        a, b = original.interactions, back.interactions
        for key in ("users", "items", "ratings"):
            assert np.array_equal(getattr(a, key), getattr(b, key))
        assert [str(x) for x in a.user_ids] == [str(x) for x in b.user_ids] and list(a.item_ids) == list(b.item_ids)
        assert (a.n_users, a.n_items, a.meta) == (b.n_users, b.n_items, b.meta)
        assert back.rating_range == original.rating_range and back.implicit == original.implicit
        if original.item_features is not None:
            assert (original.item_features.matrix != back.item_features.matrix).nnz == 0
            assert back.item_features.fields == original.item_features.fields and back.item_features.columns == original.item_features.columns
    with pytest.raises(fedpriv.DataError, match="missing dataset.json"):
        load_spec(parse_data_spec(f"saved:{tmp_path / 'nothing'}"))


def test_job_prepare_trains_nothing_and_the_plan_runs_on_any_engine():
    from fedpriv.run import FlowerSimulation, InProcess, Job, Plan, RunReport
    from fedpriv.run.base import engine_options

    plan = Job("adadpals", "synthetic-mf:users=60,items=20,ratings=1200,seed=2", epsilon=2.0, noise_seed=1, params={"rank": 2, "steps": 1}).prepare()
    assert isinstance(plan, Plan) and plan.n_users == plan.split.train.n_users and plan.partitions(7) == -(-plan.n_users // 7)
    budget = plan.budget()
    assert {p.name for p in budget.planned} >= {"users", "mean", "counts"}
    with pytest.raises(Exception):  # frozen
        plan.protocol = "heldout"  # type: ignore[misc]
    a = plan.execute(InProcess(users_per_shard=10))
    b = plan.execute(InProcess())
    assert isinstance(a.report, RunReport) and a.ledger == b.ledger
    assert a.report.to_json()["config"]["users_per_shard"] == 10
    assert a.report.metrics["test_rmse"] == pytest.approx(b.report.metrics["test_rmse"], rel=1e-6)
    assert "epsilon" in a.report.summary() and "test RMSE" in a.report.summary()
    assert engine_options(FlowerSimulation(users_per_node=5)) == {"users_per_node": 5}


def test_python_errors_name_keywords_and_the_cli_names_flags(tmp_path):
    with pytest.raises(ConfigError, match=r"^epsilon: algorithm 'adadpals' is private"):
        fedpriv.train("adadpals", "synthetic-mf:users=20,items=10,ratings=100")
    with pytest.raises(ConfigError, match=r"^rank: expected int"):
        fedpriv.train("als", "synthetic-mf:users=20,items=10,ratings=100", rank="eight")
    with pytest.raises(ConfigError, match=r"^noise_seed: must be an integer"):
        fedpriv.train("als", "synthetic-mf:users=20,items=10,ratings=100", noise_seed=1.5)
    code, _, err = _cli(["run", "adadpals", "--data", "synthetic-mf:users=20,items=10,ratings=100", "--out", str(tmp_path / "o")])
    assert code == 2 and "--epsilon: algorithm 'adadpals' is private" in err and not (tmp_path / "o").exists()


def test_the_typed_report_round_trips_and_is_frozen():
    from fedpriv.run import RunReport

    m = {"algorithm": "bias", "dataset": "x", "engine": "inprocess", "seed": 0, "epsilon": 1.0, "delta": 1e-5, "private": True, "protocol": "random",
         "n_users": 3, "n_items": 2, "n_ratings": 5, "test_rmse": 0.9, "sliced": [{"bucket": 0, "rmse": 1.0}], "epsilon_spent": 0.99,
         "config": {"rank": 0, "steps": 0, "defaults": "noise-aware", "given": ""}, "wall_seconds": 0.1}
    r = RunReport.from_metrics(m)
    assert r.to_json() == m and list(r.to_json()) == list(m)
    doc = r.to_json()
    doc["sliced"][0]["rmse"] = 5.0  # a copy: the report does not change
    assert r.to_json() == m and r["sliced"] == m["sliced"]
    with pytest.raises(Exception):
        r.algorithm = "als"  # type: ignore[misc]
    text = r.summary(out="runs/x/metrics.json")
    assert "epsilon 0.9900 of 1" in text and "test RMSE 0.9000" in text and "noise-aware" in text and "runs/x/metrics.json" in text


def test_an_experiment_config_takes_csv_with_options(table, tmp_path):
    """[datasets] NAME = { spec = "csv:...", options = { ... } }: the runner loads the file with
    its options (the declared catalogue included) and every run of the grid is a Job."""
    from fedpriv.ops.experiments import runner

    root, options = table
    opts = ", ".join(f'{k} = "{v}"' for k, v in options.items())
    cfg = tmp_path / "mine.toml"
    cfg.write_text(f"""
[experiment]
name = "mine"
title = "My csv"
description = "a csv with options"
kind = "grid"

[datasets]
mine = {{ spec = "csv:{root / 'ratings.csv'}", options = {{ {opts} }} }}

[grid]
datasets = ["mine"]
epsilons = [2]
seeds = 1

[methods.bias]
algorithm = "bias"
""")
    runner.run_configs([str(cfg)], tmp_path / "results", log=lambda s: None)
    rows = list(__import__("csv").DictReader(open(tmp_path / "results" / "mine" / "results.csv")))
    assert len(rows) == 1 and float(rows[0]["epsilon_spent"]) == pytest.approx(2.0, rel=1e-3) and float(rows[0]["test_rmse"]) > 0
    bad = tmp_path / "bad.toml"
    bad.write_text(cfg.read_text().replace(", rating_range = \"1,5\"", ""))
    with pytest.raises(ConfigError, match="datasets.mine.*rating_range"):
        runner.run_configs([str(bad)], tmp_path / "results2", log=lambda s: None)


def test_deploy_partition_takes_csv_with_options(table, tmp_path):
    root, options = table
    args = ["deploy", "partition", "--data", f"csv:{root / 'ratings.csv'}", "--users-per-node", "30", "--out", str(tmp_path / "part")]
    code, _, err = _cli(args)  # no options: the csv needs its rating range (and a catalogue for a private deployment)
    assert code == 2 and "rating_range" in err and not (tmp_path / "part").exists()
    for k, v in options.items():
        args += ["--data-opt", f"{k}={v}"]
    code, out, err = _cli(args)
    assert code == 0, err
    meta = json.loads((tmp_path / "part" / "public" / "meta.json").read_text())
    assert meta["n_items"] == 32 and json.loads(out)["nodes"] == 3


def test_private_tuning_runs_on_the_flower_engine_with_the_same_selection(tmp_path):
    """Private tuning on the Flower engine (the ServerApp logic on an in-memory grid): each run
    is a Flower job scored on the nodes; under a noise seed it selects what the in-process engine
    selects, with identical ledgers. Secure mode refuses to tune on Flower."""
    from fedpriv.testing.local_grid import LocalGrid
    from fedpriv.flower.server_app import run_job
    from fedpriv.run import FlowerCallback, InProcess, Job

    data = "synthetic-mf:users=80,items=30,ratings=2400,seed=8"
    # the in-process engine accounts for the view a Flower node has (every run, K seen): same plan, same selection
    params = {"tune": "reg_item_private=0.5/5/50", "tune_mean": 3, "rank": 2, "steps": 1, "tune_view": "all"}
    plan = Job("adadpals", data, epsilon=4.0, noise_seed=9, params=params).prepare()
    ip = plan.execute(InProcess())
    fl = plan.execute(FlowerCallback(runner=lambda job, n: run_job(LocalGrid(n), job), users_per_node=10, work_dir=tmp_path / "w"))
    assert fl.report.engine == "flower" and ip.report.engine == "inprocess"
    assert fl.ledger == ip.ledger and [r["name"] for r in fl.ledger] == ["tuning"]
    assert fl.report["tuning"]["selected"] == ip.report["tuning"]["selected"]
    assert fl.report["tuning"]["selected_noised_score_sum"] == pytest.approx(ip.report["tuning"]["selected_noised_score_sum"], rel=1e-6)
    assert fl.report.metrics["test_rmse"] == pytest.approx(ip.report.metrics["test_rmse"], rel=1e-5)
    assert fl.report.epsilon_spent == pytest.approx(ip.report.epsilon_spent, rel=1e-9) and fl.report.epsilon_spent <= 4.0 * (1 + 1e-6)
    assert fl.report["wall_seconds"] is None and fl.report["rejected_replies"] == [] and fl.report["nodes"] == 8
    secure = Job("adadpals", data, epsilon=4.0, noise_seed=9, params={**params, "aggregation": "secure"}).prepare()
    with pytest.raises(ConfigError, match="central mode"):
        secure.execute(FlowerCallback(runner=lambda job, n: run_job(LocalGrid(n), job), users_per_node=10))


def test_a_node_sends_no_plaintext_tuning_score_in_secure_mode(tmp_path):
    """Defence in depth: a server that asks a secure-mode node for the tuning score gets an
    error reply, not the node's exact sum."""
    from dataclasses import replace

    from flwr.app import ConfigRecord, Context, Message, RecordDict

    from fedpriv.algorithms.als import ALSConfig, PublicState
    from fedpriv.algorithms.config import Aggregation
    from fedpriv.flower import client_app, codec

    state = PublicState(algorithm="adadpals", config=replace(ALSConfig(), aggregation=Aggregation("secure")), n_items=4, n_users=0, rating_range=(1.0, 5.0), implicit=False)
    content = codec.encode_state(state, str(tmp_path), 1)
    content["tune"] = ConfigRecord({"clip": 4.0})
    msg = Message(content=content, dst_node_id=1, message_type="query.tune_score")
    ctx = Context(run_id=1, node_id=1, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    with pytest.raises(PermissionError, match="secure mode"):
        client_app.tune_score(msg, ctx)


def test_the_one_job_example_runs_and_its_engines_agree():
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "python-api" / "one_job_three_engines.py")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    scores = [line for line in r.stdout.splitlines() if line.startswith("scores")]
    assert len(scores) == 2 and scores[0] == scores[1] and "test RMSE" in scores[0]


@pytest.mark.flower  # Flower's engine: scripts/test.sh runs it on the newest Flower
def test_a_two_key_tuning_grid_goes_through_flwr_run():
    """`--engine flower` tunes with any grid (the run config's `tune` key carries its ';'):
    the same selection and ledger as in process under a noise seed."""
    data = "synthetic-mf:users=60,items=25,ratings=1500,seed=8"
    common = dict(epsilon=4.0, noise_seed=9, tune="reg_item_private=0.5/50;rating_clip=0.5/1", tune_mean=2, rank=2, steps=1, tune_view="all")
    ip = fedpriv.train("adadpals", data, users_per_shard=10, **common)
    fl = fedpriv.train("adadpals", data, engine="flower", engine_options={"users_per_node": 10}, **common)
    assert fl.metrics["engine"] == "flower" and fl.ledger == ip.ledger
    assert fl.metrics["tuning"]["selected"] == ip.metrics["tuning"]["selected"] and set(fl.metrics["tuning"]["grid"]) == {"reg_item_private", "rating_clip"}
    assert fl.metrics["test_rmse"] == pytest.approx(ip.metrics["test_rmse"], rel=1e-5)
