"""Private tuning on the Flower engines holds against a node (issue 41, item 2).

A node sees every run of the tuning: its broadcasts, its noised releases and how many runs there
were (K). The epsilon a tuned Flower run reports must cover that view. These tests rebuild the
view from what the nodes received (every run's releases, captured from each Flower job) and
account it independently of the code under test: for each k, dp-accounting's RDP accountant
composes the captured run k times (``compose(event, k)``) and gives delta_k(eps) by its own
``get_delta``; the law of K comes from :func:`fedpriv.privacy.tnb.pmf`. The view is
(eps, delta)-DP at the reported eps iff sum_k P[K=k] delta_k(eps) <= delta. The positive
control: the former accounting (the selected run only, K hidden) fails this check.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant

from fedpriv.privacy import tnb
from fedpriv.privacy.accounting import RDP_ORDERS, epsilon_all_runs, epsilon_bounds
from fedpriv.privacy.records import RepeatAndCompose, records_from_list

ROOT = Path(__file__).resolve().parents[1]
DATA = "synthetic-mf:users=40,items=20,ratings=800,seed=8"
DELTA = 1e-5


def _run_event(releases) -> dp_accounting.DpEvent:
    """dp-accounting's event of one run, from the releases a node received (gaussian records)."""
    events = []
    for r in releases:
        assert r["mechanism"] == "gaussian"
        events.append(dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(r["noise_std"] / r["sensitivity"]), int(r["count"])))
    return dp_accounting.ComposedDpEvent(events)


def node_view_delta(run_releases: list[dict], mean: float, shape: float, epsilon: float, kmax: int = 400) -> float:
    """delta at ``epsilon`` of a node's view (K runs of ``run_releases``, K seen, over its public
    law), accounted without fedpriv's accounting: dp-accounting's RDP of one run, k times for k runs,
    converted by its compute_delta;
    the law's mass past the k where it falls below 1e-3 delta is added whole."""
    gamma = tnb.gamma_for_mean(shape, mean)
    ks = np.arange(1, kmax + 1)
    pk = tnb.pmf(ks, shape, gamma)
    n = int(np.argmax(1.0 - np.cumsum(pk) < 1e-3 * DELTA)) + 1
    acc = rdp_privacy_accountant.RdpAccountant(orders=list(RDP_ORDERS))
    acc.compose(_run_event(run_releases))  # one run; k runs compose to k times its RDP
    total = max(0.0, 1.0 - float(pk[:n].sum()))
    for k, p in zip(ks[:n], pk[:n]):
        total += p * rdp_privacy_accountant.compute_delta(acc.orders, [int(k) * r for r in acc.rdp], epsilon)[0]
    return total


def _capture_runner(seen: list):
    """A Flower runner (in-memory grid) that keeps each job's ledger: what its nodes received."""
    from fedpriv.flower.server_app import run_job
    from fedpriv.testing.local_grid import LocalGrid

    def runner(job, n):
        res = run_job(LocalGrid(n), job)
        seen.append(res.ledger)  # the tuning then adds the run's noised score to this ledger
        return res

    return runner


def _inner(ledger_json: list[dict]) -> list[dict]:
    assert len(ledger_json) == 1
    return ledger_json[0]["releases"]


@pytest.fixture(scope="module")
def old_plan():
    """The plan the former accounting gave these runs: repeat-and-select at 2.0 (slow to calibrate: once)."""
    from fedpriv.algorithms.als import ALSConfig
    from fedpriv.algorithms.plans import budget_plan
    from fedpriv.privacy.plan import TuningPlan

    return budget_plan("adadpals", ALSConfig.from_overrides({"rank": "2", "steps": "1"}, "adadpals"), 2.0, DELTA, tuning=TuningPlan(mean=3.0))


def test_the_reported_epsilon_holds_against_what_the_nodes_received(tmp_path, old_plan):
    """A tuned Flower run (in-memory grid): every run the nodes received, composed over the law
    of K, is (reported eps, delta)-DP; the reported eps is what dp-accounting gives from
    ledger.json; no run folder is left in the user's work folder. Positive control: the old
    accounting (selected run only) reports an epsilon the nodes' view exceeds."""
    from fedpriv.run import FlowerCallback, Job

    params = {"tune": "reg_item_private=0.5/5/50", "tune_mean": 3, "rank": 2, "steps": 1}
    seen: list = []
    work = tmp_path / "work"
    out = Job("adadpals", DATA, epsilon=2.0, delta=DELTA, params=params).prepare().execute(
        FlowerCallback(runner=_capture_runner(seen), users_per_node=10, work_dir=work))
    ledger = json.loads(json.dumps(out.ledger))  # as ledger.json holds it
    metrics = out.report.to_json()
    assert [r["mechanism"] for r in ledger] == ["repeat_and_compose"] and "runs" not in ledger[0]
    reported = metrics["epsilon_spent"]
    assert reported <= 2.0 * (1 + 1e-6)
    # the reported epsilon is dp-accounting's, read from ledger.json alone
    assert epsilon_all_runs(records_from_list(ledger), DELTA) == pytest.approx(reported, rel=1e-9)
    # what the nodes received: K runs, each with the ledger's releases (same multipliers)
    assert len(seen) >= 1
    received = [[{**r.to_dict()} for r in led.releases] for led in seen]
    key = lambda rels: sorted((r["name"], round(r["noise_std"] / r["sensitivity"], 9), r["count"]) for r in rels)  # noqa: E731
    assert all(key(run) == key(_inner(ledger)) for run in received)
    assert any(r["name"] == "valid_score" for r in received[0])
    # the nodes' view, accounted independently, holds at the reported epsilon
    view = node_view_delta(received[0], 3.0, 1.0, reported)
    assert view <= DELTA, view
    # ... and is not loose by much: 10% less epsilon would not hold
    assert node_view_delta(received[0], 3.0, 1.0, 0.9 * reported) > DELTA
    # nothing tells K: no folder per run in the work folder, no timing
    assert not work.exists() or not any(work.iterdir()), sorted(p.name for p in work.iterdir())
    assert metrics["wall_seconds"] is None and metrics.get("launcher_wall_seconds") is None
    assert "runs" not in metrics["tuning"]
    assert "every run" in metrics["tuning"]["accounting"]

    # positive control: the former accounting (repeat_and_select: the selected run, K hidden)
    # calibrated the runs the nodes received for a reported 2.0; that report does not hold
    old = old_plan
    assert epsilon_bounds(old.records(), DELTA)[0] == pytest.approx(2.0, rel=1e-3)
    assert node_view_delta([r.to_dict() for r in old.run_records()], 3.0, 1.0, 2.0) > 10 * DELTA


def test_the_flower_engine_refuses_the_selected_run_accounting():
    from fedpriv.errors import ConfigError
    from fedpriv.run.tuning import view_of

    assert view_of("auto", True) == "all" and view_of("auto", False) == "selected" and view_of("all", False) == "all"
    with pytest.raises(ConfigError, match="tune_view"):
        view_of("selected", True)
    with pytest.raises(ConfigError, match="tune_view"):
        view_of("hidden", False)


def test_the_all_runs_accounting_matches_an_independent_computation(old_plan):
    """epsilon_all_runs (fedpriv) against the independent node-view computation above, on a plan
    calibrated by calibrate_all_runs (both ways of building it agree); and the runs the former
    accounting calibrated spend far more than its report against a node."""
    from fedpriv.algorithms.als import ALSConfig
    from fedpriv.algorithms.plans import budget_plan
    from fedpriv.privacy.plan import all_runs_plan, all_runs_plan_of

    seen = all_runs_plan(old_plan)
    again = all_runs_plan_of(budget_plan("adadpals", ALSConfig.from_overrides({"rank": "2", "steps": "1"}, "adadpals"), 2.0, DELTA), old_plan.tuning, (1.0, 5.0))
    assert again.multipliers == pytest.approx(seen.multipliers, rel=1e-6)
    assert seen.summary()["epsilon_rdp"] == pytest.approx(2.0, rel=1e-3) and seen.summary()["epsilon_rdp"] <= 2.0
    run = [r.to_dict() for r in seen.run_records()]
    eps = epsilon_all_runs(seen.records(), DELTA)
    assert node_view_delta(run, 3.0, 1.0, eps) <= DELTA < node_view_delta(run, 3.0, 1.0, 0.97 * eps)
    # the former accounting's runs (repeat-and-select at 2.0), as a node sees them
    assert epsilon_all_runs([RepeatAndCompose("tuning", 3.0, 1.0, 0, tuple(old_plan.run_records()))], DELTA) > 4.0


@pytest.mark.flower  # Flower's engine: `flwr run` in a subprocess
def test_fedpriv_run_flower_tune_reports_what_holds_against_a_node(tmp_path):
    """`fedpriv run adadpals --engine flower --tune ...`: the ledger.json epsilon holds against a
    node's view of every run (recomputed with dp-accounting), metrics.json holds no timing or
    path that depends on K, and no run folder is left anywhere in the run's folders."""
    out = tmp_path / "out"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "fedpriv.cli", "run", "adadpals", "--data", DATA, "--epsilon", "2", "--engine", "flower", "--users-per-node", "10",
           "--set", "rank=2", "--set", "steps=1", "--tune", "reg_item_private=0.5/5/50", "--tune-mean", "3", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    ledger = json.loads((out / "ledger.json").read_text())
    assert metrics["engine"] == "flower" and [x["mechanism"] for x in ledger] == ["repeat_and_compose"]
    reported = metrics["epsilon_spent"]
    assert reported <= 2.0 * (1 + 1e-6)
    assert epsilon_all_runs(records_from_list(ledger), DELTA) == pytest.approx(reported, rel=1e-9)
    assert node_view_delta(_inner(ledger), 3.0, 1.0, reported) <= DELTA
    # no K-dependent timing or path
    assert metrics["wall_seconds"] is None and metrics["launcher_wall_seconds"] is None

    def walk(obj, path=""):
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield from walk(v, f"{path}.{k}")
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                yield from walk(v, f"{path}[{i}]")
        else:
            yield path, obj

    for path, value in walk(metrics):
        assert "candidate" not in str(value) and "fedpriv-tune" not in str(value), (path, value)
        measured = not path.startswith((".config.", ".round_log", ".timings"))  # the config holds the user's inputs (round_timeout)
        assert not (measured and ("second" in path or "time" in path) and isinstance(value, float)), (path, value)
    assert "runs" not in metrics["tuning"]
    left = [p for p in tmp.rglob("*") if "candidate" in p.name or p.name.startswith("run-") or p.name.startswith("fedpriv-")]
    assert left == [], left
    assert "candidate" not in r.stderr
