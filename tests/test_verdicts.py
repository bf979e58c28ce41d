"""Results that judge themselves, and the table of models.

Every run is judged against the trivial reference of its task (the global mean for ratings, the
most-popular list for top-k, the best shared model for personalization): ``metrics.json`` has a
``verdict`` object, and the summary says WORSE in one line when the run loses to one. A run with
more than half of its replies rejected fails the command (exit 3) unless the limit is raised.
The table of models by task comes from the algorithm registry: ``fedpriv run --help``,
docs/reference/cli.md and the README show it; a saved top-k model predicts no ratings."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fedpriv.cli import main
from fedpriv.run import Job, RunReport
from fedpriv.run.report import TooManyRejected, check_rejections, rejected_fraction, verdicts

ROOT = Path(__file__).resolve().parent.parent
SYN = "synthetic-mf:users=400,items=200,ratings=20000,seed=1"
SMALL = "synthetic-mf:users=80,items=40,ratings=2400,seed=5"
VERDICT_KEYS = {"task", "metric", "value", "reference", "reference_value", "worse"}


def _run(algorithm: str, data: str = SYN, **kw):
    params = kw.pop("params", {})
    return Job(algorithm, data, params=params, **kw).prepare().execute(second_opinion=False)


# ----------------------------------------------------------------------------- verdicts
def test_a_run_worse_than_the_global_mean_says_so_in_one_line():
    out = _run("adadpals", epsilon=0.05, noise_seed=1, params={"rank": "8", "steps": "3"})
    report = out.report
    v = report["verdict"]["test_rmse"]
    assert set(v) == VERDICT_KEYS and v["task"] == "ratings" and v["reference"] == "global mean"
    assert v["worse"] is True and v["value"] > v["reference_value"] == report["references"]["global_mean_test_rmse"]
    text = report.summary()
    lines = [line for line in text.splitlines() if "WORSE" in line]
    assert len(lines) == 1, text
    assert f"WORSE than the global mean: test RMSE {v['value']:.4f} > {v['reference_value']:.4f}" in lines[0]
    assert report.verdict_line() in lines[0]


def test_a_good_run_has_no_verdict_line():
    out = _run("als", params={"rank": "8", "steps": "3"})
    report = out.report
    got = report["verdict"]
    assert set(got) == {"test_rmse", "recall_at_10", "ndcg_at_10"}
    assert all(set(e) == VERDICT_KEYS and e["worse"] is False for e in got.values()), got
    assert got["recall_at_10"]["reference"] == "most-popular list" and got["recall_at_10"]["task"] == "top-k"
    assert "WORSE" not in report.summary() and report.verdict_line() is None


def test_metrics_json_carries_the_verdict(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "adadpals", "--data", SYN, "--epsilon", "0.05", "--noise-seed", "1", "--set", "rank=8", "--set", "steps=3", "--out", str(out)]) == 0
    doc = json.loads((out / "metrics.json").read_text())
    assert doc["verdict"]["test_rmse"]["worse"] is True
    assert doc["verdict"] == verdicts(doc)  # the file's verdict is the rule's, from the file's references
    assert RunReport.read(out / "metrics.json").verdict == doc["verdict"]
    assert "WORSE than the global mean" in capsys.readouterr().err


def test_a_top_k_model_leads_with_its_ranking_and_is_judged_by_it(tmp_path):
    out = _run("popular", epsilon=1.0, noise_seed=2)
    report = out.report
    text = report.summary()
    assert "bias model" not in text and "predicts no ratings" in report.model_line()
    assert "test RMSE" not in text  # a top-k model predicts no ratings
    assert "test_rmse" not in report["verdict"] and "recall_at_10" not in report["verdict"]  # popular is the reference itself
    out = _run("ease")
    report = out.report
    rows = [line.split()[0] for line in report.summary().splitlines()]
    assert rows.index("top-10") < len(rows) and "scores" not in rows and "test RMSE" not in report.summary()
    assert set(report["verdict"]) == {"recall_at_10", "ndcg_at_10"}


def test_a_personalization_run_is_judged_against_the_shared_model():
    out = _run("pam-nonprivate", "synthetic-personal:users=200,samples=8,d=6,k=2,noise=0.01,seed=3")
    report = out.report
    v = report["verdict"]["test_mse"]
    assert v["reference"] == "best shared model" and v["worse"] is False, v
    assert v["reference_value"] == report["references"]["shared_model_test_mse"] > report["test_mse"]
    assert "best shared model" in report.summary() and "WORSE" not in report.summary()


# ----------------------------------------------------------------------------- rejected replies
def _corrupting_app(bad_partitions: set[int]):
    """fedpriv's ClientApp whose nodes of ``bad_partitions`` send a malformed reply to every message
    but ``query.info`` (deterministic: 3 of 4 nodes give 75% of the replies rejected)."""
    from flwr.clientapp import ClientApp

    from fedpriv.flower import client_app as real
    from fedpriv.testing.chaos import _garble, _Wrapping

    app = ClientApp()

    def wrap(handler):
        def run(msg, context):
            reply = handler(msg, context)
            bad = int(context.node_config.get("partition-id", 0)) in bad_partitions and msg.metadata.message_type != "query.info"
            return _garble(reply, "malformed") if bad else reply

        return run

    real.register_handlers(_Wrapping(app, wrap))
    return app


def _chaos_engine(rate: float):
    from fedpriv.flower.server_app import run_job
    from fedpriv.run.flower_engines import FlowerCallback
    from fedpriv.testing.local_grid import LocalGrid

    app = _corrupting_app({1, 2, 3} if rate > 0.5 else set())
    return FlowerCallback(runner=lambda job, n: run_job(LocalGrid(n, client_app=app), job), users_per_node=20)


def test_the_rejection_rule():
    log = [{"round": "a", "nodes": 4}, {"round": "b", "nodes": 4}]
    doc = {"round_log": log, "rejected_replies": [{"round": "a", "node": 1, "reason": "malformed: x"}] * 4}
    assert rejected_fraction(doc) == 0.5
    check_rejections(doc)  # exactly half: allowed
    doc["rejected_replies"] = doc["rejected_replies"] * 2 + [{"round": "b", "node": 2, "reason": "stray reply"}]
    assert rejected_fraction(doc) == 1.0  # at most 1
    with pytest.raises(TooManyRejected, match=r"9 replies rejected.*limit 50%.*malformed.*--max-rejected-fraction"):
        check_rejections(doc)
    check_rejections(doc, 1.0)
    assert rejected_fraction({"round_log": [], "rejected_replies": []}) is None  # in process: no rounds


def test_most_replies_rejected_fails_the_command_unless_the_limit_is_raised(tmp_path, monkeypatch, capsys):
    """End to end: a Flower run (LocalGrid, 4 nodes) whose nodes 1-3 corrupt every reply (75% rejected), through `fedpriv run`."""
    from fedpriv.run import InProcess

    monkeypatch.setattr(InProcess, "execute", lambda self, plan, **kw: _chaos_engine(0.8).execute(plan, **kw))
    argv = ["run", "bias", "--data", SMALL, "--epsilon", "2", "--noise-seed", "3", "--quiet"]
    assert main([*argv, "--out", str(tmp_path / "a")]) == 3
    err = capsys.readouterr().err
    assert re.search(r"fedpriv: error: \d+ replies rejected, \d+\.\d% of those asked for \(limit 50%\)", err), err
    doc = json.loads((tmp_path / "a" / "metrics.json").read_text())  # the outputs stay for the diagnosis
    assert rejected_fraction(doc) > 0.5 and doc["rejected_replies"]
    # the positive control: the same run with the limit raised passes
    assert main([*argv, "--out", str(tmp_path / "b"), "--max-rejected-fraction", "0.9"]) == 0
    # and an honest run passes under the default limit
    monkeypatch.setattr(InProcess, "execute", lambda self, plan, **kw: _chaos_engine(0.0).execute(plan, **kw))
    assert main([*argv, "--out", str(tmp_path / "c")]) == 0
    assert not json.loads((tmp_path / "c" / "metrics.json").read_text())["rejected_replies"]
    assert main([*argv, "--out", str(tmp_path / "d"), "--max-rejected-fraction", "1.5"]) == 2


# ----------------------------------------------------------------------------- the table of models
def _fresh_table(form: str) -> str:
    """The table of a fresh interpreter (tests elsewhere register algorithms of their own)."""
    code = f"from fedpriv.algorithms import model_table; print(model_table.model_table({form!r}))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.rstrip("\n")


def _section(path: Path) -> str:
    text = path.read_text()
    m = re.search(r"<!-- models:begin -->\n(.*?)\n<!-- models:end -->", text, re.S)
    assert m, f"{path} has no models section"
    return m.group(1)


def test_the_model_table_covers_every_algorithm_and_the_docs_show_it():
    from fedpriv.algorithms import pam, registry

    table = _fresh_table("markdown")
    names = re.findall(r"^\| [^|]+ \| `([^`]+)` \|", table, re.M)
    assert set(registry.names()) | set(pam.PAM_ALGORITHMS) <= set(names) and len(names) == len(set(names))
    for name in registry.names():
        assert registry.get(name).task in registry.TASKS
    for group in registry.GROUPS:
        assert group in table
    assert _section(ROOT / "docs" / "reference" / "cli.md") == table, "docs/reference/cli.md: regenerate its models section from model_table.model_table('markdown')"
    assert _section(ROOT / "README.md") == table, "README.md: regenerate its models section from model_table.model_table('markdown')"
    readme = (ROOT / "README.md").read_text()
    assert readme.index("## Python quick start") < readme.index("## Which model") < readme.index("## Documentation")


def test_run_help_shows_the_table(capsys):
    from fedpriv.algorithms import pam, registry

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "models by task" in out and "rating prediction:" in out and "references and baselines:" in out
    for name in (*registry.names(), *pam.PAM_ALGORITHMS):
        assert re.search(rf"^\s+{re.escape(name)}\s+(non-)?private", out, re.M), name
    with pytest.raises(SystemExit):
        main(["recommend", "--help"])
    assert "how many unseen items" in capsys.readouterr().out


def test_which_models_predict_ratings():
    from fedpriv.algorithms import registry

    no_ratings = {n for n in (*registry.names(), *registry.PERSONALIZATION) if registry.kind_of(registry.task_of(n)) == "top-k"}
    assert no_ratings == {"topk", "topk-lowrank", "popular", "ease", "ials"}
    assert not any(registry.predicts_ratings(n) for n in no_ratings) and registry.predicts_ratings("adadpals")


# ----------------------------------------------------------------------------- a saved top-k model
def test_a_saved_topk_model_refuses_predict_and_has_no_rating_column(tmp_path, capsys):
    from fedpriv.errors import ConfigError
    from fedpriv.run.model import load_model

    out = _run("topk", epsilon=1.0, noise_seed=4)
    out.model.save(tmp_path / "model")
    model = load_model(tmp_path / "model")
    assert model.predicts_ratings is False
    with pytest.raises(ConfigError, match="topk ranks items; it predicts no ratings: use recommend"):
        model.predict([1, 2], [5, 3])
    recs = model.recommend([1, 2], [5, 3], k=5)
    assert len(recs) == 5 and all("rating" not in r for r in recs)
    assert "rating" not in model.recommend([1, 2], [5, 3], k=5, as_frame=True).columns
    (tmp_path / "mine.csv").write_text("item,rating\n1,5\n2,3\n")
    assert main(["recommend", "--model", str(tmp_path / "model"), "--ratings", str(tmp_path / "mine.csv"), "--k", "3"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "rating" not in header and "score" in header
    # a rating model keeps its ratings
    rated = _run("als", params={"rank": "4", "steps": "2"}).model
    assert rated.predicts_ratings and all("rating" in r for r in rated.recommend([1, 2], [5, 3], k=3))
