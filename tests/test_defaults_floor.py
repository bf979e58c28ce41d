"""Every private algorithm's defaults at least as good as the private bias model (issue 34): the
noise-aware rule reads only public or released numbers and, while the per-item signal is too
weak for factors or an encoder (snr below FACTOR_SNR), makes every member of the ALS family, the
encoder family (AM-SSP, AM-SSP1, AM-DPSGD) and DP-SGD the private bias model, with the reason
in the summary. Checked on two synthetic sets at several epsilons (default runs, no --set)."""

from __future__ import annotations

import pytest

from fedpriv.algorithms import defaults, registry
from fedpriv.run import InProcess, Job

SETS = ("synthetic-mf:users=600,items=120,ratings=15000,seed=5", "synthetic-mf:users=1500,items=400,ratings=40000,seed=6,select=1")
ALGORITHMS = ("adadpals", "dpals-tail", "dpals-uniform", "am-ssp", "am-ssp1", "am-dpsgd", "dpsgd")


@pytest.fixture(scope="module")
def loaded():
    return {spec: Job("als", spec).prepare().dataset for spec in SETS}


@pytest.mark.parametrize("data", SETS)
@pytest.mark.parametrize("epsilon", [0.5, 2.0, 10.0])
def test_default_runs_never_lose_to_the_private_bias_model(loaded, data, epsilon):
    ds = loaded[data]
    floor = Job("bias", data, epsilon=epsilon, noise_seed=3, dataset=ds).prepare().execute(InProcess()).report.metrics["test_rmse"]
    for algorithm in ALGORITHMS:
        out = Job(algorithm, data, epsilon=epsilon, noise_seed=3, dataset=ds).prepare().execute(InProcess())
        assert out.report.metrics["test_rmse"] <= floor + 0.005, (algorithm, out.report.metrics["test_rmse"], floor)
        choice = out.report["noise_aware"]
        assert choice["snr"] < defaults.FACTOR_SNR and "the bias model" in choice["model"]
        assert [r["name"] for r in out.ledger] == ["users", "mean", "bias"]  # the bias model's releases, accounted
        assert out.report.epsilon_spent <= epsilon * (1 + 1e-6)


def test_above_the_threshold_the_encoder_fits_the_residual_and_dpsgd_is_the_bias_model():
    assert defaults.choose("am-ssp", 20, 1e-5, 10000, 70000) == {"bias_stage": True, "bias_prior": True}  # above FACTOR_SNR: the encoder fits the residual
    assert defaults.choose("am-dpsgd", 20, 1e-5, 10000, 70000)["steps"] == 0  # the bias model: its own settings lost to it (10M set)
    assert defaults.choose("am-dpsgd", 20, 1e-5, 10000, 70000, frozenset({"rank"})) == {}
    assert defaults.choose("dpsgd", 1, 1e-5, 1682, 943)["steps"] == 0  # below: the bias model
    assert defaults.choose("dpsgd", 1, 1e-5, 1682, 943, frozenset({"steps"})) == {}  # steps given: its own
    assert registry.get("am-ssp-convex").defaults == ()  # the logistic model is not a rating model: no fallback


def test_ssp1_counts_its_noisings_and_the_fallback_takes_the_bias_models_shares():
    """AM-SSP1 noises each step's statistics once per server step: the rule judges the snr of
    one noising (on a 300k-rating synthetic set at epsilon 20 its own settings at snr 421 lost
    0.057 to the bias model; with 200 noisings one draw's snr is 30). A fallback that starts
    from smaller one-shot shares (AM-DPSGD) gets the bias model's mean share."""
    s = defaults.snr(20, 1e-5, 1000, 6000)
    assert s > defaults.FACTOR_SNR
    assert defaults.choose("am-ssp", 20, 1e-5, 1000, 6000) == {"bias_stage": True, "bias_prior": True}
    assert defaults.choose("am-ssp1", 20, 1e-5, 1000, 6000, noisings=200)["steps"] == 0
    assert defaults.choose("am-ssp1", 20, 1e-5, 1000, 6000, noisings=1) == {"bias_stage": True, "bias_prior": True}
    assert defaults.effective_snr(s, 200) < defaults.FACTOR_SNR
    assert defaults.choose("am-dpsgd", 0.5, 1e-5, 400, 1500)["share_mean"] == 0.02
    assert "share_users" not in dict(registry.get("am-dpsgd").defaults)  # the rule reads the count: the family's share


@pytest.mark.parametrize("algorithm", ["adadpals", "am-ssp"])
def test_the_stage_turned_off_by_hand_still_runs_below_the_threshold(loaded, algorithm):
    """bias_stage=false is the user's: below the threshold the rule cannot make the stage the
    whole model, so the ALS family becomes the bias model through one rank-0 step and an encoder
    keeps its own settings; the run completes (it used to stop after the user count's release)."""
    data = SETS[0]
    out = Job(algorithm, data, epsilon=2.0, noise_seed=3, dataset=loaded[data], params={"bias_stage": False}).prepare().execute(InProcess())
    cfg = out.report.config
    assert cfg["bias_stage"] is False and "bias" not in [r["name"] for r in out.ledger]
    if algorithm == "adadpals":
        assert (cfg["rank"], cfg["steps"]) == (0, 1) and "the bias model" in out.report["noise_aware"]["model"]
    assert out.report.epsilon_spent <= 2.0 * (1 + 1e-6)
