"""The Python API (issue 21): the same metrics as the CLI, saved models that recommend, a light
``import fedpriv``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import fedpriv
from fedpriv.cli import main
from fedpriv.errors import ConfigError, DataError, FedprivWarning

SPEC = "synthetic-mf:users=400,items=90,ratings=9000,seed=3"
TIMING = ("wall_seconds", "timings")


def _comparable(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in TIMING}


def test_api_reproduces_the_cli_metrics(tmp_path):
    out = tmp_path / "cli"
    argv = ["run", "adadpals", "--data", SPEC, "--epsilon", "5", "--set", "steps=2", "--set", "rank=4",
            "--noise-seed", "11", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    cli = json.loads((out / "metrics.json").read_text())
    res = fedpriv.train("adadpals", SPEC, epsilon=5, steps=2, rank=4, noise_seed=11)
    assert _comparable(json.loads(json.dumps(res.metrics))) == _comparable(cli)
    assert res.ledger == json.loads((out / "ledger.json").read_text())
    assert res.epsilon == cli["epsilon_spent"] and 4.9 < res.epsilon <= 5.0 + 1e-9


def test_plan_matches_the_cli_plan(capsys):
    assert main(["privacy", "plan", "adadpals", "--epsilon", "2", "--set", "steps=4", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert fedpriv.plan("adadpals", epsilon=2, steps=4).to_dict() == cli


def test_same_errors_as_the_command_line(tmp_path, capsys):
    with pytest.raises(ConfigError, match="is private: give --epsilon"):
        fedpriv.train("adadpals", SPEC)
    assert main(["run", "adadpals", "--data", SPEC, "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert "is private: give --epsilon" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    with pytest.raises(ConfigError, match="rank"):
        fedpriv.train("als", SPEC, rank="lots")


def test_saved_model_recommends_the_same_in_a_fresh_process(tmp_path):
    res = fedpriv.train("adadpals", SPEC, epsilon=5, steps=2, rank=4, noise_seed=5)
    path = res.save_model(tmp_path / "model")
    assert sorted(p.name for p in Path(path).iterdir()) == ["ledger.json", "model.json", "model.npz"]
    meta = json.loads((Path(path) / "model.json").read_text())
    assert meta["epsilon_spent"] == res.epsilon and meta["algorithm"] == "adadpals"
    items = [int(x) for x in res.model.item_ids[:6]]
    ratings = [5, 4, 1, 3, 5, 2]
    here = res.model.recommend(items, ratings, k=7)
    code = (
        "import json, fedpriv; m = fedpriv.load_model(%r); print(json.dumps(m.recommend(%r, %r, k=7)))" % (str(path), items, ratings)
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == json.loads(json.dumps(here))
    assert len(here) == 7 and not {r["item"] for r in here} & set(items)  # k unseen items
    scores = [r["score"] for r in here]
    assert scores == sorted(scores, reverse=True)


def test_saved_model_holds_only_released_values(tmp_path):
    res = fedpriv.train("adadpals", SPEC, epsilon=5, steps=1, rank=3, noise_seed=2)
    path = Path(res.save_model(tmp_path / "m"))
    with np.load(path / "model.npz") as z:
        assert set(z.files) <= {"item_factors", "item_bias", "item_ids", "encoder_params", "counts_hat", "item_support"}
        assert np.array_equal(z["item_factors"], res.model.state.item_factors)
        for name in {"counts_hat", "item_support"} & set(z.files):  # released (noised) values, as the run released them
            assert np.array_equal(z[name], getattr(res.model.state, name))
    meta = json.loads((path / "model.json").read_text())
    assert meta["mean"] == res.metrics["released_mean"]
    assert meta["n_users_released"] == res.metrics["released_n_users"]
    text = (path / "model.json").read_text() + (path / "ledger.json").read_text()
    assert "noise_seed" not in text and '"seed": 2' not in text


def test_am_ssp_model_keeps_its_encoder(tmp_path):
    res = fedpriv.train("am-ssp", SPEC, epsilon=5, steps=1, rank=3, noise_seed=4)
    path = Path(res.save_model(tmp_path / "enc"))
    with np.load(path / "model.npz") as z:
        assert "encoder_params" in z.files and z["encoder_params"].size > 0
    assert len(fedpriv.load_model(path).recommend([0, 1], [4, 2], k=3)) == 3


def test_recommend_command(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", "als", "--data", SPEC, "--set", "steps=2", "--set", "rank=4", "--out", str(out), "--quiet",
                 "--save-model", str(tmp_path / "model")]) == 0
    capsys.readouterr()
    ratings = tmp_path / "me.csv"
    ratings.write_text("item,rating\n3,5\n7,4\n11,1\n")
    assert main(["recommend", "--model", str(tmp_path / "model"), "--ratings", str(ratings), "--k", "10", "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["rank"] for r in lines] == list(range(1, 11))
    assert not {r["item"] for r in lines} & {3, 7, 11}


@pytest.mark.parametrize(
    "content, message",
    [
        ("item,rating\n3,five\n", r"me\.csv:2: rating 'five' is not a number"),
        ("it,rating\n3,5\n", r"me\.csv:1: no 'item' column"),
        ("item,rating\n", r"me\.csv: no ratings"),
        ("item,rating\n99999,5\n", r"item '?99999'? is not in the model's catalogue"),
        ("item,rating\n3,9\n", r"must be finite and lie in the model's range"),
    ],
)
def test_recommend_bad_ratings_file(tmp_path, capsys, content, message):
    res = fedpriv.train("als", SPEC, steps=1, rank=2)
    res.save_model(tmp_path / "model")
    (tmp_path / "me.csv").write_text(content)
    assert main(["recommend", "--model", str(tmp_path / "model"), "--ratings", str(tmp_path / "me.csv")]) == 2
    import re

    assert re.search(message, capsys.readouterr().err)


def test_bad_model_folder_and_refused_destination(tmp_path, capsys):
    (tmp_path / "notamodel").mkdir()
    (tmp_path / "notamodel" / "notes.txt").write_text("mine")
    assert main(["recommend", "--model", str(tmp_path / "notamodel"), "--ratings", "x.csv"]) == 2
    assert "not a fedpriv model folder: model.npz is missing" in capsys.readouterr().err
    # a destination holding other files is refused before training; nothing is written
    assert main(["run", "als", "--data", SPEC, "--out", str(tmp_path / "out"), "--quiet", "--save-model", str(tmp_path / "notamodel")]) == 2
    assert "is not a fedpriv model folder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() and (tmp_path / "notamodel" / "notes.txt").read_text() == "mine"
    with pytest.raises(DataError, match="model.json"):
        bad = tmp_path / "bad"
        bad.mkdir()
        for name in ("model.npz", "ledger.json"):
            (bad / name).write_text("x")
        (bad / "model.json").write_text("{")
        fedpriv.load_model(bad)


def test_personalization_models():
    """pam-own-data releases nothing shared; the others release the shared embedding (a
    PersonalModel), whose users personalize locally."""
    data = "synthetic-personal:users=60,samples=20,d=10,k=2,noise=0.1,seed=1"
    res = fedpriv.train("pam-own-data", data)
    assert res.model is None
    with pytest.raises(ConfigError, match="releases no shared item model"):
        res.save_model("/nonexistent/never")
    shared = fedpriv.train("pam-nonprivate", data, epochs=2).model
    assert isinstance(shared, fedpriv.PersonalModel) and shared.U.shape == (10, 2)


def test_import_fedpriv_is_light():
    code = "import sys, fedpriv; fedpriv.train; fedpriv.load_model; print(sorted(m for m in ('torch', 'flwr', 'ray', 'pandas', 'scipy', 'dp_accounting') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.replace("'", '"')) == []


@pytest.mark.parametrize(
    "content, options, message",
    [
        ("user,item,rating\n1,1,4\n1,2,7\n", ["rating_range=1,5"], r"bad\.csv:3: rating 7 is outside the rating range \[1, 5\]"),
        ("user,item,rating\n1,1,4\n1,1,5\n", ["rating_range=1,5"], r"bad\.csv:3: duplicate \(user, item\) pair \(1, 1\), first given at line 2"),
        ("user,item,rating\n1,1,4\n", [], r"rating_range: explicit ratings need their declared rating range"),
        ("user,item,rating\n1,1,4\n", ["rating_range=1,5", "colour=red"], r"--data-opt: unknown option 'colour'"),
    ],
)
def test_own_data_errors_on_the_command_line(tmp_path, capsys, content, options, message):
    """A bad file or option: exit 2, a message naming the file and line (or the option), and
    neither the run's outputs nor the model folder written."""
    import re

    (tmp_path / "bad.csv").write_text(content)
    argv = ["run", "als", "--data", f"csv:{tmp_path / 'bad.csv'}", "--out", str(tmp_path / "out"), "--quiet",
            "--save-model", str(tmp_path / "model")]
    for opt in options:
        argv += ["--data-opt", opt]
    assert main(argv) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "out").exists() and not (tmp_path / "model").exists()


def test_own_csv_trains_and_saves_on_the_command_line(tmp_path, capsys):
    rng = np.random.default_rng(1)
    rows = ["user,item,rating"] + [f"u{u},i{i},{rng.integers(1, 6)}" for u in range(300) for i in rng.choice(40, 12, replace=False)]
    (tmp_path / "mine.csv").write_text("\n".join(rows) + "\n")
    # a private run declares its item catalogue: every item id, rated or not (i40, i41 are not)
    (tmp_path / "items.csv").write_text("item\n" + "".join(f"i{i}\n" for i in range(42)))
    argv = ["run", "adadpals", "--data", f"csv:{tmp_path / 'mine.csv'}", "--data-opt", "rating_range=1,5", "--data-opt",
            f"items={tmp_path / 'items.csv'}", "--epsilon", "3", "--out", str(tmp_path / "out"), "--quiet", "--save-model", str(tmp_path / "model")]
    assert main(argv) == 0
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert metrics["dataset"] == f"csv:{tmp_path / 'mine.csv'}" and metrics["epsilon_spent"] <= 3.0 + 1e-9
    assert metrics["n_items"] == 42
    model = fedpriv.load_model(tmp_path / "model")
    recs = model.recommend(["i1", "i2"], [5, 1], k=4)
    assert len(recs) == 4 and all(r["item"].startswith("i") and r["item"] not in ("i1", "i2") for r in recs)


def _small_model(item_ids):
    """A released model over ``item_ids`` without training (random embeddings, popularity)."""
    from fedpriv.algorithms import als
    from fedpriv.algorithms.config import ALSConfig
    from fedpriv.run.model import Model

    rng = np.random.default_rng(0)
    n = len(item_ids)
    state = als.PublicState("als", ALSConfig(rank=2), n, 0, (1.0, 5.0), implicit=False, mean=3.5)
    state.item_factors = rng.normal(size=(n, 2)).astype(np.float32)
    state.item_bias = rng.normal(0, 0.3, n)
    state.counts_hat = rng.uniform(0, 50, n)
    return Model(state=state, item_ids=np.asarray(item_ids))


@pytest.mark.parametrize("ids, targets", [(np.arange(1, 21), [3, 9]), (np.arange(1, 21), ["3", "9"]),
                                          ([f"item{i}" for i in range(20)], ["item3", "item9"])])
def test_predict_takes_the_catalogue_ids_as_targets(ids, targets):
    model = _small_model(ids)
    got = model.predict([ids[1], ids[2]], [5, 2], targets=targets)
    everything = model.predict([ids[1], ids[2]], [5, 2])
    dense = model.dense_items(targets)
    assert got.shape == (2,) and np.allclose(got, everything[dense]) and np.all((got >= 1) & (got <= 5))


def test_unknown_ids_are_named_never_silently_dropped():
    model = _small_model(np.arange(1, 21))  # MovieLens-like: numeric ids
    # the tutorial's old ids on a numeric catalogue: an error naming them and what the catalogue holds
    with pytest.raises(DataError, match=r"items 'item3', 'item9' are not in the model's catalogue \(20 items whose ids are numbers: 1, 2, 3"):
        model.predict([1, 2], [5, 3], targets=["item3", "item9"])
    with pytest.raises(DataError, match=r"item 99 is not in the model's catalogue"):
        model.predict([1], [5], targets=[3, 99])
    # none of the user's items known: an error naming them
    with pytest.raises(DataError, match=r"items 'i1', 'i7' are not in the model's catalogue: none of the user's 2 item ids is known"):
        model.recommend(items=["i1", "i7"], ratings=[5, 3], k=3)
    with pytest.raises(DataError, match=r"item 2.5 is not"):
        model.recommend(items=[2.5], ratings=[5], k=3)
    # some known: the others are left out with a warning naming them, and the result is the known ones'
    with pytest.warns(FedprivWarning, match=r"item 'x9' is not in the model's catalogue: left out; .* other 2 of their 3"):
        partial = model.recommend(items=[4, "x9", 7], ratings=[5, 1, 2], k=5)
    assert partial == model.recommend(items=[4, 7], ratings=[5, 2], k=5)
    assert not {4, 7} & {r["item"] for r in partial}
    # no ratings at all (a user id that matched no row): the popularity ranking, and a warning that says so
    with pytest.warns(FedprivWarning, match="no ratings given: the ranking is the released popularity alone"):
        cold = model.recommend(items=[], ratings=[], k=5)
    assert len(cold) == 5
    with pytest.raises(DataError, match=r"expected one rating per item \(2\), got 1"):
        model.recommend(items=[1, 2], ratings=[5], k=3)
