"""The red-team check (simulations/red_team.py) against default outputs and a node's view of the
messages: it recovers nothing; with a published noise seed (a reproducible run whose seed is a
published number) the same attacks do recover the noise and the samples (they have power)."""

from __future__ import annotations

import pytest
from conftest import load_script

DATA = "synthetic-mf:users=200,items=80,ratings=5000,seed=3"


@pytest.fixture(scope="module")
def red_team():
    return load_script("red_team").red_team


def test_default_outputs_give_nothing_away(red_team):
    rep = red_team(DATA, small_seeds=200, neighbour_algorithms=("adadpals", "dpals-uniform", "dpsgd", "bias", "adadpals+bias_stage", "adadpals+defaults=noise-aware"))
    assert rep["noise"].startswith("secret")
    assert rep["published"]["messages_seen_by_nodes"] > 0 and rep["published"]["integers_tried"] > 200
    regen = rep["noise_regeneration"]
    assert regen["applicable"] and not regen["recovered"] and regen["best_residual_over_noise_std"] > 0.5
    ren = rep["renumbering"]
    assert ren["n_items"][0] == ren["n_items"][1] and not ren["recovered"]
    assert all(ren[a]["holds"] and ren[a]["unmeasured"] == [] and ren[a]["unmoved"] == []
               for a in ("adadpals", "dpals-uniform", "dpsgd", "bias", "adadpals+bias_stage", "adadpals+defaults=noise-aware"))
    # DP-SGD: the removed user is one its run on D really sampled, so its gradient moved the release
    # (a user never sampled moves nothing: the check would hold vacuously)
    assert ren["dpsgd"]["removed_user_sampled_rounds"] >= 1 and ren["dpsgd"]["users_sampled"] > 0
    assert 0.01 < ren["dpsgd"]["max_move_over_sensitivity"]["dpsgd_grad"] <= 1 + 1e-5
    # the bias stage's release is measured (and moved by the removed user), with and without the noise-aware rule
    for entry in ("adadpals+bias_stage", "adadpals+defaults=noise-aware"):
        assert 0.01 < ren[entry]["max_move_over_sensitivity"]["bias"] <= 1 + 1e-5
    # the bias model: its rank-0 item statistics
    assert {"item_stats_A", "item_stats_b"} <= set(ren["bias"]["max_move_over_sensitivity"])
    assert not rep["sample_inference"]["recovered"]
    assert rep["recovered_anything"] is False


def test_a_published_noise_seed_is_found_and_exploited(red_team):
    """1234 is the public seed in every config: a run whose noise seed is 1234 is broken."""
    rep = red_team(DATA, noise_seed=1234, small_seeds=10, neighbour_algorithms=("adadpals",))
    assert rep["noise"] == "reproducible"
    assert rep["noise_regeneration"]["recovered"] and rep["noise_regeneration"]["best_residual_over_noise_std"] < 1e-9
    assert rep["sample_inference"]["recovered"] and rep["sample_inference"]["precision"] == 1.0
    assert rep["recovered_anything"] is True


@pytest.mark.parametrize("algorithm", ["dpals-uniform", "adadpals"])
def test_a_node_sees_no_exact_user_count_and_no_secret(algorithm):
    """What a node receives: the released user count (or none: 0), never the exact one; no
    key file and no noise seed in a default run."""
    import json as _json

    from fedpriv.data.spec import load_spec, parse_data_spec
    from fedpriv.testing.local_grid import LocalGrid
    from fedpriv.flower.server_app import run_job
    from fedpriv.run import run

    ds = load_spec(parse_data_spec(DATA))
    seen = []
    metrics, _ = run(algorithm, DATA, epsilon=2.0, dataset=ds, engine="flower", progress=False, overrides={"users_per_node": "10", "steps": "1"},
                     flower_runner=lambda job, n: run_job(LocalGrid(n, observer=lambda nid, msg: seen.append(msg)), job))
    counts = set()
    for msg in seen:
        cfg = msg.content.config_records["cfg"]
        assert "client_key_file" not in cfg
        counts.add(int(cfg["n_users"]))
        assert "noise_seed" not in _json.loads(str(cfg["config"]))
    # before the users round 0, then the released count (the noise-aware defaults read it)
    assert counts == {0, metrics["released_n_users"]}


def test_neighbour_entries():
    """Attack 2's entries: ALG (the small fixed-defaults run, no bias stage), ALG+KEY[=VALUE]
    (``+bias_stage``: the stage on), and the bias model from its own fixed defaults (rank 0)."""
    from conftest import load_script

    rt = load_script("red_team")
    alg, cfg = rt.neighbour_config("adadpals")
    assert alg == "adadpals" and (cfg.rank, cfg.steps, cfg.bias_stage, cfg.defaults) == (4, 2, False, "fixed")
    alg, cfg = rt.neighbour_config("adadpals+bias_stage")
    assert alg == "adadpals" and (cfg.rank, cfg.steps, cfg.bias_stage) == (4, 2, True)
    assert rt.neighbour_config("adadpals+defaults=noise-aware")[1].defaults == "noise-aware"
    alg, cfg = rt.neighbour_config("bias")
    assert alg == "bias" and cfg.rank == 0 and cfg.defaults == "noise-aware"
    assert rt.neighbour_config("dpsgd")[1].options.sgd_sampling_rate == 0.2  # the base's own key, in dpsgd's options
    assert {"bias", "adadpals+bias_stage"} <= set(rt.NEIGHBOUR_ALGORITHMS)
