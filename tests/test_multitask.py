"""Task-weighted SSP (Alg. 1) and noisy GD (Alg. 2) of the multi-task paper: sensitivities,
accounting, recovery, the effect of mu, and the Appendix C script."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedpriv.studies import multitask as mt
from fedpriv.privacy.symmetric import upper
from fedpriv.data.synthetic import make_multitask
from fedpriv.errors import ConfigError
from fedpriv.privacy.accounting import epsilon_rdp

SCRIPT = Path(__file__).resolve().parents[1] / "simulations" / "multitask_appendix_c.py"


@pytest.fixture(scope="module")
def data():
    return make_multitask(m=30, d=4, n=1500, a=1.0, tasks_per_user=8, seed=5)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    mode=st.sampled_from(["clip", "normalize"]),
    n_tasks=st.integers(1, 30),
    x_scale=st.sampled_from([0.0, 1e-3, 1.0, 1e3, 1e12]),
    y_scale=st.sampled_from([0.0, 0.5, 1e6, 1e300]),
    mu=st.sampled_from([0.0, 0.5, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_one_user_moves_each_statistic_by_at_most_its_sensitivity(data, mode, n_tasks, x_scale, y_scale, mu, seed):
    """Add one adversarial user (tiny to huge x and y, any number of tasks): the change of the
    counts, of A (upper triangles, what the symmetric release noises), of b and of the gradient
    stays within the declared sensitivity, all tasks stacked."""
    cfg = mt.MultiTaskConfig(beta=2.0, x_clip=1.5, y_clip=0.7, grad_clip=0.9, count_cap=5.0, weight_mode=mode)
    m, n = data.theta.shape[0], data.x.shape[0]
    sens = mt.sensitivities(cfg)
    rng = np.random.default_rng(seed)
    omega = mt.adaptive_omega(rng.uniform(1, 400, m), mu, n + 1, cfg.beta)  # any released counts
    x = np.vstack([data.x, x_scale * rng.standard_normal((1, data.x.shape[1]))])
    new_tasks = rng.choice(m, size=n_tasks, replace=False)
    tasks = np.concatenate([data.tasks, new_tasks]).astype(np.int64)
    users = np.concatenate([data.users, np.full(n_tasks, n)]).astype(np.int64)
    y = np.concatenate([data.y, y_scale * rng.choice([-1.0, 1.0], n_tasks)])
    theta = rng.standard_normal((m, data.x.shape[1]))
    keep = users < n

    def stats(sel, n_users):
        w = mt.user_weights(omega, tasks[sel], users[sel], n_users, cfg.beta, cfg.weight_mode)
        A, b = mt.ssp_statistics(x, tasks[sel], users[sel], y[sel], w, m, cfg.x_clip, cfg.y_clip)
        g = mt.gd_gradient(theta, x, tasks[sel], users[sel], y[sel], w, m, cfg.x_clip, cfg.y_clip, cfg.grad_clip)
        c = mt.count_statistic(tasks[sel], users[sel], m, n_users, cfg.count_cap)
        return c, upper(A), b, g

    full, without = stats(np.ones(len(tasks), bool), n + 1), stats(keep, n + 1)
    for name, a, b_ in zip(("mt_counts", "mt_ssp_A", "mt_ssp_b", "mt_gd_grad"), full, without):
        diff = float(np.linalg.norm(a - b_))
        assert diff <= sens[name] * (1 + 1e-9), name
    # the bounds are reached: a user with >= K tasks, |x| >= G_x and |y| >= G_y (normalize mode
    # puts its whole budget beta on its tasks)
    if mode == "normalize" and x_scale >= 1e3 and y_scale >= 1e6:
        assert np.linalg.norm(full[2] - without[2]) == pytest.approx(sens["mt_ssp_b"], rel=1e-6)
    if n_tasks >= cfg.count_cap:
        assert np.linalg.norm(full[0] - without[0]) == pytest.approx(sens["mt_counts"], rel=1e-9)


@pytest.mark.parametrize("method,steps", [("ssp", 1), ("noisy_gd", 1), ("noisy_gd", 25)])
def test_accounting_spends_the_target_epsilon(data, method, steps):
    cfg = mt.MultiTaskConfig(steps=steps)
    res = mt.run_multitask(data, method, 0.25, 2.0, 1e-5, cfg, seed=1)
    assert {r.name: r.count for r in res.ledger.releases} == {p.name: p.count for p in mt.plan_multitask(method, cfg)}
    assert res.epsilon == pytest.approx(2.0, rel=1e-3) == epsilon_rdp(res.ledger, 1e-5)
    # the counts have sensitivity sqrt(K); the gradient release is one record of T draws
    rec = {r.name: r for r in res.ledger.releases}
    assert rec["mt_counts"].sensitivity == pytest.approx(np.sqrt(cfg.count_cap))
    if method == "noisy_gd":
        assert rec["mt_gd_grad"].count == steps


def test_nonprivate_fits_recover_the_tasks():
    data = make_multitask(m=10, d=3, n=2000, a=1.0, tasks_per_user=5, noise=1e-3, seed=2)
    for method, cfg in (("ssp", mt.MultiTaskConfig(lam=1e-6)), ("noisy_gd", mt.MultiTaskConfig(lam=0.0, steps=400, lr=1.0, grad_clip=10.0, average=False))):
        res = mt.run_multitask(data, method, 0.0, None, cfg=cfg)
        assert res.ledger.releases == [] and res.epsilon is None
        assert res.rmse < 0.01, method  # sigma_F = 1e-3; the domain ball contains every theta_i
        assert np.abs(res.theta - data.theta).max() < 0.05, method


def test_weights_lift_the_tail_tasks_at_high_epsilon():
    """Appendix C in small: with skewed task counts, weights n^-1/2 beat uniform weights."""
    data = make_multitask(m=100, d=5, n=3000, a=1.0, seed=0)
    cfg = mt.MultiTaskConfig(weight_mode="normalize", lam=1.0)
    r0 = np.mean([mt.run_multitask(data, "ssp", 0.0, 10.0, 1e-5, cfg, seed=s).rmse for s in range(3)])
    r2 = np.mean([mt.run_multitask(data, "ssp", 0.5, 10.0, 1e-5, cfg, seed=s).rmse for s in range(3)])
    assert r2 < 0.95 * r0


def test_bad_configuration_names_the_field(data):
    with pytest.raises(ConfigError, match="beta"):
        mt.run_multitask(data, "ssp", 0.0, 1.0, cfg=mt.MultiTaskConfig(beta=0.0))
    with pytest.raises(ConfigError, match="method"):
        mt.run_multitask(data, "sgd", 0.0, 1.0)
    with pytest.raises(ConfigError, match="epsilon"):
        mt.run_multitask(data, "ssp", 0.0, float("nan"))
    with pytest.raises(ConfigError, match="mu"):
        mt.run_multitask(data, "ssp", -1.0, 1.0)
    with pytest.raises(ConfigError, match="steps"):
        mt.run_multitask(data, "noisy_gd", 0.0, 1.0, cfg=dataclasses.replace(mt.MultiTaskConfig(), steps=0))


def test_appendix_c_script_writes_the_table(tmp_path):
    spec = importlib.util.spec_from_file_location("appendix_c", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "appc"
    assert mod.main(["--users", "600", "--tasks", "20", "--seeds", "1", "--epsilon", "2", "--skew", "2", "--methods", "ssp", "--out", str(out)]) == 0
    rep = json.loads((out / "appendix_c.json").read_text())
    rows = [r for r in rep["rows"] if r["epsilon"] is not None]
    assert sorted(r["mu"] for r in rows) == sorted(mod.MUS)
    for r in rows:
        assert all(e == pytest.approx(2.0, rel=1e-3) for e in r["epsilon_spent"])
        assert np.isfinite(r["test_rmse"]) and r["test_rmse"] > 0
    md = (out / "appendix_c.md").read_text()
    assert "mu=1/4" in md and "| 2 |" in md
