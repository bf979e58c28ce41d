"""A node's own privacy policy (fedpriv.flower.node_policy) against a server that deviates: every
deviation of issue 41 item 1 (a, b, c, e) is played against the real ClientApp, with the defence
(the policy the user writes for its nodes) and without it (the permissive policy: the attack
must then succeed, the positive control); honest runs under the policy are unchanged."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import load_script
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fedpriv.algorithms.als import ALSConfig
from fedpriv.data.splits import random_split
from fedpriv.data.synthetic import make_mf
from fedpriv.engine.inprocess import train_inprocess
from fedpriv.errors import ConfigError
from fedpriv.flower import node_policy as np_mod
from fedpriv.flower.node_policy import DEFAULT, LEDGER_KEY, POLICY_ENV, NodePolicy, node_epsilon, node_policy
from fedpriv.flower.server_app import FlowerJob, run_job
from fedpriv.privacy.accounting import epsilon_rdp
from fedpriv.privacy.randomness import RunSecrets
from fedpriv.testing.local_grid import LocalGrid

DATA = "synthetic-mf:users=48,items=30,ratings=1200,seed=3"


@pytest.fixture(scope="module")
def dev():
    return load_script("deviant_server")


@pytest.fixture(scope="module")
def setup(dev, tmp_path_factory):
    return dev.Setup(DATA, nodes=6, epsilon=1.0, work=tmp_path_factory.mktemp("deviant"))


def _ctx(node_config=None, run_config=None):
    return Context(run_id=1, node_id=1, node_config=dict(node_config or {}), state=RecordDict(), run_config=dict(run_config or {}))


# ---------------------------------------------------------------------------- where the policy comes from
def test_policy_comes_from_the_node_config_then_the_policy_file_never_the_run_config(tmp_path, monkeypatch):
    monkeypatch.delenv(POLICY_ENV, raising=False)
    assert node_policy(_ctx()) == DEFAULT
    assert DEFAULT.aggregation == "any" and not DEFAULT.reproducible and DEFAULT.max_epsilon == 10.0 and (DEFAULT.min_contributors, DEFAULT.colluders) == (2, 1)
    # the run config is the server side's: its policy-like keys are ignored
    assert node_policy(_ctx(run_config={"policy-aggregation": "any", "policy-reproducible": True})) == DEFAULT
    strict = NodePolicy.for_run(aggregation="secure", epsilon=1.0, delta=1e-5, nodes=8, dropout=0.25, collusion=1)
    assert (strict.min_contributors, strict.colluders, strict.max_epsilon, strict.reproducible) == (6, 1, 1.0, False)
    monkeypatch.setenv(POLICY_ENV, strict.write(tmp_path / "p.json"))
    assert node_policy(_ctx()) == strict
    # a deployment's --node-config keys come first
    assert node_policy(_ctx(NodePolicy.permissive().node_config_items())) == NodePolicy.permissive()


def test_a_bad_policy_value_is_an_error_naming_its_key(tmp_path, monkeypatch):
    with pytest.raises(ConfigError) as e:
        NodePolicy.from_mapping({"policy-aggregation": "plain"})
    assert e.value.field == "policy-aggregation"
    with pytest.raises(ConfigError) as e:
        NodePolicy.from_mapping({"policy-colluders": 3, "policy-min-contributors": 2})
    assert e.value.field == "policy-colluders"
    with pytest.raises(ConfigError) as e:
        NodePolicy.from_mapping({"policy-max-epsilonn": 1})
    assert e.value.field == "policy-max-epsilonn"
    (tmp_path / "bad.json").write_text("[1]")
    monkeypatch.setenv(POLICY_ENV, str(tmp_path / "bad.json"))
    with pytest.raises(ConfigError) as e:
        node_policy(_ctx())
    assert e.value.field == POLICY_ENV


def test_deploy_writes_the_policy_into_each_supernode_config_and_flower_reads_it_back(tmp_path):
    from flwr.common.config import parse_config_args

    from fedpriv.ops import deploy
    from fedpriv.ops.deploy.config import DeployConfig

    cfg = DeployConfig(run_dir=tmp_path, nodes=3, node_policy={"policy-aggregation": "secure", "policy-max-epsilon": "2"}).validate()
    parsed = parse_config_args([deploy.node_config(cfg, 0)])
    got = node_policy(_ctx(parsed))
    secure = DEFAULT.with_changes(aggregation="secure", relation="replace_one")  # a deployment's default: secure, replace-one, a ledger on disk
    assert got == secure.with_changes(max_epsilon=2.0, ledger=got.ledger) and got.ledger.startswith(str(tmp_path))
    plain = node_policy(_ctx(parse_config_args([deploy.node_config(DeployConfig(run_dir=tmp_path, nodes=3), 1)])))
    assert plain == secure.with_changes(ledger=plain.ledger) and plain.ledger != got.ledger  # each node its own ledger file
    with pytest.raises(ConfigError) as e:
        DeployConfig(run_dir=tmp_path, nodes=3, node_policy={"policy-delta": "2"}).validate()
    assert e.value.field == "policy-delta"


# ---------------------------------------------------------------------------- (a) plaintext handlers
def test_a_plaintext_handler_is_refused_by_a_secure_node_and_answers_without_the_defence(dev, setup):
    on, off = dev.plaintext_handler(setup, True), dev.plaintext_handler(setup, False)
    assert on["recovered"] is False and on["nodes_answered"] == 0 and "secure aggregation" in on["refusals"][0]
    assert off["recovered"] is True and off["exact_item_counts"] is True  # positive control: the exact item counts


@pytest.mark.parametrize("message_type", ["query.users", "query.mean", "query.bias", "train", "evaluate", "query.rec_hist", "query.block"])
def test_every_plaintext_handler_refuses_on_a_secure_node(setup, message_type):
    grid = LocalGrid(2, node_policy=setup.policy(True))
    errors = []
    grid.reply_observer = lambda nid, rep: errors.append(rep.error.reason if rep.has_error() else None)
    grid.send_and_receive([Message(content=setup.content(), dst_node_id=1000, message_type=message_type)])
    assert errors and errors[0] is not None and "node policy: refused plaintext handler" in errors[0]


def test_tune_score_reads_the_mode_from_the_policy_not_from_the_message(setup):
    """A message that says central mode (the server flipped the field) gets no plaintext score
    from a secure node; without the defence it does."""
    import dataclasses

    from fedpriv.flower import codec

    cfg = ALSConfig.from_overrides({"steps": "1"}, "adadpals")  # aggregation = central in the message
    factors = np.random.default_rng(0).normal(size=(setup.state.n_items, cfg.rank))  # a model to score
    central = dataclasses.replace(setup.state, config=cfg, item_factors=factors)

    content = codec.encode_state(central, setup.data_dir, setup.upn)
    content["tune"] = ConfigRecord({"clip": 4.0})
    for policy, refused in ((setup.policy(True), True), (NodePolicy.permissive(), False)):
        grid = LocalGrid(2, node_policy=policy)
        got = []
        grid.reply_observer = lambda nid, rep: got.append(rep)
        grid.send_and_receive([Message(content=content, dst_node_id=1000, message_type="query.tune_score")])
        assert got[0].has_error() == refused, got[0].error.reason if got[0].has_error() else "answered"


# ---------------------------------------------------------------------------- (b) low-noise plans
def test_b_low_noise_plans_are_refused_and_recover_the_count_without_the_defence(dev, setup):
    on, off = dev.low_noise_plan(setup, True), dev.low_noise_plan(setup, False)
    assert on["recovered"] is False
    assert on["z x 1e-6"]["released_count"] is None and on["n_nodes = min_contributors = 10^6"]["released_count"] is None
    assert any("epsilon" in r for r in on["refusals"])
    assert off["recovered"] is True and abs(off["z x 1e-6"]["released_count"] - setup.true_users) < 1e-3
    assert on["honest_noise_std"] > 10  # the honest release hides the count


def _mask_message(setup, plan, kind="users"):
    """The mask-round message of one node (no neighbours: the plan check comes first)."""
    content = setup.content()
    content["secagg"] = ConfigRecord({"label": "x/users/0/1", "bits": plan.bits, "degree": 1, "threshold": 1, "kind": kind, "step": 0, "plan": json.dumps(plan.to_dict())})
    content["mask_keys"] = ConfigRecord({})
    content["ciphertexts"] = ConfigRecord({})
    return content


def _node_reply(setup, policy, plan):
    from fedpriv.flower.client_app import app

    LocalGrid(1)  # Flower's task identity, for Message()
    ctx = Context(run_id=1, node_id=1000, node_config={"partition-id": 0, **policy.node_config_items()}, state=RecordDict(), run_config={})
    msg = Message(content=_mask_message(setup, plan), dst_node_id=1000, message_type="query.secagg_mask")
    try:
        return app(msg, ctx), ctx
    except Exception as exc:  # noqa: BLE001 - the ClientApp raises what a SuperNode turns into an error reply
        return exc, ctx


def test_a_plan_declaring_a_smaller_sensitivity_than_the_node_clips_to_is_refused(setup):
    from fedpriv.privacy import distributed

    honest = setup.users_plan()
    p = honest.parts[0]
    small = distributed.DistributedPlan((distributed.PartPlan(p.name, p.length, p.sensitivity / 100, p.noise_multiplier, p.scale * 100, 0),),
                                        honest.max_users, honest.n_nodes, honest.min_contributors, honest.bits, honest.colluders)
    err, _ = _node_reply(setup, setup.policy(True), small)
    assert isinstance(err, Exception) and "below the bound" in str(err)
    ok, ctx = _node_reply(setup, setup.policy(True), honest)  # the honest plan passes the check (then masks with no neighbour)
    assert "below the bound" not in str(ok) and "node policy" not in str(ok)
    assert json.loads(str(ctx.state.config_records[LEDGER_KEY]["records"]))[0]["name"] == "users"


def test_the_noise_floor_uses_the_nodes_own_contributor_assumption(setup):
    honest = setup.users_plan()
    floor = setup.policy(True).with_changes(min_noise_multiplier=1.0, max_epsilon=None)
    err, _ = _node_reply(setup, floor, setup.users_plan(n_nodes=10**6))
    assert isinstance(err, Exception) and "below this node's floor" in str(err)
    ok, _ = _node_reply(setup, floor, honest)
    assert "node policy" not in str(ok)


# ---------------------------------------------------------------------------- (c) key files
def test_c_a_key_file_named_by_the_server_is_refused_and_reveals_the_count_without_the_defence(dev, setup):
    on, off = dev.key_file(setup, True), dev.key_file(setup, False)
    assert on["recovered"] is False and on["released_count"] is None and "reproducible" in on["refusals"][0]
    assert off["recovered"] is True and off["noise_removed_count"] == pytest.approx(setup.true_users, abs=1e-6)


# ---------------------------------------------------------------------------- (e) repeated sums
def test_e_repeated_sums_stop_at_the_nodes_budget_and_exceed_it_without_the_defence(dev, setup):
    on, off = dev.repeated_sums(setup, True, repeats=4), dev.repeated_sums(setup, False, repeats=4)
    assert on["recovered"] is False and on["sums_obtained"] == 1 and on["epsilon_obtained"] <= 1.0 * (1 + 1e-3)
    assert off["recovered"] is True and off["sums_obtained"] == 4 and off["epsilon_obtained"] > 1.5


def test_at_most_max_secure_sums_noised_sums_per_run(dev, setup):
    server = dev.DeviantServer(setup, True)
    server.grid.node_policy = setup.policy(True).with_changes(max_secure_sums=2, max_epsilon=None)
    got = [server.secure_sum("users", setup.users_plan(), setup.content()) is not None for _ in range(3)]
    assert got == [True, True, False] and any("at most 2 noised secure sums" in r for r in server.refusals())


def test_disjoint_groups_compose_in_parallel_on_the_node_and_a_repeated_group_does_not():
    rec = {"name": "am_A", "delta2": 1e6, "delta1": 1e7, "std": 3e6, "dim": 10, "shares": 4, "colluders": 1, "sum": 1}
    one = node_epsilon([dict(rec, group=None)], 1e-5)
    assert node_epsilon([dict(rec, group=[3, 0]), dict(rec, group=[3, 1]), dict(rec, group=[3, 2])], 1e-5) == pytest.approx(one)
    assert node_epsilon([dict(rec, group=[3, 0]), dict(rec, group=[3, 0])], 1e-5) > one * 1.2
    assert node_epsilon([dict(rec, group=[3, 0]), dict(rec, group=[2, 1])], 1e-5) > one * 1.2  # two partitions: no parallel credit


# ---------------------------------------------------------------------------- honest runs
def test_an_honest_secure_run_is_unchanged_under_the_users_own_policy_and_the_node_sees_its_epsilon(tmp_path):
    syn = make_mf(60, 40, 60 * 20, seed=4)
    split = random_split(syn.interactions, seed=1234)
    cfg = ALSConfig.from_overrides({"rank": "3", "steps": "2", "aggregation": "secure"})
    policy = NodePolicy.for_config(cfg, epsilon=4.0, delta=1e-5, nodes=10, reproducible=True)
    grid = LocalGrid(10, node_policy=policy)
    job = FlowerJob("adadpals", 4.0, 1e-5, cfg, split.train, split.valid, split.test, (1.0, 5.0), tmp_path, users_per_node=6, secrets=RunSecrets(7), checkpoint=False)
    res = run_job(grid, job)
    ref = train_inprocess("adadpals", split.train, cfg, rating_range=(1.0, 5.0), epsilon=4.0, users_per_shard=6, progress=False, secrets=RunSecrets(7))
    assert res.rejected == []
    assert res.ledger.to_list() == ref.ledger.to_list()
    np.testing.assert_allclose(res.state.item_factors, ref.state.item_factors, rtol=1e-6, atol=1e-7)
    for state in grid.states.values():  # every node's own ledger: the run's epsilon, within its budget
        records = json.loads(str(state.config_records[LEDGER_KEY]["records"]))
        assert node_epsilon(records, 1e-5) == pytest.approx(epsilon_rdp(res.ledger, 1e-5), rel=1e-6)
        assert node_epsilon(records, 1e-5) <= 4.0 * (1 + 1e-3)


def test_a_reproducible_run_against_nodes_that_do_not_enable_it_is_refused(tmp_path):
    syn = make_mf(30, 20, 30 * 10, seed=4)
    split = random_split(syn.interactions, seed=1)
    cfg = ALSConfig.from_overrides({"rank": "2", "steps": "1"})  # central mode: the key file is read by train too
    job = FlowerJob("adadpals", 4.0, 1e-5, cfg, split.train, split.valid, split.test, (1.0, 5.0), tmp_path, users_per_node=10, secrets=RunSecrets(7), checkpoint=False)
    grid = LocalGrid(3, node_policy=NodePolicy.for_config(cfg, epsilon=4.0, delta=1e-5, nodes=3, reproducible=False))
    refused = run_job(grid, job).rejected  # every node's train reply is an error: the server leaves it out
    assert refused and all("does not enable reproducible noise" in r["reason"] for r in refused)
    res = run_job(LocalGrid(3, node_policy=NodePolicy.for_config(cfg, epsilon=4.0, delta=1e-5, nodes=3, reproducible=True)), job)
    assert res.rejected == []


# ---------------------------------------------------------------------------- the red team's lines
def test_red_team_server_deviant_prints_a_line_per_deviation_and_its_positive_control(capsys):
    red_team = load_script("red_team")
    code = red_team.main(["--server", "deviant", "--data", DATA, "--nodes", "6", "--epsilon", "1"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    ours = [x for x in lines if x["deviation"] in "abce"]
    assert sorted((x["deviation"], x["defence"]) for x in ours) == sorted((d, f) for d in "abce" for f in (True, False))
    assert all(x["recovered"] is False for x in ours if x["defence"])
    assert all(x["recovered"] is True for x in ours if not x["defence"])
    assert [x["defence"] for x in lines] == sorted((x["defence"] for x in lines), reverse=True)  # defence on first, then the controls
    assert code == 0
    assert math.isfinite(next(x for x in ours if x["deviation"] == "e" and not x["defence"])["epsilon_obtained"])


def test_policy_module_imports_no_server_code():
    src = open(np_mod.__file__).read()
    assert "server_app" not in src and "secure_server" not in src
