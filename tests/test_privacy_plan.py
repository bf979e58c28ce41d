"""Budget plans, private tuning by random stopping, and independent checks of the accountants."""

import json
import math

import numpy as np
import pytest
from scipy.stats import norm

from fedpriv.algorithms.als import ALSConfig
from fedpriv.cli import main
from fedpriv.errors import ConfigError
from fedpriv.privacy import tnb
from fedpriv.privacy.accounting import PlannedRelease, calibrate, epsilon_pld, epsilon_rdp, rdp_curve
from fedpriv.privacy.ledger import PrivacyLedger, Release, RepeatAndSelect
from fedpriv.algorithms.plans import budget_plan
from fedpriv.privacy.plan import TuningPlan
from fedpriv.run import run

SYN = "synthetic-mf:users=300,items=80,ratings=6000,seed=1"


# ---------------------------------------------------------------- PLD against the exact Gaussian
def exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """Exact epsilon of a mu-GDP mechanism (Balle and Wang 2018; Dong, Roth and Su 2019):
    delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2), solved for eps by bisection.
    Composed unsampled Gaussians with multipliers z_k (count c_k) are mu-GDP with
    mu = sqrt(sum c_k / z_k^2): independent of dp-accounting."""

    def d(eps):
        return norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)

    lo, hi = 0.0, 1.0
    while d(hi) > delta:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if d(mid) > delta else (lo, mid)
    return hi


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 5.0, 20.0])
def test_calibrated_plan_pld_matches_the_exact_gaussian_within_1_percent(epsilon):
    plan = budget_plan("adadpals", ALSConfig(steps=4), epsilon, 1e-5)
    recs = plan.records()
    mu = math.sqrt(sum(r.count / r.noise_multiplier**2 for r in recs))
    exact = exact_gaussian_epsilon(mu, 1e-5)
    assert abs(epsilon_pld(recs, 1e-5) - exact) / exact < 0.01
    # RDP (what is reported) is an upper bound on the exact value and meets the target
    assert exact <= epsilon_rdp(recs, 1e-5) <= epsilon * (1 + 1e-9)


# ---------------------------------------------------------------- plan object
def test_plan_reports_what_a_run_records():
    cfg_over = {"rank": "3", "steps": "2", "defaults": "fixed"}  # noise-aware runs re-plan after the count
    plan = budget_plan("adadpals", ALSConfig.from_overrides(cfg_over, "adadpals"), 2.0, 1e-5)
    _, ledger = run("adadpals", SYN, epsilon=2.0, overrides=cfg_over, progress=False)
    got = {r["name"]: (r["count"], r["noise_multiplier"], r["sensitivity"]) for r in ledger}
    want = {r.name: (r.count, r.noise_multiplier, r.sensitivity) for r in plan.run_records()}
    assert got.keys() == want.keys()
    for k in want:
        assert got[k][0] == want[k][0]
        assert got[k][1] == pytest.approx(want[k][1], rel=1e-12) and got[k][2] == pytest.approx(want[k][2])
    s = plan.summary()
    assert s["epsilon_rdp"] == pytest.approx(2.0, rel=1e-3)
    assert 0 < s["epsilon_pld"] < s["epsilon_rdp"]
    assert s["rho_zcdp"] == pytest.approx(sum(r.count / (2 * r.noise_multiplier**2) for r in plan.records()))
    fractions = [r["budget_fraction"] for r in plan.rows()]
    assert sum(fractions) == pytest.approx(1.0)


def test_sampled_plan_has_no_rho_and_tuned_plan_no_pld():
    assert budget_plan("am-dpsgd", ALSConfig(steps=3), 1.0, 1e-5).summary()["rho_zcdp"] is None
    tuned = budget_plan("adadpals", ALSConfig(steps=2), 1.0, 1e-5, tuning=TuningPlan(mean=3))
    s = tuned.summary()
    assert s["epsilon_pld"] is None and s["rho_zcdp"] is None and s["rho_zcdp_one_run"] > 0
    assert s["epsilon_rdp"] == pytest.approx(1.0, rel=1e-3)
    assert "valid_score" in {r["release"] for r in tuned.rows()}


def test_privacy_plan_cli(capsys):
    assert main(["privacy", "plan", "adadpals", "--epsilon", "3", "--set", "steps=2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["epsilon_rdp"] == pytest.approx(3.0, rel=1e-3) and out["epsilon_pld"] < out["epsilon_rdp"]
    assert [r["release"] for r in out["releases"]] == ["users", "mean", "counts", "bias", "item_stats_b", "item_stats_A"]
    assert main(["privacy", "plan", "adadpals", "--epsilon", "3"]) == 0
    assert "| item_stats_A | 3 |" in capsys.readouterr().out
    assert main(["privacy", "plan", "als", "--epsilon", "3"]) == 2
    assert main(["privacy", "plan", "adadpals", "--epsilon", "3", "--set", "nope=1"]) == 2
    assert "nope" in capsys.readouterr().err


# ---------------------------------------------------------------- truncated negative binomial
@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("mean", [1.5, 5.0, 20.0])
def test_tnb_matches_dp_accounting_and_samples_its_pmf(eta, mean):
    from dp_accounting.rdp.rdp_privacy_accountant import _gamma_truncated_negative_binomial

    gamma = tnb.gamma_for_mean(eta, mean)
    assert gamma == pytest.approx(_gamma_truncated_negative_binomial(eta, mean), rel=1e-6)
    k = np.arange(1, 20_000)
    p = tnb.pmf(k, eta, gamma)
    assert p.sum() == pytest.approx(1.0, abs=1e-6)
    assert (k * p).sum() == pytest.approx(mean, rel=1e-4)
    rng = np.random.default_rng(0)
    draws = np.array([tnb.sample(rng, eta, mean) for _ in range(4000)])
    assert draws.min() >= 1
    assert abs(draws.mean() - mean) < 5 * math.sqrt((k**2 * p).sum() - mean**2) / math.sqrt(4000)
    assert np.mean(draws == 1) == pytest.approx(p[0], abs=0.035)


# ---------------------------------------------------------------- repeat-and-select accounting
def p_s_theorem2(orders, rdp, eta, gamma, mean):
    """Papernot and Steinke (2022), Theorem 2, evaluated independently of dp-accounting: RDP at
    order lam of the best of K ~ D_{eta,gamma} runs <= eps(lam) + (1+eta)(1 - 1/lh) eps(lh)
    + (1+eta) log(1/gamma)/lh + log(E[K])/(lam - 1), minimised over lh >= 1."""
    out = np.full(len(orders), np.inf)
    for i, lam in enumerate(orders):
        if lam <= 1:
            continue
        best = min((1 + eta) * (1 - 1 / lh) * e + (1 + eta) * math.log(1 / gamma) / lh for lh, e in zip(orders, rdp) if lh >= 1)
        out[i] = rdp[i] + best + math.log(mean) / (lam - 1)
    return out


@pytest.mark.parametrize("eta,mean", [(1.0, 5.0), (0.0, 3.0), (2.0, 10.0)])
def test_repeat_and_select_rdp_follows_papernot_steinke_theorem_2(eta, mean):
    base = [Release("A", "gaussian", 1.0, 3.0, 4), Release("b", "gaussian", 1.0, 3.0, 4)]
    orders, rdp = rdp_curve(base)
    orders_t, rdp_t = rdp_curve([RepeatAndSelect("t", mean, eta, 0, base)])
    mine = p_s_theorem2(orders, rdp, eta, tnb.gamma_for_mean(eta, mean), mean)
    sel = (orders > 1.5) & (orders < 200)
    # RDP is non-decreasing in the order, so the bound at lam also holds at every lower order:
    # dp-accounting reports the running minimum of the theorem's bound from above
    monotone = np.minimum.accumulate(mine[::-1])[::-1]
    assert np.allclose(rdp_t[sel], monotone[sel], rtol=1e-6)
    assert np.all(rdp_t[sel] <= mine[sel] * (1 + 1e-9))
    assert epsilon_rdp([RepeatAndSelect("t", mean, eta, 0, base)], 1e-5) > epsilon_rdp(base, 1e-5)


def test_calibration_with_tuning_meets_the_target():
    plan = [PlannedRelease("A", 3, 0.5), PlannedRelease("b", 3, 0.5)]
    plain, tuned = calibrate(plan, 2.0, 1e-5), calibrate(plan, 2.0, 1e-5, repeat=(5.0, 1.0))
    assert tuned.scale > plain.scale  # tuning costs noise
    rels = [Release(p.name, "gaussian", 1.0, tuned.multipliers[p.name], p.count) for p in plan]
    assert epsilon_rdp([RepeatAndSelect("t", 5.0, 1.0, 0, rels)], 1e-5) == pytest.approx(2.0, rel=1e-3)


def test_ledger_refuses_tuning_runs_with_different_plans():
    a, b = PrivacyLedger(seed=0), PrivacyLedger(seed=1)
    a.gaussian("x", np.zeros(2), sensitivity=1.0, noise_multiplier=2.0)
    b.gaussian("x", np.zeros(2), sensitivity=1.0, noise_multiplier=3.0)
    with pytest.raises(Exception, match="other releases"):
        PrivacyLedger().repeat_and_select("t", [a, b], shape=1.0, mean=2.0)


# ---------------------------------------------------------------- private tuning end to end
def test_private_tuning_run_is_accounted_as_one_repeat_and_select(tmp_path, capsys):
    out = tmp_path / "tuned"
    args = ["run", "adadpals", "--data", SYN, "--epsilon", "2", "--out", str(out), "--quiet", "--set", "steps=2"]
    assert main([*args, "--tune", "mu=0/0.5", "--tune", "rank=2/3", "--tune-mean", "3"]) == 0
    m = json.loads((out / "metrics.json").read_text())
    ledger = json.loads((out / "ledger.json").read_text())
    assert len(ledger) == 1 and ledger[0]["mechanism"] == "repeat_and_select"
    rec = ledger[0]
    # K and the other runs are published nowhere: not in the ledger, not in the metrics
    assert "runs" not in rec and "runs" not in m["tuning"] and "runs_drawn" not in m["tuning"]
    assert "selected_run" not in m["tuning"] and m["wall_seconds"] is None
    text = json.dumps(m)
    assert "noised_score_sum\"" not in text.replace("selected_noised_score_sum\"", "")
    assert {r["name"] for r in rec["releases"]} == {"users", "mean", "counts", "bias", "item_stats_A", "item_stats_b", "valid_score"}
    assert m["epsilon_spent"] == pytest.approx(2.0, rel=1e-3) and m["epsilon_spent_pld"] is None
    # the accountant recomputes the same epsilon from ledger.json alone
    assert epsilon_rdp(PrivacyLedger.releases_from_list(ledger), 1e-5) == pytest.approx(m["epsilon_spent"], rel=1e-9)
    assert math.isfinite(m["tuning"]["selected_noised_score_sum"])
    assert m["config"]["rank"] == m["tuning"]["selected"]["rank"] and m["config"]["mu"] == m["tuning"]["selected"]["mu"]
    assert math.isfinite(m["test_rmse"])


def test_tuning_refuses_keys_that_change_the_plan(tmp_path):
    with pytest.raises(ConfigError, match="tune"):
        run("adadpals", SYN, epsilon=2.0, overrides={"tune": "steps=1/2"}, progress=False)
    with pytest.raises(ConfigError, match="tune"):
        run("adadpals", SYN, epsilon=2.0, overrides={"tune": "mu"}, progress=False)
    with pytest.raises(ConfigError, match="tune_mean"):
        run("adadpals", SYN, epsilon=2.0, overrides={"tune": "mu=0/1", "tune_mean": "0.5"}, progress=False)


def test_fair_allocation_gives_each_sampled_release_its_rdp_fraction_at_the_optimal_order():
    """DP-SGD's plan: the sampled gradient release gets a smaller multiplier than the share rule
    gave it, the one-shot releases keep z = s / sqrt(share), and at the composition's optimal
    order every release spends exactly its fraction; the plan still spends the target."""
    from fedpriv.algorithms.als import ALSConfig, plan_releases
    from fedpriv.privacy import accounting as acc

    plan = plan_releases("dpsgd", ALSConfig.from_overrides({}, "dpsgd"), False)
    fair, before = calibrate(plan, 5.0, 1e-5), calibrate(plan, 5.0, 1e-5, fair=False)
    assert fair.multipliers["dpsgd_grad"] < before.multipliers["dpsgd_grad"]
    assert fair.epsilon == pytest.approx(5.0, rel=1e-3) and fair.epsilon <= 5.0
    rels = acc._plan_releases(plan, fair.scale)  # noqa: SLF001 - the share rule at the same scale
    order = acc._optimal_order([acc.Release(p.name, "gaussian", 1.0, fair.multipliers[p.name], p.count, p.sampling_rate) for p in plan], 1e-5)  # noqa: SLF001
    for p in plan:
        z = fair.multipliers[p.name]
        spent = acc._sampled_rdp(p.sampling_rate, z, order) if p.sampling_rate else order / (2 * z * z)  # noqa: SLF001
        assert spent == pytest.approx(p.share * order / (2 * fair.scale**2), rel=1e-3), p.name
    assert {r.name for r in rels} == {p.name for p in plan}
