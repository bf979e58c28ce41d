"""The server-view check of simulations/red_team.py (issue 30): with one user per node, does any
reply the server receives carry a per-node value in plaintext, or have a size that depends on a
node's data? Decided by attack (two runs on D, one on a neighbouring D' with the same noise seed;
an entry equal in both runs on D and different on D' carries a per-node value), never by a list
of allowed fields.

Central mode is the positive control (the trusted server sees each node's clipped sums and
their sparse, data-dependent sizes); a node app that leaks (its rating count in plaintext, a
random pad as long as its ratings) is caught in secure mode; fedpriv's own secure mode shows the
server masked words, protocol fields and noised releases only, and its epsilon holds against a
node that knows its own noise share."""

from __future__ import annotations

import json
import os

import pytest
from conftest import load_script

DATA = "synthetic-mf:users=40,items=30,ratings=900,seed=3"
NODES = 5
FACTORS = {"rank": "2", "steps": "1"}  # a factor step: sparse per-node contributions in central mode


@pytest.fixture(scope="module")
def red_team():
    return load_script("red_team")


def _view(red_team, aggregation, overrides=None, client_app=None, noise_seed=11):
    return red_team.server_view(DATA, aggregation=aggregation, nodes=NODES, overrides=overrides, client_app=client_app, noise_seed=noise_seed)


# ---------------------------------------------------------------- the rules, on hand-made views
def _run(replies, rounds=(("train", "step1", 0),)):
    return {"replies": {(r, p): v for (r, p), v in replies.items()}, "rounds": list(rounds)}


def _reply(fields, size=None, keys=None, entry_bytes=None):
    keys = keys or {}
    for rec, key in fields:
        keys.setdefault(rec, set()).add(key)
    return {"fields": fields, "keys": {k: frozenset(v) for k, v in keys.items()}, "size": size, "entry_bytes": entry_bytes or {}}


def test_the_rules_on_hand_made_views(red_team):
    r = ("train", "step1", 0)
    det = ("meta", "n")  # deterministic, moves on D'
    same = ("meta", "id")  # deterministic, same on D'
    rnd = ("masked", "y")  # random value of a fixed length (32 bytes), printed in 40 to 60 characters

    def view(n, y, y_printed, neighbour, ct_printed, extra_size=0, extra=None):
        """A reply: n, id, y, and one share per (random) neighbour, printed in ct_printed characters."""
        fields = {det: ("int", n), same: ("int", 7), rnd: ("bytes", y), ("ct", neighbour): ("bytes", b"x"), **(extra or {})}
        eb = {det: (2, 2), same: (2, 2), rnd: (y_printed, 32), ("ct", neighbour): (ct_printed, 12)}
        return _run({(r, 0): _reply(fields, sum(p for p, _ in eb.values()) + extra_size, entry_bytes=eb)})

    a1 = view(3, b"\x00" * 32, 60, "1001", 30)
    a2 = view(3, b"a" * 32, 40, "1002", 20)
    b = view(4, b"b" * 32, 44, "1003", 25)
    out = red_team.compare_views(a1, a2, b)
    assert out["server_plaintext_fields"] == ["train:meta.n"]  # not masked.y (random), not ct.* (random keys)
    assert out["data_dependent_sizes"] == []  # the sizes differ by the printed random bytes only
    assert {"train:masked.y", "train:ct.1001"} <= set(out["random_fields"])
    # a size that moves with the data, all else random: caught
    out = red_team.compare_views(a1, a2, view(3, b"b" * 32, 44, "1003", 25, extra_size=5))
    assert out["server_plaintext_fields"] == [] and out["data_dependent_sizes"] == ["train:step1"]
    # an entry present on D' only (in a record whose key set is the same in both runs on D)
    out = red_team.compare_views(a1, a2, view(3, b"b" * 32, 44, "1003", 25, extra={("meta", "extra"): ("int", 1)}))
    assert out["server_plaintext_fields"] == ["train:meta.extra"]


# ---------------------------------------------------------------- positive controls
def test_central_mode_shows_the_server_each_nodes_contribution(red_team):
    """The trusted server of central mode sees per-node clipped sums and sparse sizes: the check
    must find them (the method has power)."""
    rep = _view(red_team, "central", FACTORS)
    fields = set(rep["server_plaintext_fields"])
    assert {"train:contrib.item_ids", "train:contrib.A_upper", "train:contrib.b", "query.mean:contrib.values"} <= fields, fields
    assert "train:step1" in rep["data_dependent_sizes"], rep["data_dependent_sizes"]
    assert rep["detail"]["config"]["rank"] == 2 and rep["detail"]["nodes"] == NODES
    assert rep["detail"]["unaligned_rounds"] == []
    assert rep["leaks"] is True
    # the changed user's own node is among those whose contribution moved
    assert rep["detail"]["changed_user"]["partition"] in rep["detail"]["fields_by_partition"]["train:contrib.item_ids"]


def _leaky_app():
    """fedpriv's node app, but the info reply carries the node's rating count and the masked
    reply a pad of random bytes as long as its ratings (a size leak with random content)."""
    from flwr.app import ConfigRecord

    from fedpriv.flower import codec
    from fedpriv.flower.client_app import app
    from fedpriv.flower.partition import data_dir_of, load_shard

    def leaky(msg, ctx):
        reply = app(msg, ctx)
        kind = msg.metadata.message_type
        if kind in ("query.info", "query.secagg_mask") and not reply.has_error():
            _, data_dir, upn = codec.decode_state(msg.content)
            shard = load_shard(data_dir_of(ctx.node_config, data_dir), "train", int(ctx.node_config["partition-id"]), upn)
            if kind == "query.info":
                reply.content["meta"]["n_ratings"] = int(shard.n_ratings)
            else:
                reply.content["pad"] = ConfigRecord({"noise": os.urandom(1 + int(shard.n_ratings))})
        return reply

    return leaky


def test_a_leaking_node_app_is_caught_in_secure_mode(red_team):
    rep = _view(red_team, "secure", client_app=_leaky_app())
    assert rep["server_plaintext_fields"] == ["query.info:meta.n_ratings"]
    assert any(s.startswith("query.secagg_mask:") for s in rep["data_dependent_sizes"]), rep["data_dependent_sizes"]
    assert "query.secagg_mask:pad.noise" in rep["detail"]["random_fields"]  # its content is random, its length is not
    assert rep["leaks"] is True


def test_a_plan_that_trusts_every_node_fails_against_one(red_team):
    """secure_collusion=0: the noise counts every node's share, so a node that knows its own
    share sees less noise than planned: epsilon against it exceeds the target."""
    rep = _view(red_team, "secure", {"secure_collusion": "0"})
    assert rep["epsilon_vs_one_node"] > rep["epsilon_target"] * (1 + 1e-3)
    assert rep["leaks"] is True


# ---------------------------------------------------------------- fedpriv's secure mode
@pytest.mark.parametrize("overrides", [{}, FACTORS], ids=["noise-aware-defaults", "factor-step"])
def test_secure_mode_shows_the_server_nothing_per_node(red_team, overrides):
    rep = _view(red_team, "secure", overrides)
    assert rep["detail"]["unaligned_rounds"] == []
    assert rep["server_plaintext_fields"] == [], rep["detail"]["fields_by_partition"]
    assert rep["data_dependent_sizes"] == [], rep["detail"]["sizes_by_partition"]
    assert rep["epsilon_vs_one_node"] <= rep["epsilon_target"] * (1 + 1e-3)
    assert rep["detail"]["random_fields"]  # masks, keys and shares were seen (and left out as random)
    assert rep["leaks"] is False


def test_secure_mode_over_a_sparse_neighbour_graph(red_team):
    """12 nodes: each has 8 of 11 possible neighbours, drawn afresh each run, so the share and
    unmask replies are keyed by random node ids (their key sets and printed sizes are random).
    Two runs on D give some node the same 8 neighbours 7% of the time (12 / C(11, 8)), which the
    comparison would take for a fixed, data-driven key set: three runs on D make that 0.04%."""
    rep = red_team.server_view(DATA, aggregation="secure", nodes=12, noise_seed=11, d_runs=3)
    assert rep["detail"]["nodes"] == 12
    assert rep["server_plaintext_fields"] == [], rep["detail"]["fields_by_partition"]
    assert rep["data_dependent_sizes"] == [], rep["detail"]["sizes_by_partition"]
    assert rep["leaks"] is False


def test_secure_recommendation_shows_the_server_nothing_per_node(red_team):
    """With the private recommendation rounds: the reports are local-DP picks (noised by the
    nodes' keys), the evaluation sums are secure sums."""
    rep = _view(red_team, "secure", {"recommend": "mgem", "rec_candidates": "10"})
    assert rep["server_plaintext_fields"] == [], rep["detail"]["fields_by_partition"]
    assert rep["data_dependent_sizes"] == [], rep["detail"]["sizes_by_partition"]
    assert rep["epsilon_vs_one_node"] <= rep["epsilon_target"] * (1 + 1e-3)


def test_the_command_prints_one_json_line_and_fails_on_a_leak(red_team, capsys):
    rc = red_team.main(["--data", DATA, "--aggregation", "central", "--nodes", str(NODES), "--set", "rank=2", "--set", "steps=1", "--noise-seed", "5"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    out = json.loads(lines[0])
    assert set(out) == {"server_plaintext_fields", "data_dependent_sizes", "epsilon_vs_one_node", "epsilon_target"}
    assert out["server_plaintext_fields"] and out["data_dependent_sizes"] and out["epsilon_target"] == 1.0
    assert rc == 1
