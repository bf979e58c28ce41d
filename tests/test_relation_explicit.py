"""The neighbouring relation is a parameter of the job, never ambient state.

A run's epsilon holds under one neighbouring relation: add/remove one user (the default), or
replace one user's data (a deployment, whose enrolled count is public). The relation changes the
calibration, the noise-aware rule and ``metrics.json``, so it travels with the job
(:attr:`fedpriv.run.Job.relation`), its plan, its ledger (:attr:`PrivacyLedger.relation`) and its
accountants: a plan prepared once gives the same numbers wherever and however it is executed
(another thread, the Flower server logic), and nothing in :mod:`fedpriv.privacy.accounting`
holds a relation of its own.
"""

from __future__ import annotations

import contextvars
import subprocess
import sys
import threading

import numpy as np
import pytest

from fedpriv.errors import ConfigError, PrivacyError
from fedpriv.privacy import accounting
from fedpriv.privacy.accounting import ADD_REMOVE, REPLACE_ONE
from fedpriv.privacy.ledger import PrivacyLedger
from fedpriv.privacy.records import records_from_list
from fedpriv.privacy.target import Privacy
from fedpriv.run import Job

DATA = "synthetic-mf:users=120,items=40,ratings=2400,seed=3"
DELTA = 1e-5


def job(relation: str, **params) -> Job:
    return Job("adadpals", DATA, epsilon=2.0, noise_seed=7, params={"rank": 3, "steps": 2, **params}, relation=relation)


@pytest.fixture(scope="module")
def runs():
    """The same seeded job under each relation: {relation: (metrics, ledger records)}."""
    out = {}
    for relation in (ADD_REMOVE, REPLACE_ONE):
        outcome = job(relation).prepare().execute(second_opinion=False)
        out[relation] = (outcome.report.to_json(), outcome.ledger)
    return out


def test_accounting_holds_no_relation_of_its_own():
    """(a) No context variable, no ``neighbouring`` block, no ``current_relation``: every
    function takes the relation as an argument (or reads a ledger's own)."""
    assert not hasattr(accounting, "neighbouring")
    assert not hasattr(accounting, "current_relation")
    assert not any(isinstance(v, contextvars.ContextVar) for v in vars(accounting).values())
    rel = records_from_list([{"name": "x", "mechanism": "gaussian", "sensitivity": 1.0, "noise_std": 3.0}])
    assert accounting.epsilon_rdp(rel, DELTA) == accounting.epsilon_rdp(rel, DELTA, relation=ADD_REMOVE)
    assert accounting.calibrate([accounting.PlannedRelease("x", 1, 1.0)], 1.0, DELTA).relation == ADD_REMOVE


def test_a_replace_one_job_reports_replace_one_epsilon(runs):
    """(b) ``relation=REPLACE_ONE`` on the job: calibrated and accounted under replace-one, and
    metrics.json says so; the same seeded job under add/remove reports another epsilon for its
    ledger (the add/remove one), with less noise."""
    (m_ar, led_ar), (m_r1, led_r1) = runs[ADD_REMOVE], runs[REPLACE_ONE]
    assert m_r1["neighbouring_relation"] == "replace_one" and "neighbouring_relation" not in m_ar
    recs_ar, recs_r1 = records_from_list(led_ar), records_from_list(led_r1)
    # each run reports its ledger's epsilon under its own relation, and meets the target there
    assert m_r1["epsilon_spent"] == pytest.approx(accounting.epsilon_bounds(recs_r1, DELTA, relation=REPLACE_ONE)[0])
    assert m_ar["epsilon_spent"] == pytest.approx(accounting.epsilon_bounds(recs_ar, DELTA, relation=ADD_REMOVE)[0])
    assert m_r1["epsilon_spent"] == pytest.approx(2.0, rel=1e-3) and m_r1["epsilon_spent"] <= 2.0 * (1 + 1e-6)
    # the add/remove run's epsilon is not a replace-one one: under replace-one its ledger spends
    # more than twice the target; the replace-one run bought that with more noise
    assert accounting.epsilon_bounds(recs_ar, DELTA, relation=REPLACE_ONE)[0] > 2 * m_ar["epsilon_spent"]
    assert m_r1["epsilon_spent"] != accounting.epsilon_bounds(recs_r1, DELTA, relation=ADD_REMOVE)[0]
    assert all(m_r1["noise_multipliers"][k] > z for k, z in m_ar["noise_multipliers"].items() if k != "users")
    # the noise-aware rule read the relation too: its snr per released user halves under replace-one
    per_user = {r: m["noise_aware"]["snr"] / m["noise_aware"]["released_n_users"] for r, (m, _) in runs.items()}
    assert per_user[REPLACE_ONE] == pytest.approx(per_user[ADD_REMOVE] / 2, rel=1e-12)


def test_a_plan_prepared_once_gives_the_same_numbers_wherever_it_is_executed(runs, tmp_path):
    """(c) No ambient state: the plan's relation is the job's, so the plan executed here, in
    another thread (which starts with a fresh context) and on the Flower server logic (an
    in-memory grid) gives the same ledger and the same epsilon as the run of the fixture."""
    from fedpriv.flower.server_app import run_job
    from fedpriv.run import FlowerCallback, InProcess
    from fedpriv.testing.local_grid import LocalGrid

    plan = job(REPLACE_ONE, users_per_node=30).prepare()
    assert plan.job.relation == REPLACE_ONE and plan.budget().relation == REPLACE_ONE
    here = plan.execute(InProcess(), second_opinion=False)
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(out=plan.execute(InProcess(), second_opinion=False)))
    thread.start()
    thread.join()
    grid = plan.execute(
        FlowerCallback(runner=lambda j, n: run_job(LocalGrid(n), j), users_per_node=30, work_dir=str(tmp_path)),
        second_opinion=False,
    )
    for other in (box["out"], grid):
        assert other.ledger == here.ledger
        assert other.report.to_json()["epsilon_spent"] == here.report.to_json()["epsilon_spent"]
        assert other.report.to_json()["neighbouring_relation"] == "replace_one"
    assert here.report.to_json()["noise_multipliers"] == runs[REPLACE_ONE][0]["noise_multipliers"]


def test_the_job_carries_its_privacy_target():
    j = job(REPLACE_ONE)
    assert j.privacy == Privacy(2.0, DELTA, REPLACE_ONE, 7)
    assert Job("adadpals", DATA, epsilon=1.0).privacy == Privacy(1.0)
    assert "7" not in repr(j.privacy)  # the noise seed stays out of the repr, as the ledger's
    with pytest.raises(ConfigError) as err:
        Privacy(1.0, relation="replace-one")
    assert err.value.field == "relation"
    with pytest.raises(ConfigError) as err:
        job("replace-one").prepare()
    assert err.value.field == "relation"


def test_the_target_module_is_light():
    """``fedpriv.privacy.target`` (the relations, the privacy target) imports neither
    dp-accounting nor numpy: the run layer and the ledger read the relation from it."""
    code = "import sys, fedpriv.privacy.target; print([m for m in ('dp_accounting', 'numpy') if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_ledger_carries_the_relation_to_its_accountant_and_its_readers():
    """A ledger's budget check, and any accounting function given the ledger, hold under the
    ledger's relation; an accountant of another relation, or a checkpoint of another relation,
    is refused."""
    acc = accounting.BestOfAccountant()
    led = PrivacyLedger(seed=0, budget=(1.5, DELTA), accountant=acc, relation=REPLACE_ONE)
    assert led.accountant.relation == REPLACE_ONE and acc.relation is None  # bound on a copy
    led.gaussian("x", np.zeros(3), sensitivity=1.0, noise_multiplier=6.0)
    # under add/remove a second release would fit the budget; under replace-one it does not
    assert accounting.epsilon_bounds(led.releases * 2, DELTA)[0] < 1.5
    assert accounting.epsilon_bounds(led.releases * 2, DELTA, relation=REPLACE_ONE)[0] > 1.5
    with pytest.raises(PrivacyError, match="budget"):
        led.gaussian("x", np.zeros(3), sensitivity=1.0, noise_multiplier=6.0)
    assert accounting.epsilon_bounds(led, DELTA) == accounting.epsilon_bounds(led.releases, DELTA, relation=REPLACE_ONE)
    assert accounting.epsilon_bounds(led, DELTA)[0] > accounting.epsilon_bounds(led.releases, DELTA)[0]
    with pytest.raises(PrivacyError, match="accountant"):
        PrivacyLedger(budget=(1.0, DELTA), accountant=accounting.RdpAccountant(ADD_REMOVE), relation=REPLACE_ONE)
    with pytest.raises(ConfigError):
        PrivacyLedger(relation="both")
    with pytest.raises(PrivacyError, match="relation|replace_one"):
        PrivacyLedger(seed=0).load_state_dict(led.state_dict())


def test_the_noise_aware_rule_reads_the_ledgers_relation():
    """``defaults.apply`` chooses from the budget of the ledger and the relation it carries."""
    from fedpriv.algorithms import als, defaults

    def chosen(relation: str) -> dict:
        cfg = als.ALSConfig.from_overrides({}, "adadpals")
        state = als.PublicState(
            algorithm="adadpals", config=cfg, n_items=1682, n_users=943, rating_range=(1.0, 5.0), implicit=False
        )
        state.multipliers = als.calibrate_plan("adadpals", cfg, False, 5.0, DELTA, relation)
        ledger = PrivacyLedger(seed=0, budget=(5.0, DELTA), accountant=accounting.BestOfAccountant(), relation=relation)
        defaults.apply(state, ledger)
        return state.choice

    assert chosen(REPLACE_ONE)["snr"] == pytest.approx(chosen(ADD_REMOVE)["snr"] / 2)
