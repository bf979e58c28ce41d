"""The server-view check of simulations/red_team.py (issue 30): with one user per node, does any
reply the server receives carry a per-node value in plaintext, or have a size that depends on a
node's data? Decided by attack (two runs on D, one on a neighbouring D' with the same noise seed;
an entry equal in both runs on D and different on D' carries a per-node value), never by a list
of allowed fields.

Central mode is the positive control (the trusted server sees each node's clipped sums and
their sparse, data-dependent sizes); a node app that leaks (its rating count in plaintext, a
random pad as long as its ratings) is caught in secure mode; fedpriv's own secure mode shows the
server masked words, protocol fields and noised releases only, and its epsilon holds against a
node that knows its own noise share.

The check attacks the protocol too: the noise the nodes actually add is measured from repeated
releases (same data, same public state, fresh noise) against the ledger's std (a node that adds
1e-6 of its planned variance is caught), a changing plaintext field is decoded (its move on D'
against its spread on D: ``n_ratings + U(0, 1e-6)`` is caught), a number of rounds that moves
with the data is a leak, and the default run makes a factor step."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from conftest import load_script

DATA = "synthetic-mf:users=40,items=30,ratings=900,seed=3"
NODES = 5
FACTORS = {"rank": "2", "steps": "1"}  # a factor step: sparse per-node contributions in central mode


@pytest.fixture(scope="module")
def red_team():
    return load_script("red_team")


def _view(red_team, aggregation, overrides=None, client_app=None, noise_seed=11, noise_runs=1):
    return red_team.server_view(DATA, aggregation=aggregation, nodes=NODES, overrides=overrides, client_app=client_app, noise_seed=noise_seed,
                                noise_runs=noise_runs)


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


def test_changing_fields_are_decoded_not_dropped(red_team):
    """A field that changes between runs on D is random only if it moves on D' no more than it
    moves between runs on D: n + U(0, 1e-6) is decoded, uniform words are not."""
    rng = np.random.default_rng(0)
    r = ("query.secagg_mask", "secagg_mask", 0)

    def views(value_of):
        out = []
        for run in range(3):  # A1, A2 on D, B on D' (partition 2's data changed: n 10 -> 5)
            replies = {}
            for part in range(5):
                n = 5 if (run == 2 and part == 2) else 10 + part
                replies[(r, part)] = _reply({("leak", "n"): value_of(n), ("masked", "y"): ("array", "<u8", (4,), rng.integers(0, 2**63, 4, dtype=np.uint64).tobytes())})
            out.append(_run(replies, rounds=(r,)))
        return out

    out = red_team.compare_views(*views(lambda n: ("float", n + rng.uniform(0, 1e-6))))
    assert out["server_plaintext_fields"] == ["query.secagg_mask:leak.n"] and out["decoded_fields"] == ["query.secagg_mask:leak.n"]
    assert out["fields_by_partition"]["query.secagg_mask:leak.n"] == [2]  # the node whose data changed
    assert {"query.secagg_mask:leak.n", "query.secagg_mask:masked.y"} <= set(out["random_fields"])
    # the same field with noise as large as the change (a noised value): not decoded, nor are the masked words
    out = red_team.compare_views(*views(lambda n: ("float", n + rng.normal(0, 100.0))))
    assert out["server_plaintext_fields"] == [] and out["decoded_fields"] == []


def test_a_data_dependent_number_of_rounds_is_a_leak(red_team):
    step = ("train", "step1", 0)
    extra = ("train", "step1", 1)
    reply = _reply({("meta", "id"): ("int", 7)})

    def run(rounds):
        return _run({(rnd, p): reply for rnd in rounds for p in range(3)}, rounds=rounds)

    same = red_team.compare_views(run((step,)), run((step,)), run((step,)))
    assert same["data_dependent_rounds"] == []
    out = red_team.compare_views(run((step,)), run((step,)), run((step, extra)))  # one more round on D'
    assert out["data_dependent_rounds"] == ["train:step1"]
    assert out["server_plaintext_fields"] == [] and out["data_dependent_sizes"] == []
    # a round that fewer nodes answer on D'
    short = _run({**{(step, p): reply for p in range(2)}}, rounds=(step,))
    assert red_team.compare_views(run((step,)), run((step,)), short)["data_dependent_rounds"] == ["train:step1"]


def test_the_noise_measurement_on_hand_made_releases(red_team):
    """Two runs of the same releases: their difference is the noise; its variance against the
    ledger's. Honest: ratio about 1; a hundredth of the std: ratio 0.01 and the release listed."""
    rng = np.random.default_rng(1)
    exact = rng.normal(size=4000)

    def log(scale):
        return [("gaussian", {"counts": (exact + rng.normal(0, 2.0 * scale, exact.shape), 2.0, 2.0)}),
                ("gaussian", {"users": (np.array([24.0 + rng.normal(0, 3.0)]), 3.0, 3.0)})]

    honest = red_team.measure_noise([log(1.0), log(1.0)])
    assert 0.95 < honest["noise_ratio"] < 1.05 and honest["short_releases"] == [] and honest["dof"] == 4001
    assert not honest["below_min"]
    low = red_team.measure_noise([log(0.01), log(0.01)])
    assert low["noise_ratio"] < 0.05 and low["short_releases"] == ["counts"] and low["below_min"]
    # 0.9 of the planned std on 4000 coordinates: below 0.95 beyond the sampling error
    slight = red_team.measure_noise([log(0.9), log(0.9)])
    assert 0.85 < slight["noise_ratio"] < 0.95 and slight["below_min"] and slight["short_releases"] == ["counts"]
    with pytest.raises(AssertionError, match="other releases"):
        red_team.measure_noise([log(1.0), log(1.0)[:1]])


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


def _leaky_app(masked_count: bool = False):
    """fedpriv's node app, but the info reply carries the node's rating count and the masked
    reply a pad of random bytes as long as its ratings (a size leak with random content); with
    ``masked_count`` instead every masked reply carries ``n_ratings + U(0, 1e-6)`` in plaintext
    (a value that changes between runs on D)."""
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
            if masked_count:
                if kind == "query.secagg_mask":
                    reply.content["leak"] = ConfigRecord({"n": float(shard.n_ratings) + float(np.random.default_rng().uniform(0, 1e-6))})
            elif kind == "query.info":
                reply.content["meta"]["n_ratings"] = int(shard.n_ratings)
            else:
                reply.content["pad"] = ConfigRecord({"noise": os.urandom(1 + int(shard.n_ratings))})
        return reply

    return leaky


def test_a_leaking_node_app_is_caught_in_secure_mode(red_team):
    rep = _view(red_team, "secure", client_app=_leaky_app(), noise_runs=0)
    assert rep["server_plaintext_fields"] == ["query.info:meta.n_ratings"]
    assert any(s.startswith("query.secagg_mask:") for s in rep["data_dependent_sizes"]), rep["data_dependent_sizes"]
    assert "query.secagg_mask:pad.noise" in rep["detail"]["random_fields"]  # its content is random, its length is not
    assert rep["leaks"] is True


def test_a_count_with_a_little_noise_in_every_masked_reply_is_decoded(red_team):
    """Every masked reply carries n_ratings + U(0, 1e-6): it changes between runs on D (the old
    rule dropped it as random); decoded, it is listed, with the changed user's node."""
    rep = _view(red_team, "secure", client_app=_leaky_app(masked_count=True), noise_runs=0)
    assert rep["server_plaintext_fields"] == ["query.secagg_mask:leak.n"], rep["server_plaintext_fields"]
    assert rep["detail"]["decoded_fields"] == ["query.secagg_mask:leak.n"]
    assert rep["detail"]["fields_by_partition"]["query.secagg_mask:leak.n"] == [rep["detail"]["changed_user"]["partition"]]
    assert rep["leaks"] is True


def test_nodes_that_add_too_little_noise_are_caught(red_team, monkeypatch):
    """Tampered nodes add 1e-6 of their planned noise variance (the ledger still records the
    planned noise): the measured std is about 1e-3 of the ledger's and the check fails."""
    from fedpriv.privacy import distributed

    real = distributed.skellam_share
    monkeypatch.setattr(distributed, "skellam_share", lambda rng, variance, size, *, name: real(rng, variance * 1e-6, size, name=name))
    rep = _view(red_team, "secure")
    assert rep["noise_ratio"] < 0.01, rep["noise_ratio"]
    assert {"counts", "item_stats_A", "item_stats_b"} <= set(rep["noise_short_releases"])
    assert rep["server_plaintext_fields"] == [] and rep["data_dependent_sizes"] == []  # nothing else gives it away
    assert rep["epsilon_vs_one_node"] <= rep["epsilon_target"] * (1 + 1e-3)  # the ledger's epsilon does not see it
    assert rep["epsilon_vs_one_node_measured"] > 100 * rep["epsilon_target"]  # the measured noise's does
    assert rep["leaks"] is True


def test_a_plan_that_trusts_every_node_fails_against_one(red_team):
    """secure_collusion=0: the noise counts every node's share, so a node that knows its own
    share sees less noise than planned: epsilon against it exceeds the target."""
    rep = _view(red_team, "secure", {"secure_collusion": "0"}, noise_runs=0)
    assert rep["epsilon_vs_one_node"] > rep["epsilon_target"] * (1 + 1e-3)
    assert rep["leaks"] is True


# ---------------------------------------------------------------- fedpriv's secure mode
@pytest.mark.parametrize("overrides", [{}, {"defaults": "noise-aware"}], ids=["default-factor-step", "noise-aware-defaults"])
def test_secure_mode_shows_the_server_nothing_per_node(red_team, overrides):
    rep = _view(red_team, "secure", overrides)
    if not overrides:  # the default run makes a factor step
        assert rep["detail"]["config"]["rank"] == 2 and rep["detail"]["config"]["steps"] == 1
        assert {"item_stats_A", "item_stats_b"} <= set(rep["detail"]["noise"]["by_release"])
    assert rep["detail"]["unaligned_rounds"] == []
    assert rep["server_plaintext_fields"] == [], rep["detail"]["fields_by_partition"]
    assert rep["data_dependent_sizes"] == [] and rep["data_dependent_rounds"] == [], rep["detail"]["sizes_by_partition"]
    assert rep["epsilon_vs_one_node"] <= rep["epsilon_target"] * (1 + 1e-3)
    # the noise actually added: every node's share, so about sqrt(5/4) = 1.12 of the ledger's std
    # (which leaves out one colluder's share); far above it, the runs' exact sums did not line up
    assert 0.95 <= rep["noise_ratio"] <= 1.35 and rep["noise_short_releases"] == [], rep["detail"]["noise"]
    assert rep["detail"]["random_fields"]  # masks, keys and shares were seen (and left out as random)
    assert rep["leaks"] is False


def test_secure_mode_over_a_sparse_neighbour_graph(red_team):
    """12 nodes: each has 8 of 11 possible neighbours, drawn afresh each run, so the share and
    unmask replies are keyed by random node ids (their key sets and printed sizes are random).
    Two runs on D give some node the same 8 neighbours 7% of the time (12 / C(11, 8)), which the
    comparison would take for a fixed, data-driven key set: three runs on D make that 0.04%."""
    rep = red_team.server_view(DATA, aggregation="secure", nodes=12, noise_seed=11, d_runs=3, noise_runs=0)
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
    assert set(out) == {"server_plaintext_fields", "data_dependent_sizes", "data_dependent_rounds", "epsilon_vs_one_node", "epsilon_target",
                        "noise_ratio", "noise_short_releases", "epsilon_vs_one_node_measured"}
    assert out["server_plaintext_fields"] and out["data_dependent_sizes"] and out["epsilon_target"] == 1.0
    # central mode: the noise is the ledger's own Gaussian noise, measured as the ledger says (here
    # on a few hundred coordinates: a standard error of about 0.05)
    assert 0.8 <= out["noise_ratio"] <= 1.2 and out["noise_short_releases"] == [] and out["data_dependent_rounds"] == []
    assert rc == 1


@pytest.mark.flower  # ML-100K, 24 nodes, four runs: with the Flower suite, not the default one
def test_the_command_on_ml_100k(red_team, shared_data, capsys):
    """The documented command: empty lists, the ledger's epsilon against one node, and the noise
    actually added (every node's share: about sqrt(24/23) of the ledger's std) with a factor step."""
    rc = red_team.main(["--data", f"ml-100k:{shared_data / 'ml-100k' / 'ml-100k.zip'}", "--epsilon", "1", "--aggregation", "secure"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["server_plaintext_fields"] == [] and out["data_dependent_sizes"] == [] and out["data_dependent_rounds"] == []
    assert out["epsilon_vs_one_node"] <= out["epsilon_target"] * (1 + 1e-3) and out["noise_short_releases"] == []
    assert 0.95 <= out["noise_ratio"] <= 1.1
    assert rc == 0
