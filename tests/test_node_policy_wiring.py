"""The node policy where fedpriv sets the nodes up (issue 57, items 5 and 6): a deployment's
nodes default to a secure policy with a ledger on their own disk; a secure job refuses to start
on nodes whose own policy is not secure; the nodes fedpriv starts keep a file ledger in the
run's folder (one for all the candidates of a private tuning)."""

from __future__ import annotations

from pathlib import Path

import pytest
from flwr.app import Context, Message, RecordDict

from fedpriv.algorithms.als import ALSConfig
from fedpriv.data.splits import random_split
from fedpriv.data.synthetic import make_mf
from fedpriv.errors import ConfigError
from fedpriv.flower.node_policy import NodePolicy
from fedpriv.flower.server_app import FlowerJob, run_job
from fedpriv.privacy.randomness import RunSecrets
from fedpriv.testing.local_grid import LocalGrid

NODES = 4


def _node_policy_of(cfg, i: int) -> NodePolicy:
    from flwr.common.config import parse_config_args

    from fedpriv.ops import deploy

    parsed = parse_config_args([deploy.node_config(cfg, i)])
    return NodePolicy.from_mapping({k: v for k, v in parsed.items() if k.startswith("policy-")})


# ---------------------------------------------------------------------------- (a) the deployment's default
def test_deploy_prepare_writes_a_secure_replace_one_policy_with_a_ledger_in_each_nodes_folder(tmp_path):
    from fedpriv.ops.deploy.cli import deploy_main
    from fedpriv.ops.deploy.config import DeployConfig

    run_dir = tmp_path / "dep"
    assert deploy_main(["prepare", "--run-dir", str(run_dir), "--nodes", "3", "--no-auth"]) in (0, None)
    cfg = DeployConfig.load(run_dir)
    for i in range(3):
        policy = _node_policy_of(cfg, i)
        assert (policy.aggregation, policy.relation) == ("secure", "replace_one")
        ledger = Path(policy.ledger)
        assert ledger.parent == cfg.node_data_dir(i) and ledger.is_relative_to(run_dir)
    # an operator's explicit overrides are kept
    over = DeployConfig(run_dir=run_dir, nodes=2, node_policy={"policy-max-epsilon": "2", "policy-ledger": "/srv/node/ledger.json"}).validate()
    p = _node_policy_of(over, 1)
    assert (p.aggregation, p.relation, p.max_epsilon, p.ledger) == ("secure", "replace_one", 2.0, "/srv/node/ledger.json")
    # `deploy run` defaults to secure aggregation too
    from fedpriv.ops.deploy.job import run_deployed_job
    import inspect

    assert inspect.signature(run_deployed_job).parameters["aggregation"].default == "secure"


# ---------------------------------------------------------------------------- (b, c) a secure job on non-secure nodes
@pytest.fixture(scope="module")
def split():
    syn = make_mf(24, 16, 24 * 10, seed=4)
    return random_split(syn.interactions, seed=1234)


def _job(split, work_dir, aggregation="secure"):
    cfg = ALSConfig.from_overrides({"rank": "2", "steps": "1", "aggregation": aggregation})
    return cfg, FlowerJob("adadpals", 4.0, 1e-5, cfg, split.train, split.valid, split.test, (1.0, 5.0), work_dir, users_per_node=6,
                          secrets=RunSecrets(7), checkpoint=False)


def _release_types(seen):
    return [t for t in seen if t not in ("query.info",)]


def test_a_secure_job_refuses_to_start_on_nodes_whose_policy_is_not_secure(tmp_path, split):
    cfg, job = _job(split, tmp_path / "w")
    seen = []
    grid = LocalGrid(NODES, node_policy=NodePolicy.for_run(aggregation="central", epsilon=4.0, delta=1e-5, nodes=NODES, reproducible=True),
                     observer=lambda nid, msg: seen.append(msg.metadata.message_type))
    with pytest.raises(ConfigError) as e:
        run_job(grid, job)
    msg = str(e.value)
    assert "refused to start a secure-aggregation job" in msg and e.value.field == "policy-aggregation"
    for p in range(NODES):
        assert f"partition {p} (node {1000 + p}): policy mode 'any'" in msg
    assert _release_types(seen) == []  # nothing but the info round: no key, share, mask or plaintext round


def test_the_same_secure_job_runs_on_secure_nodes_and_the_check_is_what_refused(tmp_path, split):
    cfg, job = _job(split, tmp_path / "w")
    secure = NodePolicy.for_run(aggregation="secure", epsilon=4.0, delta=1e-5, nodes=NODES, reproducible=True)
    res = run_job(LocalGrid(NODES, node_policy=secure), job)
    assert res.rejected == [] and len(res.ledger.to_list()) > 0
    # positive control: with the start-of-job check skipped, the non-secure nodes' job goes on
    # to release (so the refusal above was the check's, not a later failure)
    from fedpriv.flower import server_app

    _, job2 = _job(split, tmp_path / "w2")
    central_nodes = LocalGrid(NODES, node_policy=NodePolicy.for_run(aggregation="central", epsilon=4.0, delta=1e-5, nodes=NODES, reproducible=True))
    original = server_app._Nodes.require_secure
    server_app._Nodes.require_secure = lambda self: None
    try:
        res2 = run_job(central_nodes, job2)
    finally:
        server_app._Nodes.require_secure = original
    assert len(res2.ledger.to_list()) > 0


def test_an_older_node_that_reports_no_mode_counts_as_not_secure_and_central_jobs_are_unchanged(tmp_path, split):
    from fedpriv.flower.client_app import app

    def old_node(msg, ctx):  # a node of an older fedpriv: its info reply is the partition id only
        reply = app(msg, ctx)
        if msg.metadata.message_type == "query.info" and not reply.has_error():
            for key in ("policy_mode", "policy_ledger", "identity"):
                del reply.content.config_records["meta"][key]
        return reply

    secure = NodePolicy.for_run(aggregation="secure", epsilon=4.0, delta=1e-5, nodes=NODES, reproducible=True)
    with pytest.raises(ConfigError, match="no policy mode reported"):
        run_job(LocalGrid(NODES, client_app=old_node, node_policy=secure), _job(split, tmp_path / "w")[1])
    # central: no check (the nodes' mode is theirs to choose; central trusts the server)
    _, central = _job(split, tmp_path / "c", aggregation="central")
    res = run_job(LocalGrid(NODES, client_app=old_node, node_policy=NodePolicy.for_run(aggregation="central", epsilon=4.0, delta=1e-5, nodes=NODES, reproducible=True)), central)
    assert res.rejected == []


def test_the_info_reply_carries_the_nodes_configuration_not_data(tmp_path):
    from fedpriv.flower.client_app import info

    LocalGrid(1)  # Flower's task identity, for Message()
    ledger = str(tmp_path / "l-{partition}.json")
    policy = NodePolicy.for_run(aggregation="secure", epsilon=1.0, delta=1e-5, nodes=3, ledger=ledger)
    ctx = Context(run_id=1, node_id=1, node_config={"partition-id": 2, **policy.node_config_items()}, state=RecordDict(), run_config={})
    rep = info(Message(RecordDict(), dst_node_id=1, message_type="query.info"), ctx)
    assert dict(rep.content.config_records["meta"]) == {"partition_id": 2, "policy_mode": "secure", "policy_ledger": True, "identity": False}
    bad = Context(run_id=1, node_id=1, node_config={"partition-id": 0, "policy-aggregation": "plain"}, state=RecordDict(), run_config={})
    assert info(Message(RecordDict(), dst_node_id=1, message_type="query.info"), bad).content.config_records["meta"]["policy_mode"] == "invalid"


# ---------------------------------------------------------------------------- (d) the nodes fedpriv starts
def test_the_simulation_policy_has_a_file_ledger_in_the_runs_folder_and_a_tuning_shares_one(tmp_path, split):
    from fedpriv.algorithms.recommend import RecommendConfig
    from fedpriv.flower.simulation import node_policy_for, shared_node_ledger

    _, job = _job(split, tmp_path / "w")
    policy = node_policy_for(job, NODES)
    assert policy.aggregation == "secure" and policy.ledger == str((tmp_path / "w").resolve() / "node-ledger" / "node-{partition}.json")
    job.recommend = RecommendConfig(epsilon=3.0)
    assert node_policy_for(job, NODES).max_recommend_epsilon == 3.0
    with shared_node_ledger(tmp_path / "tuning-ledger"):
        assert node_policy_for(job, NODES).ledger == str((tmp_path / "tuning-ledger").resolve() / "node-{partition}.json")
    assert node_policy_for(job, NODES).ledger.startswith(str((tmp_path / "w").resolve()))


def test_the_launcher_policy_file_has_a_file_ledger_in_the_runs_folder(tmp_path):
    import json

    from fedpriv.ops.launcher import node_policy_file
    from fedpriv.run import Job

    plan = Job("adadpals", "synthetic-mf:users=24,items=16,ratings=240,seed=3", epsilon=2.0,
               params={"aggregation": "secure", "rank": 2, "steps": 1}).prepare()
    path = node_policy_file(plan, tmp_path, nodes=NODES)
    policy = NodePolicy.from_mapping(json.loads(Path(path).read_text()))
    assert Path(path).parent == tmp_path
    assert policy.aggregation == "secure" and policy.ledger == str(tmp_path / "node-ledger" / "node-{partition}.json")


def test_flower_tuning_candidates_share_one_node_ledger_folder(tmp_path, monkeypatch):
    from fedpriv.flower import simulation
    from fedpriv.run.flower_engines import FlowerCallback
    from fedpriv.run.inputs import RunOptions

    folders = []

    def runner(job, n):
        folders.append(simulation.node_policy_for(job, n).ledger)
        raise _Stop

    class _Stop(Exception):
        pass

    plan = _TinyPlan()
    engine = FlowerCallback(runner=runner, work_dir=str(tmp_path / "tune"))
    candidates = engine.tuning_candidates(plan, RunOptions(nodes=NODES, users_per_node=6))
    candidate, cleanup = candidates.run, candidates.cleanup
    for r in range(3):
        with pytest.raises(_Stop):
            candidate(ALSConfig.from_overrides({"rank": "2", "steps": "1"}), {}, RunSecrets(r), 1.0, r)
    assert len(set(folders)) == 1 and Path(folders[0]).parent.parent == (tmp_path / "tune").resolve()
    cleanup()
    assert not Path(folders[0]).parent.exists()


class _TinyPlan:
    """What tuning_candidates reads of a plan."""

    def __init__(self):
        syn = make_mf(24, 16, 24 * 10, seed=4)
        self.split = random_split(syn.interactions, seed=1234)
        self.algorithm, self.rating_range, self.implicit, self.public, self.n_users = "adadpals", (1.0, 5.0), False, None, 24
        self.job = type("J", (), {"epsilon": 4.0, "delta": 1e-5, "relation": "add_remove"})()
        self.dataset = type("D", (), {"item_features": None})()
        self.config = ALSConfig.from_overrides({"rank": "2", "steps": "1"})


def test_a_central_job_refuses_to_start_on_secure_nodes_with_a_clear_error(tmp_path, split):
    """A deployment's nodes are secure by default: a central job on them stops before any release
    with an error naming the nodes and the way out, instead of every plaintext reply being
    refused. Positive control: with the check skipped the job goes on and its nodes refuse
    every plaintext round."""
    from fedpriv.flower import server_app

    secure = NodePolicy.for_run(aggregation="secure", epsilon=4.0, delta=1e-5, nodes=NODES, reproducible=True)
    seen = []
    grid = LocalGrid(NODES, node_policy=secure, observer=lambda nid, msg: seen.append(msg.metadata.message_type))
    with pytest.raises(ConfigError, match="refused to start a central-aggregation job.*policy-aggregation=central") as e:
        run_job(grid, _job(split, tmp_path / "w", aggregation="central")[1])
    assert e.value.field == "aggregation" and _release_types(seen) == []
    original = server_app._Nodes.require_plaintext
    server_app._Nodes.require_plaintext = lambda self: None
    try:
        res = run_job(LocalGrid(NODES, node_policy=secure), _job(split, tmp_path / "w2", aggregation="central")[1])
    finally:
        server_app._Nodes.require_plaintext = original
    assert res.rejected and all("[plaintext-handler]" in str(r) for r in res.rejected)  # every plaintext reply refused
