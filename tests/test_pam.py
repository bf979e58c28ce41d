"""DP model personalization: sensitivities, accounting, recovery, baselines, CLI, both engines."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedpriv.algorithms import pam
from fedpriv.algorithms.kernels import from_upper, upper
from fedpriv.cli import main
from fedpriv.data.personal import make_personal
from fedpriv.errors import ConfigError
from fedpriv.algorithms.pam import evaluate_personal
from fedpriv.privacy.accounting import epsilon_rdp, gaussian_epsilon_closed_form, zcdp_rho
from fedpriv.privacy.randomness import RunSecrets
from fedpriv.run import run

SPEC = "synthetic-personal:users=400,samples=8,d=6,k=2,noise=0.01,seed=3"
from fedpriv.engine.blocks import train_blocks


def train_personal_inprocess(algorithm, data, cfg, **kw):
    """pam's in-process run: the generic block engine with pam's family."""
    return train_blocks(pam.FAMILY, algorithm, data, cfg, **kw)


def _state(schedule="full", d=6, k=2, m=8, **kw):
    cfg = pam.PAMConfig(schedule=schedule, epochs=3, **kw)
    st_, _ = pam.new_pam_state("pam", cfg, d, k, m, 1.0, 1e-6)
    st_.U = np.linalg.qr(np.random.default_rng(0).standard_normal((d, k)))[0]
    return st_


@settings(max_examples=25, deadline=None)
@given(
    scale=st.sampled_from([1e-3, 1.0, 1e3, 1e6]),
    yval=st.sampled_from([0.0, 1.0, -1e6, 1e6]),
    schedule=st.sampled_from(["full", "disjoint"]),
    clip_w=st.sampled_from([0.0, 0.5, 5.0]),
    clip_y=st.sampled_from([0.0, 0.3, 3.0]),
    seed=st.integers(0, 1000),
)
def test_one_user_moves_each_release_by_at_most_its_sensitivity(scale, yval, schedule, clip_w, clip_y, seed):
    """Add/remove one adversarial user (huge or tiny features, extreme responses): the private
    initialization, the AM statistics and the single-model statistics move by at most their
    declared L2 sensitivities."""
    rng = np.random.default_rng(seed)
    n, m, d, k = 20, 8, 6, 2
    data = make_personal(n, m, d, k, 0.1, seed=seed)
    X, y = data.X.copy(), data.y.copy()
    X[-1] = (rng.standard_normal((m, d)) * scale).astype(np.float32)
    y[-1] = np.float32(yval)
    state = _state(schedule, d, k, m, clip_w=clip_w, clip_y=clip_y)
    single, _ = pam.new_pam_state("pam-single-model", pam.PAMConfig(clip_y=clip_y, clip_x=clip_w), d, k, m, 1.0, 1e-6)
    checks = [
        ("init_M", lambda a, b: pam.client_init_stats(a, b, state), state),
        ("am_A", lambda a, b: pam.client_am_stats(a, b, state)[0], state),
        ("am_b", lambda a, b: pam.client_am_stats(a, b, state)[1], state),
        ("single_A", lambda a, b: pam.client_single_stats(a, b, single)[0], single),
        ("single_b", lambda a, b: pam.client_single_stats(a, b, single)[1], single),
    ]
    for name, fn, st_ in checks:
        diff = np.linalg.norm(fn(X, y) - fn(X[:-1], y[:-1]))
        assert diff <= pam.pam_sensitivity(name, st_) * (1 + 1e-6), name


def test_init_bound_is_reached_by_a_worst_case_user():
    """The bound is tight: a user whose paired samples are parallel and whose responses hit the
    clip moves the initialization by exactly P zeta^2."""
    state = _state("full", clip_y=1.0)
    x = np.ones((1, 8, 6), np.float32)
    y = np.full((1, 8), 5.0, np.float32)
    S = from_upper(pam.client_init_stats(x, y, state), 6)
    assert np.linalg.norm(upper(S)) == pytest.approx(pam.pam_sensitivity("init_M", state) * np.linalg.norm(upper(np.ones((6, 6)) / 6)), rel=1e-6)
    assert np.linalg.norm(upper(S)) <= pam.pam_sensitivity("init_M", state)


@pytest.mark.parametrize("schedule,accounted", [("full", 3), ("disjoint", 1)])
def test_accounting_of_both_schedules(schedule, accounted):
    data = make_personal(300, 8, 6, 2, 0.01, seed=1)
    state, ledger, _ = train_personal_inprocess("pam", data, pam.PAMConfig(schedule=schedule, epochs=3), epsilon=2.0, delta=1e-6)
    recs = {r.name: r for r in ledger.releases}
    assert recs["init_M"].count == 1 and recs["am_A"].count == recs["am_b"].count == 3
    assert recs["am_A"].accounted_count == accounted  # disjoint groups: parallel composition
    eps = epsilon_rdp(ledger, 1e-6)
    assert eps == pytest.approx(2.0, rel=1e-3)
    assert gaussian_epsilon_closed_form(zcdp_rho(ledger), 1e-6) == pytest.approx(eps, rel=1e-3)
    assert state.step == 3


def test_subspace_error_falls_with_the_number_of_users():
    errs = []
    for n in (500, 5000):
        data = make_personal(n, 10, 10, 2, 0.0, seed=4)
        state, _, _ = train_personal_inprocess("pam", data, pam.PAMConfig(epochs=3), epsilon=2.0, delta=1e-6, secrets=RunSecrets(7))
        errs.append(evaluate_personal(state, data)["subspace_error"])
    assert errs[1] < 0.5 * errs[0]
    data = make_personal(2000, 10, 10, 2, 0.0, seed=4)
    state, _, _ = train_personal_inprocess("pam-nonprivate", data, pam.PAMConfig(nonprivate_epochs=10), epsilon=None, delta=1e-6)
    assert evaluate_personal(state, data)["subspace_error"] < 1e-3  # noiseless, non-private: exact recovery


def test_private_am_beats_own_data_and_a_single_model():
    data = make_personal(5000, 10, 10, 2, 0.01, seed=2)
    res = {}
    for alg, eps in (("pam", 5.0), ("pam-own-data", None), ("pam-single-model", 5.0), ("pam-nonprivate", None)):
        state, _, _ = train_personal_inprocess(alg, data, pam.PAMConfig(epochs=3), epsilon=eps, delta=1e-6, secrets=RunSecrets(7))  # reproducible: a utility bar
        res[alg] = evaluate_personal(state, data)["test_mse"]
    assert res["pam-nonprivate"] < res["pam"] < 0.5 * min(res["pam-own-data"], res["pam-single-model"])
    assert res["pam-single-model"] > 1.0  # one shared vector cannot fit random personal models


def test_cli_contract_and_bad_input(tmp_path, capsys):
    out = tmp_path / "pam"
    assert main(["run", "pam", "--data", SPEC, "--epsilon", "2", "--delta", "1e-6", "--out", str(out), "--quiet", "--set", "epochs=2"]) == 0
    m = json.loads((out / "metrics.json").read_text())
    ledger = json.loads((out / "ledger.json").read_text())
    assert {"test_mse", "subspace_error", "epsilon_spent", "rho_zcdp", "config"} <= set(m)
    assert m["epsilon_spent"] == pytest.approx(2.0, rel=1e-3) and m["config"]["epochs"] == 2
    assert {r["name"] for r in ledger} == {"init_M", "am_A", "am_b"}
    bad = tmp_path / "bad"
    assert main(["run", "pam", "--data", SPEC, "--epsilon", "2", "--out", str(bad), "--set", "schedule=nope"]) == 2
    assert "schedule" in capsys.readouterr().err and not bad.exists()
    assert main(["run", "adadpals", "--data", SPEC, "--epsilon", "2", "--out", str(bad)]) == 2
    assert "synthetic-personal" in capsys.readouterr().err and not bad.exists()
    assert main(["run", "pam", "--data", "synthetic-mf:users=50,items=20,ratings=300,seed=1", "--epsilon", "2", "--out", str(bad)]) == 2
    assert "synthetic-personal" in capsys.readouterr().err and not bad.exists()
    with pytest.raises(ConfigError, match="k"):
        make_personal(10, 4, 3, 5)


@pytest.mark.flower  # Flower's engine: scripts/test.sh runs it on the newest Flower
@pytest.mark.parametrize("algorithm,schedule", [("pam", "full"), ("pam", "disjoint"), ("pam-exp", "full")])
def test_flower_and_inprocess_engines_agree(algorithm, schedule):
    over = {"epochs": "3", "schedule": schedule, "net_size": "200"}
    mi, li = run(algorithm, SPEC, epsilon=2.0, overrides=dict(over), progress=False, noise_seed=13)
    mf, lf = run(algorithm, SPEC, epsilon=2.0, overrides={**over, "users_per_node": "40"}, engine="ray", progress=False, noise_seed=13)
    assert mf["test_mse"] == pytest.approx(mi["test_mse"], rel=1e-6)
    assert mf["subspace_error"] == pytest.approx(mi["subspace_error"], rel=1e-6, abs=1e-9)
    assert lf == li and mf["rejected_replies"] == []
    assert mf["epsilon_spent"] == pytest.approx(mi["epsilon_spent"], rel=1e-9)
    # info + (init + 3 steps | one score round)
    assert mf["rounds"] == (1 + 1 + 3 if algorithm == "pam" else 1 + 1) and mf["bytes_up"] > 0


def test_exponential_mechanism_net_scores_and_accounting():
    """Alg. 4: each user's score term is in [0, sensitivity] whatever its data; with a large
    epsilon the mechanism picks the net point of lowest score (the closest to U*); the ledger
    holds one pure-DP record, reported as its pure epsilon and as epsilon^2/8-zCDP."""
    from fedpriv.privacy.accounting import epsilon_pure, pld_supported, zcdp_rho

    data = make_personal(3000, 10, 4, 1, 0.01, seed=7)
    cfg = pam.PAMConfig(net_size=300)
    state, _ = pam.new_pam_state("pam-exp", cfg, 4, 1, 10, 1.0, 1e-6)
    net = pam.exp_net(state)
    assert net.shape == (300, 4, 1) and np.allclose(np.einsum("ndk,ndl->nkl", net, net), np.eye(1))
    bound = pam.pam_sensitivity("exp_U", state)
    rng = np.random.default_rng(0)
    wild_x = (1e4 * rng.standard_normal((1, 10, 4))).astype(np.float32)
    wild_y = np.full((1, 10), -1e6, np.float32)
    for X, y in ((wild_x, wild_y), (data.X[:1], data.y[:1]), (np.zeros((1, 10, 4), np.float32), wild_y)):
        s = pam.client_exp_scores(X, y, state, net)
        assert np.all(s >= 0) and np.all(s <= bound * (1 + 1e-12))
    exact = pam.client_exp_scores(data.X, data.y, state, net)
    dist = [pam.subspace_error(U, data.U_star) for U in net]
    assert np.argmin(exact) == np.argmin(dist)  # the score tracks the subspace
    st_hi, led_hi, _ = train_personal_inprocess("pam-exp", data, pam.PAMConfig(net_size=300), epsilon=50.0, delta=1e-6, secrets=RunSecrets(7))
    assert pam.subspace_error(st_hi.U, data.U_star) == pytest.approx(min(dist))
    st, led, _ = train_personal_inprocess("pam-exp", data, pam.PAMConfig(net_size=300), epsilon=0.5, delta=1e-6, secrets=RunSecrets(7))
    [rec] = led.releases
    assert rec.mechanism == "exponential" and rec.pure_epsilon == 0.5 and rec.sensitivity == pytest.approx(bound)
    assert epsilon_pure(led) == 0.5 and zcdp_rho(led) == pytest.approx(0.5**2 / 8) and not pld_supported(led)
    # at epsilon = 0.5 with 3,000 users the selection is still near the best net point
    assert pam.subspace_error(st.U, data.U_star) < 3 * min(dist) + 0.05


def test_pam_exp_cli_reports_the_pure_epsilon(tmp_path):
    out = tmp_path / "exp"
    assert main(["run", "pam-exp", "--data", SPEC, "--epsilon", "1", "--delta", "1e-6", "--out", str(out), "--quiet", "--set", "net_size=100"]) == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["epsilon_pure"] == 1.0 and m["epsilon_spent"] == 1.0 and m["epsilon_spent_rdp"] > 1.0
    assert m["epsilon_spent_pld"] is None and m["rho_zcdp"] == pytest.approx(1 / 8)
    assert [r["mechanism"] for r in json.loads((out / "ledger.json").read_text())] == ["exponential"]


def test_node_replies_are_validated_before_they_are_summed():
    """The personalization aggregator rejects malformed, non-finite and over-bound replies,
    including score vectors outside [0, n * sensitivity] (a node may not lower a candidate's
    score, nor raise it by more than its users can)."""
    from flwr.app import ArrayRecord, ConfigRecord, RecordDict

    from fedpriv.flower import codec
    from fedpriv.algorithms.families import ReplyPart
    from fedpriv.flower.block_server import decode_reply

    def _decode(content, keys, bounds, max_users, ranges):
        parts = [ReplyPart(k, n, bounds[k], ranges.get(k)) for k, n in keys.items()]
        return decode_reply(content, parts, max_users, bounded=True)

    def reply(n_users, **arrays):
        return RecordDict({"contrib": ArrayRecord({k: codec.to_array(np.asarray(v, np.float64)) for k, v in arrays.items()}), "meta": ConfigRecord({"n_users": n_users})})

    keys, bounds, ranges = {"scores": 4}, {"scores": 2.0 * 2}, {"scores": 2.0}
    ok = _decode(reply(2, scores=[0.0, 1.0, 4.0, 3.0]), keys, bounds, 5, ranges)
    assert np.allclose(ok["scores"], [0, 1, 4, 3])
    for bad, why in (
        (reply(2, scores=[0.0, -1.0, 1.0, 1.0]), "outside"),
        (reply(1, scores=[0.0, 2.5, 0.0, 0.0]), "outside"),
        (reply(2, scores=[0.0, np.nan, 0.0, 0.0]), "non-finite"),
        (reply(2, scores=[0.0, 1.0]), "length"),
        (reply(9, scores=[0.0, 0.0, 0.0, 0.0]), "user count"),
        (reply(2, values=[0.0, 0.0, 0.0, 0.0]), "missing"),
    ):
        with pytest.raises(codec.RejectedReply, match=why):
            _decode(bad, keys, bounds, 5, ranges)
