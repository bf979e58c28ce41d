"""Two-armed bandit under distribution shift (fedpriv.studies.selection.bandit)."""

import argparse
import json
import math

import numpy as np
import pytest

from fedpriv.errors import ConfigError
from fedpriv.privacy.accounting import epsilon_bounds
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.studies.selection import bandit
from fedpriv.studies.selection.bandit import ACTION_NAME, MEAN_PREFIX, QUANTILE_PREFIX, Environment, HybridCounter, private_quantile, simulate_bandit

DELTA = 1e-6


# ---------------------------------------------------------------- hybrid counter
def _push_all(counter: HybridCounter, values: np.ndarray) -> list[np.ndarray]:
    """Push the same sequence into every stream; the estimates after each push."""
    out = []
    mask = np.ones(counter.S, dtype=bool)
    for v in values:
        counter.push(mask, np.full(counter.S, v))
        out.append(counter.estimates().copy())
    return out


@pytest.mark.parametrize("horizon", [95, None])
def test_hybrid_counter_is_unbiased_with_the_exact_variance(horizon):
    S, P = 6000, 95
    counter = HybridCounter(PrivacyLedger(seed=11), S, 2.0, horizon=horizon)
    values = np.random.default_rng(3).random(P)
    est = _push_all(counter, values)
    true = np.cumsum(values)
    for p in range(1, P + 1):
        err = est[p - 1] - true[p - 1]
        var = counter.noise_variance(p)
        assert abs(err.mean()) < 5.0 * math.sqrt(var / S), p
        assert err.var() == pytest.approx(var, rel=0.15), p
    # an epoch end carries only the logarithmic mechanism's noise: (k + 1) epoch totals
    assert counter.noise_variance(63) == pytest.approx(6 * 2.0 / counter.eps_log**2)


def test_hybrid_counter_variance_is_polylogarithmic():
    """At most log2(p) + 1 epoch totals and one block per level below the epoch: the variance is
    O(log p) Laplace terms (O(log^3 p) for the horizon-bounded budget split), not O(p)."""
    N = 2**20
    for horizon in (N, None):
        c = HybridCounter(PrivacyLedger(seed=0), 1, 1.0, horizon=horizon)
        ps = np.unique(np.concatenate([np.arange(1, 4096), np.random.default_rng(0).integers(1, N, 4000), [N - 1]]))
        for p in ps:
            k = int(p).bit_length() - 1
            terms = [1.0 / c.eps_log**2] * (k + 1) + [1.0 / c.level_epsilon(lvl) ** 2 for lvl in range(k)]
            assert c.noise_variance(int(p)) <= 2.0 * sum(terms) * (1 + 1e-12)
        assert c.noise_variance(N - 1) < 0.05 * 2.0 * (N - 1)  # per-item Laplace(1/eps) noise: 2 p / eps^2


def test_hybrid_counter_charges_each_reward_once_per_level():
    """Streams advance asynchronously; every (log / level) name is one record accounted once,
    and the accountant's epsilon is the sum over the levels of their epsilons = epsilon."""
    H, eps, S = 95, 1.5, 7
    led = PrivacyLedger(seed=5)
    counter = HybridCounter(led, S, eps, horizon=H)
    rng = np.random.default_rng(1)
    while counter.counts.max() < H:
        mask = (rng.random(S) < 0.7) & (counter.counts < H)
        counter.push(mask, rng.random(S))
    names = {r.name for r in led.releases}
    L = counter.levels
    assert L == 6 and names == {MEAN_PREFIX + "log"} | {f"{MEAN_PREFIX}level{lvl}" for lvl in range(L)}
    assert len(led.releases) == len(names)  # one record per level
    assert all(r.accounted_count == 1 for r in led.releases)
    spent, rdp, pure = epsilon_bounds(led, DELTA)
    per_level = [epsilon_bounds([r], DELTA)[2] for r in led.releases]
    assert pure == pytest.approx(sum(per_level), rel=1e-6)
    assert pure == pytest.approx(eps, rel=1e-6)
    assert spent <= eps * (1 + 1e-9)
    with pytest.raises(ConfigError, match="horizon"):
        counter.push(np.ones(S, dtype=bool), np.zeros(S))  # a stream would pass the declared horizon
    assert len(led.releases) == len(names) and counter.counts.max() == H


def test_hybrid_counter_unbounded_horizon_stays_within_epsilon():
    led = PrivacyLedger(seed=2)
    counter = HybridCounter(led, 3, 1.0, horizon=None)
    _push_all(counter, np.full(300, 0.5))
    assert all(r.accounted_count == 1 for r in led.releases)
    assert epsilon_bounds(led, DELTA)[2] < 1.0


def test_private_quantile_is_accurate_and_each_window_is_charged_once():
    led = PrivacyLedger(seed=4)
    rng = np.random.default_rng(0)
    for _ in range(3):
        w = rng.random(2000)
        assert private_quantile(led, "q", w, 0.1, 20.0) == pytest.approx(0.1, abs=0.02)
    (rec,) = led.releases
    assert rec.accounted_count == 1
    assert epsilon_bounds(led, DELTA)[0] == pytest.approx(20.0, rel=1e-6)


# ---------------------------------------------------------------- the paper's observations
def test_environment_has_positive_correlation_before_and_after_the_shift():
    env = Environment()
    for after in (False, True):
        m, s = env.clipped_means(after), env.spreads(after)
        assert np.sign(m[1] - m[0]) == np.sign(s[1] - s[0]) != 0
    assert np.argmax(env.clipped_means(False)) == 1 and np.argmax(env.clipped_means(True)) == 0


@pytest.fixture(scope="module")
def shift_runs():
    kw = dict(T=2000, reps=8, seed=1)
    runs = {"ucb(c=0.1)": simulate_bandit("ucb", ucb_c=0.1, **kw), "ucb(c=1.41)": simulate_bandit("ucb", ucb_c=math.sqrt(2), **kw)}
    for p in ("rnm", "krr", "gem", "mgem", "rs"):
        runs[p] = simulate_bandit(p, return_ledger=True, **kw)
    return runs


def test_low_optimism_ucb_gets_stuck_after_the_shift_and_private_policies_adapt(shift_runs):
    stuck = shift_runs["ucb(c=0.1)"]
    assert stuck["pre_shift_arm1_share"] > 0.9 and stuck["post_shift_arm1_share"] > 0.6
    for p in ("rnm", "mgem", "rs"):
        assert shift_runs[p]["post_shift_regret_mean"] < 0.9 * stuck["post_shift_regret_mean"], p
    assert shift_runs["mgem"]["post_shift_arm1_share"] < 0.5
    # what the paper does not say: textbook UCB (c = sqrt 2 on [0, 1] rewards) adapts quickly
    assert shift_runs["ucb(c=1.41)"]["post_shift_arm1_share"] < 0.15


def test_mgem_is_the_best_private_policy(shift_runs):
    final = {p: r["final_regret_mean"] for p, r in shift_runs.items() if r["private"]}
    assert min(final, key=final.get) == "mgem"


def test_private_policies_account_each_component_once(shift_runs):
    for p in ("rnm", "krr", "gem", "mgem", "rs"):
        r = shift_runs[p]
        assert 0.9 < r["epsilon_means"] <= 1.0 + 1e-9, p  # not every level is reached at T = 2000
        if p == "krr":
            assert r["epsilon_quantiles"] is None
        else:
            assert r["epsilon_quantiles"] == pytest.approx(1.0, rel=1e-6), p
        actions = [rec for rec in r["ledger"].releases if rec.name == ACTION_NAME]
        assert actions and all(rec.pure_epsilon == 1.0 and rec.accounted_count == 1 for rec in actions), p
        assert sum(rec.count for rec in actions) == 2000 * 8  # one selection per user


def test_each_action_is_charged_eps_select_once(shift_runs):
    for p in ("rnm", "gem", "mgem", "rs"):
        assert shift_runs[p]["epsilon_per_action"] == pytest.approx(1.0, rel=1e-6), p


# ---------------------------------------------------------------- every private draw through the ledger
def test_guard_catches_draws_outside_the_ledger(strictly_guarded_rng):
    with pytest.raises(AssertionError, match="outside the privacy ledger"):
        np.random.default_rng(0).laplace(size=2)
    with pytest.raises(AssertionError, match="outside the privacy ledger"):
        np.random.Generator(np.random.PCG64(0)).gumbel(size=2)
    assert strictly_guarded_rng == ["laplace", "gumbel"]


@pytest.mark.parametrize("policy", bandit.PRIVATE)
def test_private_policies_draw_only_through_the_ledger(strictly_guarded_rng, policy):
    res = simulate_bandit(policy, T=300, reps=3, seed=2, window=20, return_ledger=True)
    assert strictly_guarded_rng == []
    names = {r.name for r in res["ledger"].releases}
    assert ACTION_NAME in names and any(n.startswith(MEAN_PREFIX) for n in names)
    assert any(n.startswith(QUANTILE_PREFIX) for n in names) == (policy in bandit.NEEDS_SENSITIVITIES)
    assert res["ledger"].releases and np.isfinite(res["final_regret_mean"])


# ---------------------------------------------------------------- outputs and arguments
def test_run_bandit_writes_json_and_png_atomically(tmp_path):
    out = tmp_path / "b"
    doc = bandit.run_bandit(out, ["ucb", "krr", "mgem"], T=300, reps=2, seed=0)
    assert sorted(p.name for p in out.iterdir()) == ["bandit.json", "bandit.png"]
    assert (out / "bandit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    back = json.loads((out / "bandit.json").read_text())
    assert back["summary"] == doc["summary"]
    labels = [r["label"] for r in back["rows"]]
    assert labels == ["ucb(c=1.41)", "ucb(c=0.1)", "krr", "mgem"]
    for r in back["rows"]:
        assert {"final_regret_mean", "final_regret_std", "regret_at_shift_mean", "epsilon_per_action", "epsilon_means"} <= set(r)
        assert (r["epsilon_per_action"] is None) == (not r["private"])
    assert len(back["curves"]["t"]) == len(back["curves"]["mgem"]["mean"])


def _args(tmp_path, **kw):
    ap = argparse.ArgumentParser()
    bandit.add_bandit_arguments(ap)
    argv = ["--out", str(tmp_path / "o")]
    for k, v in kw.items():
        argv += [f"--{k.replace('_', '-')}", *([str(x) for x in v] if isinstance(v, list) else [str(v)])]
    return ap.parse_args(argv)


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"horizon": 1}, "horizon"),
        ({"reps": 0}, "reps"),
        ({"seed": -1}, "seed"),
        ({"policies": ["ucb,nope"]}, "policies"),
        ({"eps_select": 0}, "eps_select"),
        ({"eps_mean": "nan"}, "eps_mean"),
        ({"eps_quantile": -1}, "eps_quantile"),
        ({"window": 1}, "window"),
        ({"ucb_c": [-1]}, "ucb_c"),
    ],
)
def test_bad_command_arguments_raise_config_error(tmp_path, kw, field):
    args = _args(tmp_path, horizon=kw.pop("horizon", 50), reps=kw.pop("reps", 1), **kw)
    with pytest.raises(ConfigError) as exc:
        bandit.bandit_command(args)
    assert exc.value.field == field
    assert not (tmp_path / "o").exists()


def test_bad_simulate_arguments_raise_config_error():
    for kw in ({"policy": "nope"}, {"T": 1}, {"reps": 0}, {"shift_at": 20}, {"window": 0}, {"eps_mean": float("inf")}):
        args = {"policy": "ucb", "T": 10, "reps": 1, **kw}
        with pytest.raises(ConfigError):
            simulate_bandit(**args)
    with pytest.raises(ConfigError, match="eps_mean"):
        HybridCounter(PrivacyLedger(seed=0), 2, 0.0)
    with pytest.raises(ConfigError, match="policies"):
        bandit.run_bandit("unused", [], T=10, reps=1)


def test_command_quick_smoke(tmp_path, capsys):
    args = _args(tmp_path, horizon=200, reps=2, policies=["ucb", "mgem"])
    assert bandit.bandit_command(args) == 0
    assert "mgem" in capsys.readouterr().out
    assert (tmp_path / "o" / "bandit.json").exists()
