"""`fedpriv experiment`: config validation, the search protocol, tidy outputs, ledgers, resume,
missing data, neighbours; and (marked `experiments`) every shipped config in --quick mode,
rendered by `fedpriv report` and checked in a headless browser."""

from __future__ import annotations

import csv
import glob
import json
import math
from pathlib import Path

import numpy as np
import pytest

from fedpriv.cli import main
from fedpriv.errors import ConfigError
from fedpriv.ops.experiments import config, runner
from fedpriv.ops.experiments.neighbours import (
    neighbours,
    overlap_by_bucket,
    overlap_per_item,
)
from fedpriv.privacy.accounting import epsilon_bounds
from fedpriv.privacy.ledger import PrivacyLedger

ROOT = Path(__file__).resolve().parents[1]
TINY = "synthetic-mf:users=300,items=80,ratings=6000,seed=3"

GRID = f"""
[experiment]
name = "tiny"
title = "Tiny grid"
description = "a test"
kind = "grid"

[datasets]
tiny = "{TINY}"

[grid]
datasets = ["tiny"]
epsilons = [1, 4]
seeds = 2

[search]
trials = 2

[methods.als]
algorithm = "als"
params = {{ steps = 3 }}
search = {{ rank = [2, 4], reg_user = [0.05, 0.2] }}

[methods.ada]
algorithm = "adadpals"
params = {{ steps = 1, rank = 2 }}
search = {{ reg_item_private = [1.0, 5.0, 20.0], rating_clip = [0.5, 1.0] }}

[[plots]]
type = "curve"
y = "test_rmse"
file = "rmse"

[[plots]]
type = "buckets"
y = "test_bucket"
epsilon = 4
file = "buckets"
"""


def _write(tmp_path: Path, text: str, name: str = "exp.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def _csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ---------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda s: s.replace('kind = "grid"', 'kind = "nope"'), "experiment.kind"),
        (lambda s: s.replace('algorithm = "adadpals"', 'algorithm = "adadpal"'), "methods.ada.algorithm"),
        (lambda s: s.replace("epsilons = [1, 4]", "epsilons = [1, -4]"), "grid.epsilons"),
        (lambda s: s.replace('datasets = ["tiny"]', 'datasets = ["tiny", "ml-1m"]'), "grid.datasets"),
        (lambda s: s.replace("trials = 2", "trials = 2\ntrails = 2"), "search.trails"),
        (lambda s: s.replace("trials = 2", "trials = 2\ninclude_defaults = 1"), "search.include_defaults"),
        (lambda s: s.replace("rank = [2, 4],", "rank = [],"), "methods.als.search.rank"),
        (lambda s: s.replace('type = "curve"', 'type = "pie"'), "plots[0].type"),
        (lambda s: s.replace(f'tiny = "{TINY}"', 'tiny = "ml-100k"'), "datasets.tiny"),
        (lambda s: s.replace("[search]", "[search\n"), "exp.toml"),
    ],
)
def test_bad_config_names_file_and_field(tmp_path, edit, field):
    path = _write(tmp_path, edit(GRID))
    with pytest.raises(ConfigError) as exc:
        config.load(path)
    assert str(path) in str(exc.value) and field in str(exc.value)


def test_bad_config_cli_exit_2_and_nothing_written(tmp_path, capsys):
    good = _write(tmp_path, GRID, "good.toml")
    bad = _write(tmp_path, GRID.replace('name = "tiny"', 'name = "tiny2"').replace("seeds = 2", "seeds = 0"), "bad.toml")
    out = tmp_path / "out"
    assert main(["experiment", "--out", str(out), str(good), str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.toml: grid.seeds" in err
    assert not out.exists()  # every config is validated before anything runs
    assert main(["experiment", "--out", str(out), str(good), str(good)]) == 2
    assert "used by" in capsys.readouterr().err and not out.exists()


# ---------------------------------------------------------------------------------- the protocol
def test_include_defaults_makes_trial_zero_the_methods_own_params(tmp_path):
    """With include_defaults, trial 0 is the method's params with nothing drawn (what fedpriv run
    does without --set) and the drawn trials follow, unchanged; the search can choose it."""
    from fedpriv.ops.experiments.grid import candidates

    space = {"rank": [1, 2, 4], "reg_item_private": [1.0, 5.0, 20.0]}
    plain = candidates(space, {"trials": 3, "seed": 5}, "ada")
    with_defaults = candidates(space, {"trials": 3, "seed": 5, "include_defaults": True}, "ada")
    assert with_defaults[0] == {} and with_defaults[1:] == plain and len(plain) == 3
    assert candidates(space, {"mode": "grid", "include_defaults": True}, "ada")[0] == {}

    cfg = _write(tmp_path, GRID.replace("trials = 2", "trials = 2\ninclude_defaults = true").replace("epsilons = [1, 4]", "epsilons = [4]"))
    runner.run_configs([str(cfg)], tmp_path / "out", log=lambda s: None)
    docs = [json.loads(p.read_text()) for p in (tmp_path / "out" / "tiny" / "search").glob("*.json")]
    ada = [d for d in docs if d["definition"]["algorithm"] == "adadpals"]
    assert len(ada) == 1 and len(ada[0]["trials"]) == 3
    assert json.loads(ada[0]["trials"][0]["candidate"]) == {}
    assert ada[0]["definition"]["include_defaults"] is True
    best = ada[0]["trials"][ada[0]["best"]]
    assert best["search_value"] == min(t["search_value"] for t in ada[0]["trials"])


@pytest.fixture(scope="module")
def tiny_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exp")
    cfg = _write(tmp, GRID)
    out = tmp / "out"
    metas = runner.run_configs([str(cfg)], out, log=lambda s: None)
    return cfg, out / "tiny", metas[0]


def test_tidy_rows_search_and_selection(tiny_results):
    _, out, meta = tiny_results
    rows = _csv(out / "results.csv")
    assert list(rows[0])[: len(runner.FIRST_COLUMNS)] == list(runner.FIRST_COLUMNS)
    # als: one cell (no epsilon); ada: two epsilons; 2 seeds each
    assert len(rows) == 2 + 2 * 2 and meta["cells"] == {"total": 3, "done": 3, "skipped": 0}
    assert {(r["method"], r["epsilon"]) for r in rows} == {("als", ""), ("ada", "1.0"), ("ada", "4.0")}
    assert {r["seed"] for r in rows} == {"1235", "1236"}
    for r in rows:
        assert math.isfinite(float(r["test_rmse"])) and float(r["seconds"]) > 0
        assert all(r[f"test_bucket_{b}"] != "" for b in range(5))
    search = _csv(out / "search.csv")
    assert len(search) == 3 * 2
    for cell in {s["cell"] for s in search}:
        trials = [s for s in search if s["cell"] == cell]
        chosen = [s for s in trials if s["selected"] == "1"]
        assert len(chosen) == 1 and all(s["search_metric"] == "valid_rmse" for s in trials)
        # chosen on validation only: the smallest validation RMSE, whatever the test RMSE
        assert float(chosen[0]["valid_rmse"]) == min(float(s["valid_rmse"]) for s in trials)
        finals = [r for r in rows if r["cell"] == cell]
        assert all(json.loads(r["params"]) == json.loads(chosen[0]["params"]) for r in finals)
    # both epsilons of a method see the same candidates (draws depend on the method only)
    cands = {s["for_epsilon"]: [s["candidate"] for s in search if s["method"] == "ada" and s["for_epsilon"] == s["for_epsilon"]] for s in search if s["method"] == "ada"}
    assert len({tuple(sorted(c)) for c in cands.values()}) == 1


def test_every_run_has_a_ledger_and_its_epsilon(tiny_results):
    _, out, _ = tiny_results
    for r in _csv(out / "results.csv"):
        d = out / r["run_dir"]
        metrics = json.loads((d / "metrics.json").read_text())
        records = json.loads((d / "ledger.json").read_text())
        if r["method"] == "als":
            assert records == [] and r["epsilon_spent"] == ""
            continue
        eps = epsilon_bounds(PrivacyLedger.releases_from_list(records), float(r["delta"]))[0]
        assert float(r["epsilon_spent"]) == pytest.approx(eps, rel=1e-9) == pytest.approx(metrics["epsilon_spent"], rel=1e-9)
        assert eps <= float(r["epsilon"]) * (1 + 1e-3)


def test_tables_plots_and_headline(tiny_results):
    _, out, meta = tiny_results
    assert [p["file"] for p in meta["plots"]] == ["plots/rmse.png", "plots/buckets.png"]
    for p in meta["plots"]:
        assert (out / p["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = _csv(out / "tables/summary.csv")
    ada4 = next(s for s in summary if s["method"] == "ada" and s["epsilon"] == "4.0")
    vals = [float(r["test_rmse"]) for r in _csv(out / "results.csv") if r["method"] == "ada" and r["epsilon"] == "4.0"]
    assert float(ada4["test_rmse_mean"]) == pytest.approx(np.mean(vals)) and float(ada4["test_rmse_std"]) == pytest.approx(np.std(vals))
    assert any(h.startswith("tiny, ε = 4: best ada") for h in meta["headline"])
    doc = json.loads((out / "experiment.json").read_text())
    assert doc["finished"] and doc["config_text"].startswith("\n[experiment]")


def test_resume_recomputes_nothing_and_only_new_cells(tiny_results, monkeypatch, tmp_path):
    cfg, out, _ = tiny_results
    before = (out / "results.csv").read_text()
    calls = []
    from fedpriv.run import Job

    real = Job.prepare

    def counting(job):  # every run of the runner is a Job
        calls.append(job.epsilon)
        return real(job)

    monkeypatch.setattr(Job, "prepare", counting)
    runner.run_configs([str(cfg)], out.parent, log=lambda s: None)
    assert calls == [] and (out / "results.csv").read_text() == before
    more = _write(tmp_path, cfg.read_text().replace("epsilons = [1, 4]", "epsilons = [1, 4, 8]"), "more.toml")
    runner.run_configs([str(more)], out.parent, log=lambda s: None)
    assert calls == [8.0] * (2 + 2)  # the new cell only: its search, then its seeds
    assert len(_csv(out / "results.csv")) == 8


def test_missing_data_is_skipped_and_listed_or_an_error(tmp_path):
    text = GRID.replace(f'tiny = "{TINY}"', f'tiny = "{TINY}"\nreal = "ml-100k:{{data}}/nowhere/ml-100k.zip"').replace('datasets = ["tiny"]', 'datasets = ["real"]')
    cfg = _write(tmp_path, text)
    meta = runner.run_configs([str(cfg)], tmp_path / "out", data_root=str(tmp_path), log=lambda s: None)[0]
    assert meta["cells"] == {"total": 3, "done": 0, "skipped": 3} and meta["runs"] == 0
    assert all("data not found" in s["reason"] and "nowhere" in s["reason"] for s in meta["skipped"])
    with pytest.raises(ConfigError, match="datasets.real"):
        runner.run_configs([str(cfg)], tmp_path / "out2", data_root=str(tmp_path), require_data=True, log=lambda s: None)


# ---------------------------------------------------------------------------------- neighbours
def test_neighbours_match_brute_force_and_overlap():
    rng = np.random.default_rng(0)
    V = rng.normal(size=(57, 4))
    nn = neighbours(V, 5, chunk=10)
    U = V / np.linalg.norm(V, axis=1, keepdims=True)
    S = U @ U.T
    np.fill_diagonal(S, -np.inf)
    assert np.array_equal(nn, np.argsort(-S, axis=1, kind="stable")[:, :5])
    assert np.all(overlap_per_item(nn, nn) == 1.0)
    other = nn.copy()
    other[:, :2] = (nn[:, :2] + 1) % 57  # replace two neighbours (rarely kept by chance)
    per = overlap_per_item(nn, other)
    assert np.all(per >= 0.6 - 1e-12) and np.all(per <= 1.0)
    buckets = np.arange(57) % 5
    ob = overlap_by_bucket(nn, other, buckets)
    assert ob == pytest.approx([per[buckets == b].mean() for b in range(5)])


def test_neighbour_analysis_overlap_of_reference_is_one(tmp_path):
    text = GRID.replace("[[plots]]", """[analysis]
neighbours = true
neighbours_k = 5
reference_method = "als"

[[plots]]""", 1).replace("seeds = 2", "seeds = 1").replace("trials = 2", "trials = 1").replace("epsilons = [1, 4]", "epsilons = [4]")
    text += '\n[[plots]]\ntype = "overlap"\nepsilon = 4\nfile = "overlap"\n'
    cfg = _write(tmp_path, text)
    meta = runner.run_configs([str(cfg)], tmp_path / "out", log=lambda s: None)[0]
    rows = _csv(tmp_path / "out/tiny/results.csv")
    ref = next(r for r in rows if r["method"] == "als")
    assert float(ref["nn_overlap"]) == 1.0 and all(float(ref[f"nn_overlap_bucket_{b}"]) == 1.0 for b in range(5))
    priv = [r for r in rows if r["method"] == "ada"]
    assert all(0.0 <= float(r["nn_overlap"]) < 1.0 for r in priv)
    assert "plots/overlap.png" in [p["file"] for p in meta["plots"]]


# ---------------------------------------------------------------------------------- every config, quick
@pytest.mark.experiments
def test_quick_mode_of_every_config_and_the_report(tmp_path):
    """CI's run of the shipped configs: every experiment runs from its config in --quick mode
    (synthetic data sets only), the report renders every plot in a headless browser, and every
    private run's epsilon comes from its own ledger within its target."""
    from tests.test_report import _browser, dump_dom, screenshot

    configs = sorted(glob.glob(str(ROOT / "simulations/experiments/*.toml")))
    assert len(configs) >= 11
    out = tmp_path / "results"
    assert main(["experiment", "--quick", "--out", str(out), *configs]) == 0
    names = {config.load(c).name for c in configs}
    assert {p.name for p in out.iterdir()} == names
    n_plots = 0
    for name in names:
        meta = json.loads((out / name / "experiment.json").read_text())
        assert meta["finished"] and meta["cells"]["skipped"] == 0 and meta["plots"], name
        n_plots += len(meta["plots"])
        for r in _csv(out / name / "results.csv"):
            if not r["run_dir"]:
                continue
            m = json.loads((out / name / r["run_dir"] / "metrics.json").read_text())
            records = json.loads((out / name / r["run_dir"] / "ledger.json").read_text())
            if m.get("epsilon") is not None:
                eps = epsilon_bounds(PrivacyLedger.releases_from_list(records), float(r["delta"]))[0]
                assert m["epsilon_spent"] == pytest.approx(eps, rel=1e-6)
                assert m.get("epsilon_training", eps) <= m["epsilon"] * (1 + 1e-3)
    comm = _csv(out / "communication/results.csv")
    assert all(int(r["rounds"]) > 0 and int(r["bytes_up"]) > 0 for r in comm)  # measured over Flower
    html = tmp_path / "report.html"
    assert main(["report", str(out), "--out", str(html)]) == 0
    _browser()  # skips without a browser, fails with FEDPRIV_REQUIRE_BROWSER=1
    dom = dump_dom(html)
    assert f"{n_plots} of {n_plots} plots rendered" in dom
    png = tmp_path / "report.png"
    screenshot(html, png, width=1200, height=2000)
    from PIL import Image

    im = np.asarray(Image.open(png).convert("RGB")).astype(int)
    green = np.abs(im[5:30, :, :] - [0, 192, 0]).max(axis=2) <= 30  # the "all rendered" banner (white text on green)
    assert green.mean() > 0.8


def test_paper_scale_datasets_by_name_or_spec(tmp_path, capsys):
    """The shipped configs list ml-1m, ml-10m and ml-20m outside their default grid; --datasets
    selects them and --dataset NAME=SPEC points one anywhere; unknown names are errors."""
    curves = ROOT / "simulations/experiments/curves.toml"
    e = config.load(curves, only_datasets=["ml-20m"], data_root="/data")
    assert e.grid_datasets == ["ml-20m"] and e.datasets["ml-20m"].spec == "ml-20m:/data/ml-20m/ml-20m.zip"
    e = config.load(curves, only_datasets=["ml-1m"], dataset_specs={"ml-1m": "ml-1m:/elsewhere/ml-1m"})
    assert e.datasets["ml-1m"].spec == "ml-1m:/elsewhere/ml-1m"
    out = tmp_path / "out"
    assert main(["experiment", "--out", str(out), "--datasets", "ml-25m", str(curves)]) == 2
    assert "--datasets: unknown data set 'ml-25m'" in capsys.readouterr().err and not out.exists()
    assert main(["experiment", "--out", str(out), "--dataset", "ml-25m", str(curves)]) == 2
    assert "--dataset: expected NAME=SPEC" in capsys.readouterr().err
    assert main(["experiment", "--out", str(out), "--datasets", "ml-1m", "--require-data", "--data-root", str(tmp_path), str(curves)]) == 2
    assert "datasets.ml-1m: data not found" in capsys.readouterr().err


@pytest.mark.skipif(not (ROOT.parent / "shared/data/ml-100k/ml-100k.zip").exists(), reason="ML-100K not in ../shared/data")
def test_movie_titles_for_the_neighbours_table():
    from fedpriv.data.spec import load_spec, parse_data_spec

    ds = load_spec(parse_data_spec(f"ml-100k:{ROOT.parent / 'shared/data/ml-100k/ml-100k.zip'}"))
    names = ds.item_features.names
    assert len(names) == ds.interactions.n_items and "Star Wars (1977)" in names and "Toy Story (1995)" in names


def test_search_summaries_and_headlines_share_one_direction_per_metric():
    """One rule for "higher is better" (it used to differ between the search and the headline:
    accuracy was maximised by one and minimised by the other, overlap the other way round)."""
    from fedpriv.ops.experiments import grid, runner

    assert runner.metric_direction is grid.metric_direction
    for metric in ("valid_recall_at_20", "valid_accuracy", "rec_hit_rate", "nn_overlap", "test_accuracy"):
        assert grid.metric_direction(metric) == "max", metric
    for metric in ("valid_rmse", "test_mse", "valid_logloss", "subspace_error", "rec_mse_to_best"):
        assert grid.metric_direction(metric) == "min", metric
    summary = [{"dataset": "d", "method": m, "epsilon": 1.0, "n": 1, "test_accuracy_mean": v, "test_accuracy_std": 0.0} for m, v in (("a", 0.6), ("b", 0.9))]

    class _Exp:
        kind, datasets = "grid", ["d"]

    import unittest.mock as mock

    with mock.patch.object(runner, "primary_metrics", lambda exp: ["test_accuracy"]):
        (line,) = runner.grid_headline(_Exp(), summary)
    assert "best b" in line
