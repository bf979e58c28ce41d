"""A deployment's epsilon holds under the neighbouring relation of the run (issue 41, item 3).

``fedpriv deploy partition`` publishes the exact number of enrolled users (``public/meta.json``;
one node per user by default), so adding or removing a user is not hidden there: only the
replace-one relation (one user's data replaced by anybody's) can hold. A deployment therefore
calibrates and accounts every epsilon under replace-one, and says so in ``metrics.json``
(``neighbouring_relation``), in the run summary and in ``fedpriv privacy plan --deployment``.

The check is an independent recomputation: the ledger's records read with dp-accounting alone
under ``NeighboringRelation.REPLACE_ONE`` (every release moves by at most twice its add/remove
sensitivity, the released user count not at all). Its positive control is the run calibrated
the old way (add/remove): the same recomputation finds its replace-one epsilon about twice the
target, which the old code reported as met.

Unmarked tests start no process (in-process runs of a job whose ``relation`` is replace-one, as
the deployment's ServerApp builds its job); the ``deployment`` test runs ``fedpriv deploy up``
and ``fedpriv deploy run`` on loopback and recomputes from the ledger.json it wrote.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import time
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from fedpriv.cli import main
from fedpriv.errors import ConfigError
from fedpriv.privacy import accounting
from fedpriv.run import Job, RunReport, run

SYN = "synthetic-mf:users=200,items=80,ratings=4000,seed=1"
FIXED = {"rank": "3", "steps": "2", "defaults": "fixed"}
DELTA = 1e-5
# the test's own RDP orders (the same grids as the package's, written out here)
ORDERS = np.unique(np.concatenate([1.0 + np.geomspace(0.011, 2000.0, 600), [4096.0, 8192.0]]))
INTEGER_ORDERS = np.unique(np.concatenate([np.arange(2, 257), np.round(np.geomspace(256, 8192, 150))])).astype(float)


def _replace_one_event(rec: dict):
    """dp-accounting's event of one ledger.json record under replace-one, or None when the
    release cannot move (the released user count: every neighbour has the same n)."""
    if rec["name"] == "users":
        return None
    reps = -(-int(rec["count"]) // int(rec.get("groups", 1)))
    if rec["mechanism"] == "gaussian":
        # replace = remove + add: the sum moves by at most twice the recorded (add/remove)
        # sensitivity; no Poisson-sampled event exists under REPLACE_ONE in dp-accounting's RDP
        event = dp_accounting.GaussianDpEvent(rec["noise_std"] / (2.0 * rec["sensitivity"]))
    elif rec["mechanism"] == "skellam":
        from fedpriv.privacy.distributed import skellam_zcdp  # the mechanism's (xi, rho) bound

        rho, xi = skellam_zcdp(2.0 * rec["sensitivity"], 2.0 * rec["l1_sensitivity"], rec["noise_std"])
        event = dp_accounting.dp_event.ZCDpEvent(rho, xi)
    else:
        raise AssertionError(f"no independent event for {rec['mechanism']}")
    return event if reps == 1 else dp_accounting.SelfComposedDpEvent(event, reps)


def replace_one_epsilon(ledger: list[dict], delta: float = DELTA) -> float:
    """The RDP epsilon of ``ledger.json``'s records under replace-one, by dp-accounting alone."""
    events = [e for e in (_replace_one_event(r) for r in ledger) if e is not None]
    integer = any(r["mechanism"] == "skellam" for r in ledger)
    acc = rdp_privacy_accountant.RdpAccountant(orders=INTEGER_ORDERS if integer else ORDERS, neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    acc.compose(dp_accounting.ComposedDpEvent(events))
    return float(acc.get_epsilon(delta))


def replace_one_pld(ledger: list[dict], delta: float = DELTA) -> float:
    """The PLD epsilon under replace-one: dp-accounting's PLD models the replacement itself
    (a Gaussian's output moves by twice the multiplier's sensitivity), so the multipliers stay
    the recorded ones."""
    acc = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4, neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    for r in ledger:
        if r["name"] != "users":
            acc.compose(dp_accounting.GaussianDpEvent(r["noise_std"] / r["sensitivity"]), int(r["count"]))
    return float(acc.get_epsilon(delta))


def replace_one_run(overrides: dict, noise_seed: int) -> tuple[dict, list[dict]]:
    """(metrics, ledger records) of an in-process run whose job's relation is replace-one."""
    job = Job("adadpals", SYN, epsilon=2.0, noise_seed=noise_seed, params=overrides, relation=accounting.REPLACE_ONE)
    outcome = job.prepare().execute()
    return outcome.report.to_json(), outcome.ledger


@pytest.fixture(scope="module")
def deployed_run():
    """One central-mode run calibrated and accounted as a deployment is (replace-one)."""
    return replace_one_run(FIXED, noise_seed=5)


def test_reported_epsilon_is_the_replace_one_epsilon_recomputed_from_the_ledger(deployed_run):
    metrics, ledger = deployed_run
    assert metrics["neighbouring_relation"] == "replace_one"
    spent = metrics["epsilon_spent"]
    independent = replace_one_epsilon(ledger)
    assert independent == pytest.approx(spent, rel=1e-9)
    assert spent <= 2.0 * (1 + 1e-6) and spent == pytest.approx(2.0, rel=1e-3)  # the target is what holds
    pld = replace_one_pld(ledger)
    assert metrics["epsilon_spent_pld"] == pytest.approx(pld, rel=1e-6) and pld < spent
    # the package's own reading of the same records agrees
    from fedpriv.privacy.records import records_from_list

    recs = records_from_list(ledger)
    assert accounting.epsilon_bounds(recs, DELTA, relation="replace_one")[0] == pytest.approx(spent, rel=1e-12)
    # under add/remove the same ledger spends less than half of it (it is not what holds here)
    assert accounting.epsilon_bounds(recs, DELTA, relation="add_remove")[0] < 0.5 * spent


def test_positive_control_the_add_remove_calibration_does_not_hold_under_replace_one():
    """The run calibrated the old way reports its target met, but its replace-one epsilon,
    recomputed by the same independent check, is more than twice the target."""
    metrics, ledger = run("adadpals", SYN, epsilon=2.0, overrides=FIXED, progress=False, noise_seed=5)
    assert "neighbouring_relation" not in metrics  # add/remove: no deployment
    assert metrics["epsilon_spent"] == pytest.approx(2.0, rel=1e-3)
    assert replace_one_epsilon(ledger) > 2.0 * 2.0


def test_secure_mode_ledger_holds_under_replace_one():
    """Secure aggregation (the default of `fedpriv deploy run`): Skellam records, integer orders."""
    metrics, ledger = replace_one_run({**FIXED, "aggregation": "secure", "users_per_shard": "40"}, noise_seed=6)
    assert {r["mechanism"] for r in ledger} == {"skellam"} and metrics["neighbouring_relation"] == "replace_one"
    assert replace_one_epsilon(ledger) == pytest.approx(metrics["epsilon_spent"], rel=1e-9)
    assert metrics["epsilon_spent"] <= 2.0 * (1 + 1e-6) and metrics["epsilon_spent"] == pytest.approx(2.0, rel=2e-3)


def test_summary_and_report_state_the_relation(deployed_run):
    metrics, _ = deployed_run
    report = RunReport.from_metrics(metrics)
    assert report.neighbouring_relation == "replace_one"
    assert "replace-one" in report.summary()
    plain = RunReport.from_metrics({**{k: v for k, v in metrics.items() if k != "neighbouring_relation"}})
    assert plain.neighbouring_relation == "add_remove" and "replace-one" not in plain.summary()


def test_privacy_plan_deployment_is_what_the_deployed_run_records(deployed_run, capsys):
    """`fedpriv privacy plan --deployment` plans under replace-one: its multipliers are the
    deployed run's, and its epsilon is the ledger's."""
    _, ledger = deployed_run
    args = ["privacy", "plan", "adadpals", "--epsilon", "2", *sum((["--set", f"{k}={v}"] for k, v in FIXED.items()), []), "--json"]
    assert main([*args, "--deployment"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["neighbouring_relation"] == "replace_one"
    got = {r["name"]: r["noise_multiplier"] for r in ledger}
    assert {r["release"]: r["noise_multiplier"] for r in plan["releases"]} == pytest.approx(got, rel=1e-12)
    assert plan["epsilon_rdp"] == pytest.approx(replace_one_epsilon(ledger), rel=1e-9)
    assert next(r for r in plan["releases"] if r["release"] == "users")["epsilon_alone"] == 0.0  # the count cannot move
    assert main(args) == 0
    plain = json.loads(capsys.readouterr().out)
    assert plain["neighbouring_relation"] == "add_remove"
    # the same target buys less noise under add/remove (the old, wrong plan for a deployment)
    assert all(r["noise_multiplier"] < got[r["release"]] for r in plain["releases"])
    assert main([*args[:-1], "--deployment"]) == 0
    assert "replace one user's data" in capsys.readouterr().out


def test_replace_one_restatement_and_bad_relation():
    from fedpriv.privacy.records import Release

    sampled = Release("step", "gaussian", 1.5, 3.0, 4, 0.1)
    r = accounting.replace_one_record(sampled)
    assert r.sensitivity == 3.0 and r.noise_multiplier == 1.0 and r.sampling_rate is None and r.count == 4
    assert accounting.replace_one_record(Release("users", "gaussian", 1.0, 50.0)) is None
    pure = accounting.replace_one_record(Release("sel", "selection", 1.0, 2.0, 1, None, 5, 1, 0.5, True))
    assert pure.pure_epsilon == 1.0  # group privacy of two
    # dp-accounting's RDP accountant refuses a Poisson-sampled event under replace-one: the
    # restated (unsampled) record is what it can compose
    acc = rdp_privacy_accountant.RdpAccountant(orders=[2.0], neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    with pytest.raises(dp_accounting.UnsupportedEventError):
        acc.compose(sampled.to_event())
    assert math.isfinite(accounting.epsilon_rdp([sampled], DELTA, relation="replace_one"))
    with pytest.raises(ConfigError) as err:
        accounting.check_relation("replace-two")
    assert err.value.field == "neighbouring"
    with pytest.raises(ConfigError) as err:
        Job("adadpals", SYN, epsilon=2.0, relation="both").prepare()
    assert err.value.field == "relation"


def test_noise_aware_rule_reads_the_relation():
    """Under replace-one the same (epsilon, delta) buys half the signal per noise std: the
    noise-aware rule's snr halves (else it picks the settings of a budget twice as large)."""
    from fedpriv.algorithms import defaults

    s = defaults.snr(5.0, DELTA, 1682, 943)
    assert defaults.snr(5.0, DELTA, 1682, 943, accounting.REPLACE_ONE) == pytest.approx(s / 2)


def test_serverapp_reads_the_relation_from_its_run_config():
    """The ServerApp's run-config key ``neighbouring`` (``fedpriv deploy run`` sets replace_one):
    absent means add/remove, a bad value is refused naming the key."""
    from fedpriv.ops.flwr_app import relation_of_run_config

    assert relation_of_run_config({}) == "add_remove"
    assert relation_of_run_config({"neighbouring": "replace_one"}) == "replace_one"
    with pytest.raises(ConfigError) as err:
        relation_of_run_config({"neighbouring": "REPLACE_ONE"})
    assert err.value.field == "neighbouring"


# ------------------------------------------------------------------------------ deployment
@pytest.mark.deployment
def test_deploy_run_states_replace_one_and_its_ledger_holds_under_it(tmp_path, capsys):
    """`fedpriv deploy up` + `fedpriv deploy run` (central aggregation: fewer rounds; the secure
    runs of tests/test_deploy.py go through the same check in ``Deployment.execute``): the printed summary,
    metrics.json and the run summary state replace-one, and the epsilon recomputed from the
    ledger.json it wrote, under replace-one with dp-accounting alone, is the reported one and
    meets the target."""
    from fedpriv.ops import deploy, launcher

    run_dir = tmp_path / "run"
    data = "synthetic-mf:users=60,items=40,ratings=1500,seed=3"
    try:
        # a central run: its nodes' own policy must allow it (a deployment's default is secure)
        assert main(["deploy", "up", "--run-dir", str(run_dir), "--data", data, "--users-per-node", "20", "--wait", "240",
                     "--node-policy", "aggregation=central"]) == 0
        capsys.readouterr()
        t0 = time.perf_counter()
        assert main(["deploy", "run", "--run-dir", str(run_dir), "adadpals", "--epsilon", "1", "--set", "rank=2", "--set", "steps=1", "--set", "defaults=fixed",
                     "--aggregation", "central", "--node-wait", "60", "--timeout", "900"]) == 0
        cap = capsys.readouterr()
        printed = json.loads(cap.out.strip().splitlines()[-1])
        assert printed["neighbouring_relation"] == "replace_one"
        assert "replace-one neighbours" in cap.out + cap.err  # the ServerApp's summary table, streamed by `flwr run --stream`
        metrics = json.loads((run_dir / "out" / "metrics.json").read_text())
        ledger = json.loads((run_dir / "out" / "ledger.json").read_text())
        assert metrics["neighbouring_relation"] == "replace_one" and metrics["aggregation"] == "central"
        assert "replace-one" in RunReport.read(run_dir / "out" / "metrics.json").summary()
        independent = replace_one_epsilon(ledger)
        assert independent == pytest.approx(metrics["epsilon_spent"], rel=1e-9) == pytest.approx(printed["epsilon_spent"], rel=1e-12)
        assert independent <= 1.0 * (1 + 1e-6) and independent == pytest.approx(1.0, rel=1e-3)
        assert replace_one_pld(ledger) == pytest.approx(metrics["epsilon_spent_pld"], rel=1e-6)
        print(f"\ndeploy run (replace-one): epsilon {independent:.5f}, {time.perf_counter() - t0:.1f} s")
    finally:
        seen = [int(e["pid"]) for e in deploy.running(deploy.DeployConfig.load(run_dir))] if (run_dir / "deploy.json").is_file() else []
        deploy.stop(run_dir)
        deadline = time.time() + 20
        while time.time() < deadline and any(launcher.pid_alive(p) for p in seen):
            time.sleep(0.2)
