"""Authenticated key agreement for SecAgg+ (issue 41, item 1(d)): signed channel keys checked
against a roster the server does not distribute, and a consistency round before unmasking.
Each defence is attacked, with a positive control that shows the attack works without it."""

import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from fedpriv.privacy.secagg import SecAggError, SecAggNode, SecAggServer, plan_params
from fedpriv.privacy.secagg_auth import (
    IdentityError,
    advert_message,
    load_identity,
    write_identities,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "simulations"))

RUN = b"flower-run=1;job=test"
BITS = 32


@pytest.fixture(scope="module")
def identities(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ids")
    made = write_identities(folder, [f"node-{k}" for k in range(8)])
    return [load_identity(made[f"node-{k}"]) for k in range(8)]


def test_advert_signature_binds_key_name_node_id_and_run(identities):
    a, b = identities[0], identities[1]
    node = SecAggNode(42, a, RUN)
    key, name, sig = node.advertisement()
    assert name == "node-0" and len(sig) == 64
    assert b.verify(name, advert_message(RUN, 42, name, key), sig)
    other = SecAggNode(43, a, RUN).channel_key()
    for msg in (advert_message(RUN, 42, name, other),          # another key
                advert_message(RUN, 43, name, key),            # another node id
                advert_message(b"flower-run=2;job=test", 42, name, key),  # another run
                advert_message(RUN, 42, "node-1", key)):       # another name
        assert not b.verify(name, msg, sig) and not b.verify("node-1", msg, sig)
    assert not b.verify("node-99", advert_message(RUN, 42, name, key), sig)  # not in the roster
    assert not b.verify(name, advert_message(RUN, 42, name, key), sig[:-1] + bytes([sig[-1] ^ 1]))


def test_identity_files_are_private_and_checked(tmp_path):
    made = write_identities(tmp_path, ["node-0", "node-1"])
    key = made["node-0"] / "signing_key.pem"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(made["node-0"].stat().st_mode) == 0o700
    assert load_identity(made["node-0"]).name == "node-0"
    os.chmod(key, 0o644)
    with pytest.raises(IdentityError, match="signing_key: .*readable by group or others"):
        load_identity(made["node-0"])
    os.chmod(key, 0o600)
    other = write_identities(tmp_path / "other", ["node-0"])  # a roster that does not list this key
    (made["node-0"] / "roster.json").write_text((other["node-0"] / "roster.json").read_text())
    with pytest.raises(IdentityError, match="roster: .*does not list this node's public key"):
        load_identity(made["node-0"])
    (made["node-1"] / "roster.json").write_text("{}")
    with pytest.raises(IdentityError, match="roster"):
        load_identity(made["node-1"])


def _setup(identities, n=8, t=4, seed=b"\x07" * 32):
    ids = [11 * (k + 1) for k in range(n)]
    params = plan_params(n, BITS, threshold=t)
    nodes = {i: SecAggNode(i, identities[k], RUN) for k, i in enumerate(ids)}
    server = SecAggServer(ids, params, seed=seed)
    ads = {i: nodes[i].advertisement() for i in ids}
    return ids, params, nodes, server, ads


def _share_all(ids, params, nodes, server, ads, release):
    keys = {i: a[0] for i, a in ads.items()}
    out = {}
    for u in ids:
        shown = server.channel_keys_for(u, keys)
        out[u] = nodes[u].share(release, params, shown, adverts={v: ads[v][1:] for v in shown}, graph=(ids, server.seed))
    return out


def test_authenticated_protocol_sums_exactly_with_a_dropout(identities):
    ids, params, nodes, server, ads = _setup(identities)
    release = b"r1"
    shares = _share_all(ids, params, nodes, server, ads, release)
    rng = np.random.default_rng(0)
    x = {i: rng.integers(0, 1 << 20, 5, dtype=np.uint64) for i in ids}
    routed = server.route(shares)
    gone = ids[3]
    masked = {u: nodes[u].mask(release, x[u], *routed[u]) for u in ids if u != gone}
    alive, dropped = server.unmask_request(list(shares), list(masked))
    sigs = {u: nodes[u].consistency(release, alive, dropped) for u in alive}
    replies = {u: nodes[u].unmask(release, alive, dropped, sigs) for u in alive}
    total = server.unmask(release, 5, {u: s[0] for u, s in shares.items()}, masked, replies)
    expected = sum(x[u] for u in alive) & np.uint64((1 << BITS) - 1)
    np.testing.assert_array_equal(total, expected)


def test_a_forged_or_unsigned_key_is_refused(identities, tmp_path):
    ids, params, nodes, server, ads = _setup(identities)
    keys = {i: a[0] for i, a in ads.items()}
    u = ids[0]
    shown = server.channel_keys_for(u, keys)
    v = next(iter(shown))
    forged_key = SecAggNode(v).channel_key()  # the server's own key in place of v's
    adverts = {w: ads[w][1:] for w in shown}
    with pytest.raises(SecAggError, match=f"adverts: the channel key of neighbour {v} is not signed"):
        nodes[u].share(b"r", params, {**shown, v: forged_key}, adverts=adverts, graph=(ids, server.seed))
    # signed by a key of the server's own, under the neighbour's name: not the roster's key
    outsider = load_identity(write_identities(tmp_path, ["node-1"])["node-1"])
    resigned = (ads[v][1], outsider.sign(advert_message(RUN, v, ads[v][1], forged_key)))
    with pytest.raises(SecAggError, match="not signed by roster member"):
        nodes[u].share(b"r", params, {**shown, v: forged_key}, adverts={**adverts, v: resigned}, graph=(ids, server.seed))
    # another member's real advertisement replayed under v's node id
    w = next(x for x in ids if x not in shown and x != u)
    with pytest.raises(SecAggError, match="not signed"):
        nodes[u].share(b"r", params, {**shown, v: keys[w]}, adverts={**adverts, v: ads[w][1:]}, graph=(ids, server.seed))
    with pytest.raises(SecAggError, match="no signed key advertisement"):
        nodes[u].share(b"r", params, shown, adverts=None, graph=(ids, server.seed))
    with pytest.raises(SecAggError, match="graph"):  # neighbours that are not its own in the public graph
        nodes[u].share(b"r", params, shown, adverts=adverts, graph=(ids, b"\x08" * 32))
    # nothing was shared by the refusals: the honest request still works
    nodes[u].share(b"r", params, shown, adverts=adverts, graph=(ids, server.seed))


def test_consistency_round_refuses_different_survivor_sets(identities):
    """The server shows one node that a neighbour survived and the others that it dropped (to
    collect its self-mask share from one and its mask key from the rest): the node shown the odd
    view finds fewer than t signatures of its view and reveals nothing; a node asked to unmask
    a view other than the one it signed refuses too. Without identities (positive control) the
    node answers the same odd request."""
    ids, params, nodes, server, ads = _setup(identities)
    release = b"r2"
    shares = _share_all(ids, params, nodes, server, ads, release)
    routed = server.route(shares)
    x = {i: np.arange(4, dtype=np.uint64) for i in ids}
    for u in ids:  # every node stores the shares addressed to it (its masked words are not needed here)
        nodes[u].mask(release, x[u], *routed[u])
    victim = ids[0]
    odd = server.graph[victim][0]  # told the victim survived
    alive = sorted(ids)
    told_dropped = ([u for u in ids if u != victim], [victim])
    sigs = {odd: nodes[odd].consistency(release, alive, [])}
    for u in ids:
        if u not in (odd, victim):
            sigs[u] = nodes[u].consistency(release, *told_dropped)
    sigs[victim] = nodes[victim].consistency(release, alive, [])
    with pytest.raises(SecAggError, match="consistency check failed: 2 of this node's share holders"):
        nodes[odd].unmask(release, alive, [], sigs)
    # the majority view is consistent, and the nodes shown it would answer it; but the node that
    # signed one view will not unmask another
    with pytest.raises(SecAggError, match="differ from the view node"):
        nodes[odd].unmask(release, *told_dropped, sigs)
    with pytest.raises(SecAggError, match="already signed another view"):
        nodes[odd].consistency(release, *told_dropped)
    # positive control: an unauthenticated node has no such check and answers the odd view
    plain = {i: SecAggNode(i) for i in ids}
    pk = {i: n.channel_key() for i, n in plain.items()}
    sh = {u: plain[u].share(b"p", params, server.channel_keys_for(u, pk)) for u in ids}
    rt = server.route(sh)
    for u in ids:
        plain[u].mask(b"p", x[u], *rt[u])
    assert victim in plain[odd].unmask(b"p", alive, [])["self"]


def test_unmask_without_consistency_round_is_refused(identities):
    ids, params, nodes, server, ads = _setup(identities)
    release = b"r3"
    shares = _share_all(ids, params, nodes, server, ads, release)
    routed = server.route(shares)
    for u in ids:
        nodes[u].mask(release, np.zeros(2, dtype=np.uint64), *routed[u])
    with pytest.raises(SecAggError, match="before signing its view"):
        nodes[ids[0]].unmask(release, ids, [], {})


def test_state_survives_export_and_restore(identities):
    """A SuperNode keeps the node's state between messages: the names and the signed view too."""
    ids, params, nodes, server, ads = _setup(identities)
    release = b"r4"
    shares = _share_all(ids, params, nodes, server, ads, release)
    routed = server.route(shares)
    restore = lambda: {i: SecAggNode.restore(i, n.export_state(), n.identity) for i, n in nodes.items()}  # noqa: E731
    nodes = restore()
    masked = {u: nodes[u].mask(release, np.ones(3, dtype=np.uint64), *routed[u]) for u in ids}
    nodes = restore()
    sigs = {u: nodes[u].consistency(release, ids, []) for u in ids}
    nodes = restore()
    replies = {u: nodes[u].unmask(release, ids, [], sigs) for u in ids}
    total = server.unmask(release, 3, {u: s[0] for u, s in shares.items()}, masked, replies)
    assert total.tolist() == [8, 8, 8]


@pytest.mark.parametrize("defence", [False, True])
def test_key_substitution_attack(defence):
    """Deviation (d): a server that hands a victim its own keys for the victim's neighbours (and
    the neighbours its own key for the victim) reads the victim's input exactly when keys are not
    authenticated (positive control); authenticated nodes refuse and it recovers nothing."""
    from deviant_keys import key_substitution

    r = key_substitution(defence, nodes=8, threshold=4)
    assert r["deviation"] == "d" and r["name"] == "key substitution" and r["defence"] is defence
    if not defence:
        assert r["recovered"] is True and r["max_abs_error"] == 0 and r["shares_decrypted"] == r["degree"] >= r["threshold"]
        assert r["refused"] == []  # nobody noticed
    else:
        assert r["recovered"] is False and r["shares_decrypted"] == 0
        assert any(x["node"] == r["victim"] and "not signed by roster member" in x["reason"] for x in r["refused"])


def test_flower_nodes_sign_and_check_over_messages(tmp_path):
    """The Flower handlers on the in-process grid (each node's identity from its node config,
    written by the grid): every advertisement is signed, the consistency round runs, the sums are
    exact; a node whose identity is configured but unreadable refuses instead of running
    unauthenticated."""
    from flwr.app import RecordDict

    from fedpriv.flower.counters import RoundCounters
    from fedpriv.flower.rounds import Rounds
    from fedpriv.flower.secure_client import consistency, keys, masked_reply, share, unmask
    from fedpriv.flower.secure_server import SecureRounds
    from fedpriv.privacy.distributed import ExactPlan
    from fedpriv.testing.local_grid import LocalGrid

    seen = []

    def app(msg, ctx):
        seen.append(msg.metadata.message_type)
        h = {"query.secagg_keys": keys, "query.secagg_share": share, "query.secagg_consistency": consistency,
             "query.secagg_unmask": unmask}.get(msg.metadata.message_type)
        if h is not None:
            return h(msg, ctx)
        return masked_reply(msg, ctx, ExactPlan((("x", 3),), n_nodes=5).encode({"x": np.full(3, ctx.node_config["partition-id"])}))

    grid = LocalGrid(5, client_app=app)
    rounds = Rounds(grid, sorted(grid.partition), RoundCounters(), None)
    secure = SecureRounds(rounds, users_per_node=1)
    plan = ExactPlan((("x", 3),), n_nodes=5)
    unmask_fn, contributors = secure.secure_sum("eval", plan, RecordDict(), 0)
    assert plan.decode(unmask_fn())["x"].tolist() == [10.0] * 3 and contributors == 5
    assert secure.authenticated and {name for name, _ in secure.adverts.values()} == {f"node-{i}" for i in range(5)}
    assert seen.count("query.secagg_consistency") == 5 and rounds.result.rejected == []

    bad = LocalGrid(3, client_app=app, node_config=lambda pid: {"fedpriv-identity": str(tmp_path / "missing")})
    rounds = Rounds(bad, sorted(bad.partition), RoundCounters(), None)
    assert SecureRounds(rounds, users_per_node=1)._nodes() == []
    assert all("signing_key" in r["reason"] for r in rounds.result.rejected)


def test_where_a_node_finds_its_identity(tmp_path, monkeypatch):
    """Node config `fedpriv-identity`, else `data-dir/identity`, else $FEDPRIV_NODE_IDENTITY/node-<partition>
    (what the launcher and the Ray simulation set for their nodes, removed after the run)."""
    from types import SimpleNamespace

    from fedpriv.flower import node_identity as ni

    monkeypatch.delenv(ni.ENV, raising=False)
    env_dir, data_dir, own = tmp_path / "env", tmp_path / "data", tmp_path / "own"
    ni.provision(env_dir, 3)
    ni.provision_into({0: data_dir / ni.DATA_SUBDIR, 1: tmp_path / "d1" / ni.DATA_SUBDIR})
    write_identities(tmp_path, ["own"])
    ctx = lambda cfg: SimpleNamespace(node_id=5, node_config=cfg)  # noqa: E731
    assert ni.node_identity(ctx({"partition-id": 2})) is None  # nothing configured: unauthenticated (logged)
    monkeypatch.setenv(ni.ENV, str(env_dir))
    assert ni.node_identity(ctx({"partition-id": 2})).name == "node-2"
    assert ni.node_identity(ctx({"partition-id": 2, "data-dir": str(data_dir)})).name == "node-0"
    assert ni.node_identity(ctx({"partition-id": 2, "data-dir": str(data_dir), "fedpriv-identity": str(own)})).name == "own"
    with pytest.raises(IdentityError, match="signing_key"):  # configured but unreadable: refused, not unauthenticated
        ni.node_identity(ctx({"fedpriv-identity": str(tmp_path / "missing")}))
    monkeypatch.delenv(ni.ENV)
    with ni.simulation_identities(2) as folder:
        assert os.environ[ni.ENV] == folder and ni.node_identity(ctx({"partition-id": 1})).name == "node-1"
    assert ni.ENV not in os.environ and not Path(folder).exists()


@pytest.mark.flower  # the launcher's `flwr run` simulation: scripts/test.sh runs it on the newest Flower too
def test_flwr_run_nodes_are_authenticated(tmp_path, capsys):
    """`fedpriv run --engine flower --aggregation secure`: the launcher gives every simulated
    node a signing identity for the run ($FEDPRIV_NODE_IDENTITY, removed with the run), so every
    release runs the consistency round with every node signing."""
    import json

    from fedpriv.cli import main

    out = tmp_path / "out"
    code = main(["run", "adadpals", "--data", "synthetic-mf:users=60,items=40,ratings=1500,seed=2", "--epsilon", "2", "--engine", "flower",
                 "--nodes", "4", "--users-per-node", "15", "--aggregation", "secure", "--set", "rank=3", "--set", "steps=1", "--out", str(out), "--quiet"])
    assert code == 0, capsys.readouterr().err[-3000:]
    m = json.loads((out / "metrics.json").read_text())
    assert m["aggregation"] == "secure" and m["epsilon_spent"] == pytest.approx(2.0, rel=1e-3)
    checks = [r for r in m["round_log"] if str(r["round"]).endswith(":consistency")]
    assert checks and all(r["replies"] == 4 for r in checks), m["round_log"]
    assert m["rejected_replies"] == []


def test_a_node_with_a_floor_counts_only_roster_signed_members_and_refuses_invented_peers(identities):
    """Issue 57 (sybils): a server that pads a 3-node sum with 5 invented members to reach a node's
    floor of 8 gets a [roster] refusal: an invented member has no roster signature. Positive
    control: with only the roster defence off, the padded sum passes the member count."""
    from fedpriv.privacy import defences

    ids, params, nodes, server, ads = _setup(identities)
    keys = {i: a[0] for i, a in ads.items()}
    u = ids[0]
    shown = server.channel_keys_for(u, keys)
    adverts = {v: ads[v][1:] for v in ids}  # every member's signed advertisement
    # honest: all 8 real members, each signed: taken, and their names kept for the consistency round
    nodes[u].share(b"honest", params, shown, adverts=adverts, graph=(ids, server.seed), min_contributors=8, member_keys=keys)
    # padded: the node's real neighbours plus members the server invented (no advertisement of a roster member)
    fake = SecAggNode(999, None).channel_key()
    padded_keys = {v: (keys[v] if v in keys else fake) for v in ids}
    padded_adverts = {v: adverts[v] for v in shown} | {v: ("node-7", b"\0" * 64) for v in ids if v not in shown and v != u}
    with pytest.raises(SecAggError, match=r"\[roster\]"):
        nodes[u].share(b"padded", params, shown, adverts=padded_adverts, graph=(ids, server.seed), min_contributors=8, member_keys=padded_keys)
    with defences.disabled("roster"):
        nodes[u].share(b"padded-control", params, shown, adverts=padded_adverts, graph=(ids, server.seed), min_contributors=8,
                       member_keys=padded_keys)
    # fewer members than the floor: refused by the count itself
    with pytest.raises(SecAggError, match=r"\[min-contributors\]"):
        nodes[u].share(b"few", params, shown, adverts=adverts, graph=(ids, server.seed), min_contributors=9, member_keys=keys)
