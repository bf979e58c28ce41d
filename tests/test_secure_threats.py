"""Secure mode against its own parties (issue 30): the server reads no per-node value in
plaintext, the noise holds against nodes that know their own shares, nodes enforce their Shamir
threshold, and exact (noiseless) sums are refused for anything but aggregate measurements."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from conftest import load_script
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fedpriv.algorithms.config import ALSConfig
from fedpriv.errors import ConfigError, PrivacyError
from fedpriv.privacy import distributed as dn
from fedpriv.privacy.accounting import epsilon_rdp, epsilon_vs_colluders
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.privacy.secagg import SecAggError, SecAggNode, SecAggServer, plan_params

SEED = bytes(range(32))


def _plan(n_nodes=5, colluders=1, dropout_nodes=0, z=1.5):
    return dn.plan_round([("b", 40, 1.0, z), ("A", 60, 2.0, z)], max_users=50, n_nodes=n_nodes, min_contributors=n_nodes - dropout_nodes, colluders=colluders)


# ---------------------------------------------------------------------------- collusion
@pytest.mark.parametrize("n, c", [(2, 1), (3, 1), (5, 2), (20, 1)])
def test_the_noise_left_after_removing_the_colluders_shares_meets_the_calibration(n, c):
    plan = _plan(n_nodes=n, colluders=c)
    for p in plan.parts:
        # any c of the n shares known: the other n - c carry at least the planned variance
        assert (n - c) * plan.share_variance(p) == pytest.approx(p.std**2, rel=1e-12)
        assert dn.released_std(plan, p, n) == pytest.approx(p.std, rel=1e-12)
    # measured: n nodes' shares summed, minus c of them, has the planned std
    p = plan.part("A")
    rng = np.random.default_rng(3)
    shares = [dn.skellam_share(rng, plan.share_variance(p), 20000, name="A") for _ in range(n)]
    left = np.sum(shares[c:], axis=0)
    assert np.std(left) == pytest.approx(p.std, rel=0.03)


def test_no_collusion_sizing_is_what_the_reviewer_measured_against_one_node():
    """With shares sized for the server only (colluders=0), a node that subtracts its own share
    faces (m-1)/m of the variance: epsilon 1 becomes about 1.46 against it at m = 2 nodes."""
    plan0 = dn.plan_round([("s", 1, 1.0, 1.0)], max_users=2, n_nodes=2, colluders=0)
    ledger = PrivacyLedger(seed=1)
    ledger.skellam_round(plan0, lambda: {"s": np.zeros(1)}, 2)
    eps_server = epsilon_rdp(ledger.releases, 1e-5)
    eps_node = epsilon_vs_colluders(ledger.releases, 1e-5, 1)
    assert eps_node > 1.3 * eps_server
    # sized against one colluder, the ledger's epsilon already holds against a node
    plan1 = dn.plan_round([("s", 1, 1.0, 1.0)], max_users=2, n_nodes=2, colluders=1)
    ledger1 = PrivacyLedger(seed=1)
    ledger1.skellam_round(plan1, lambda: {"s": np.zeros(1)}, 2)
    rec = ledger1.releases[0]
    assert (rec.shares, rec.colluders) == (2, 1)
    assert epsilon_vs_colluders(ledger1.releases, 1e-5, 1) == pytest.approx(epsilon_rdp(ledger1.releases, 1e-5), rel=1e-12)
    assert epsilon_rdp(ledger1.releases, 1e-5) <= eps_server * (1 + 1e-9)
    # two colluders against one node's guarantee: no shares left
    assert math.isinf(epsilon_vs_colluders(ledger1.releases, 1e-5, 2))


def test_too_few_nodes_for_the_collusion_is_an_error_naming_the_option():
    with pytest.raises(PrivacyError, match="secure_collusion"):
        _plan(n_nodes=2, colluders=2)
    with pytest.raises(PrivacyError, match="secure_collusion"):
        _plan(n_nodes=4, colluders=1, dropout_nodes=3)
    with pytest.raises(ConfigError) as err:
        ALSConfig.from_overrides({"secure_collusion": "-1"})
    assert err.value.field == "secure_collusion"
    assert ALSConfig.from_overrides({"secure_collusion": "3"}).aggregation.collusion == 3


def test_the_plan_sent_to_nodes_carries_the_collusion():
    plan = _plan(colluders=2)
    back = dn.plan_from_dict(json.loads(json.dumps(plan.to_dict())))
    assert back == plan and back.colluders == 2


def test_ledger_records_of_skellam_rounds_keep_their_shares_through_json():
    plan = _plan(n_nodes=4)
    ledger = PrivacyLedger(seed=1)
    ledger.skellam_round(plan, lambda: {"b": np.zeros(40), "A": np.zeros(60)}, 4)
    again = PrivacyLedger.releases_from_list(json.loads(json.dumps(ledger.to_list())))
    assert again == ledger.releases
    assert {(r.shares, r.colluders) for r in again} == {(4, 1)}


# ---------------------------------------------------------------------------- measurement sums
def test_exact_measurement_sums_are_exact_and_refuse_values_out_of_range():
    plan = dn.ExactPlan((("sse", 5), ("n", 5)), n_nodes=3)
    rng = np.random.default_rng(0)
    vals = [{"sse": rng.uniform(0, 1e3, 5), "n": rng.integers(0, 500, 5).astype(float)} for _ in range(3)]
    total = np.zeros(plan.length, dtype=np.uint64)
    for v in vals:
        total = total + plan.encode(v)
    out = plan.decode(total)
    np.testing.assert_allclose(out["sse"], sum(v["sse"] for v in vals), rtol=0, atol=3 * 2.0**-32)
    np.testing.assert_array_equal(out["n"], sum(v["n"] for v in vals))
    with pytest.raises(PrivacyError, match="finite"):
        plan.encode({"sse": np.array([np.nan, 0, 0, 0, 0]), "n": np.zeros(5)})
    with pytest.raises(PrivacyError, match="magnitude"):
        plan.encode({"sse": np.full(5, 1e12), "n": np.zeros(5)})
    assert dn.plan_from_dict(json.loads(json.dumps(plan.to_dict()))) == plan


def _mask_message(kind: str, plan) -> Message:
    sec = ConfigRecord({"label": "r/x/0/1", "bits": 64, "degree": 2, "threshold": 2, "kind": kind, "step": 0, "plan": json.dumps(plan.to_dict())})
    return Message(RecordDict({"secagg": sec}), dst_node_id=1, message_type="query.secagg_mask")


@pytest.mark.parametrize("kind", ["step", "users", "counts", "bias", "rec_hist", "pam_step"])
def test_a_node_refuses_an_exact_sum_of_a_private_statistic(kind):
    """A server that asks for a release's sum without noise (an exact plan for a noised kind)
    gets nothing: the node refuses before it computes anything."""
    from fedpriv.flower import secure_client
    from fedpriv.testing.local_grid import LocalGrid

    LocalGrid(1)  # sets Flower's task identity so that Message() can be built
    msg = _mask_message(kind, dn.ExactPlan((("x", 3),), n_nodes=3))
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(PrivacyError, match="without noise"):
        secure_client.mask(msg, ctx)


@pytest.mark.parametrize("kind", ["eval", "rec_eval", "block_eval"])
def test_a_node_refuses_a_noised_plan_for_a_measurement(kind):
    from fedpriv.flower import secure_client
    from fedpriv.testing.local_grid import LocalGrid

    LocalGrid(1)
    msg = _mask_message(kind, _plan())
    ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(PrivacyError, match="with noise"):
        secure_client.mask(msg, ctx)


# ---------------------------------------------------------------------------- thresholds
def _share_run(n: int, threshold: int):
    from fedpriv.privacy.secagg import SecAggParams

    params = SecAggParams(bits=32, degree=n - 1, threshold=threshold)
    ids = list(range(10, 10 + n))
    nodes = {i: SecAggNode(i) for i in ids}
    server = SecAggServer(ids, plan_params(n, 32, degree=n - 1), seed=SEED)
    keys = {i: node.channel_key() for i, node in nodes.items()}
    return params, ids, nodes, server, keys


@pytest.mark.parametrize("n, t", [(5, 2), (6, 3), (4, 2), (8, 4)])
def test_a_node_refuses_a_threshold_that_is_not_a_strict_majority(n, t):
    """With t <= half of a node's share holders, a deviating server could tell one half that the
    node survived (self-mask seed shares) and the other half that it dropped (mask-key shares)."""
    params, ids, nodes, server, keys = _share_run(n, t)
    with pytest.raises(SecAggError) as err:
        nodes[ids[0]].share(b"rel", params, server.channel_keys_for(ids[0], keys))
    assert err.value.field == "threshold"


def test_with_a_majority_threshold_a_split_unmask_request_never_yields_both_secrets():
    """The server's attack with the node's own threshold: ask half of u's holders for its
    self-mask seed and the other half for its mask key. Neither half reaches t."""
    n = 7
    params = plan_params(n, 32, degree=n - 1)  # t = 5 of 7 holders
    ids = list(range(10, 10 + n))
    nodes = {i: SecAggNode(i) for i in ids}
    server = SecAggServer(ids, params, seed=SEED)
    keys = {i: node.channel_key() for i, node in nodes.items()}
    shares = {i: node.share(b"rel", params, server.channel_keys_for(i, keys)) for i, node in nodes.items()}
    routed = server.route(shares)
    for i in ids:
        nodes[i].mask(b"rel", np.zeros(4, dtype=np.uint64), *routed[i])
    u = ids[0]
    holders = [i for i in ids if i != u]
    half_a, half_b = holders[:3], holders[3:]
    got_self, got_key = 0, 0
    for h in half_a + [u]:  # told u survived: its self-mask seed share
        got_self += u in nodes[h].unmask(b"rel", ids, [])["self"]
    for h in half_b:  # told u dropped: refuses (fewer survivors than t) or gives the key share
        try:
            got_key += u in nodes[h].unmask(b"rel", [i for i in ids if i != u], [u])["pairwise"]
        except SecAggError:
            pass
    assert got_self + got_key <= len(ids)
    assert not (got_self >= params.threshold and got_key >= params.threshold)


@pytest.mark.parametrize("defence", [True, False])
def test_a_node_refuses_a_threshold_too_low_for_the_colluders_of_its_own_policy(defence):
    """Deviation (f) (simulations/deviant_keys.py): a server colluding with one node asks for t = 4
    of 7 holders and splits the victim's holders between "survived" and "dropped". Defence: a
    node that assumes one colluder refuses that t (2t <= k + 1 + c) before it shares anything.
    Positive control: nodes that assume none share, and the server unmasks the victim's input
    exactly from its masked vector alone."""
    r = load_script("deviant_keys").colluding_threshold(defence)
    assert r["deviation"] == "f" and r["threshold"] == 4 and r["degree"] == 6 and 2 * r["threshold"] <= r["degree"] + 1 + 1
    if defence:
        assert r["recovered"] is False and len(r["refused"]) == r["nodes"]
        assert all("1 colluding" in x["reason"] and "needs 2t > 8" in x["reason"] for x in r["refused"])
    else:
        assert r["recovered"] is True and r["max_abs_error"] == 0 and r["refused"] == []


def test_the_flower_share_handler_takes_the_colluders_from_the_node_policy_not_the_message(monkeypatch):
    """The secure handler passes the colluders of the node's own policy to the node class; the
    message has no say."""
    from fedpriv.flower import secure_client
    from fedpriv.flower.node_policy import NodePolicy

    seen = {}

    class Node:
        def share(self, *args, colluders=0, **kw):
            seen["colluders"] = colluders
            raise SecAggError("stop here", field="threshold")

    monkeypatch.setattr(secure_client, "_node", lambda *a, **k: Node())
    for policy, want in ((NodePolicy(colluders=3, min_contributors=5), 3), (NodePolicy(colluders=None, min_contributors=None), 0)):
        monkeypatch.setattr(secure_client, "node_policy", lambda ctx, p=policy: p)
        sec = ConfigRecord({"label": "r", "bits": 32, "degree": 6, "threshold": 4, "colluders": 0})
        msg = Message(RecordDict({"secagg": sec, "channel_keys": ConfigRecord({})}), dst_node_id=1, message_type="query.secagg_share")
        ctx = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
        with pytest.raises(SecAggError):
            secure_client.share(msg, ctx)
        assert seen["colluders"] == want


def test_the_default_threshold_holds_against_the_runs_colluders():
    from fedpriv.privacy.secagg import default_threshold

    for k in range(1, 40):
        for c in range(0, 4):
            try:
                t = default_threshold(k, c)
            except SecAggError as err:
                assert err.field == "colluders" and (k + 1 + c) // 2 + 1 > k + 1
                continue
            assert 2 * t > k + 1 + c and t > c and t <= k + 1
            assert 2 * (t - 1) <= k + 1 + c  # the least such t: no more dropouts lost than needed
    assert plan_params(3, 32, colluders=1).threshold == 3 and plan_params(4, 32, colluders=1).threshold == 3


# ---------------------------------------------------------------------------- plaintext replies
def test_the_info_reply_is_the_partition_id_and_the_nodes_own_configuration_only():
    from fedpriv.flower.client_app import info
    from fedpriv.testing.local_grid import LocalGrid

    LocalGrid(1)
    msg = Message(RecordDict(), dst_node_id=1, message_type="query.info")
    ctx = Context(run_id=1, node_id=1, node_config={"partition-id": 4}, state=RecordDict(), run_config={})
    rep = info(msg, ctx)
    # configuration, not data: the partition id, the policy's mode, whether a ledger file and an identity are configured (no path)
    assert dict(rep.content.config_records["meta"]) == {"partition_id": 4, "policy_mode": "any", "policy_ledger": False, "identity": False}
    assert not rep.content.array_records
