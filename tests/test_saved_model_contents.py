"""A saved model holds released values and public configuration only (issue 30).

Every key of ``model.json`` (recursively) and every array of ``model.npz`` is checked against an
explicit allowed list; no value holds the data's path (nor its file name) and no key names a
metric, since test and validation metrics are measured on held-out private ratings. Older models
whose ``info`` kept ``test_rmse`` and a data path still load (those keys are dropped).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

import fedpriv
from fedpriv.algorithms.config import Aggregation, ALSConfig
from fedpriv.algorithms.options import JSON_KEYS
from fedpriv.cli import main
from fedpriv.run.model import Model

SPEC = "synthetic-mf:users=300,items=60,ratings=6000,seed=3"

TOP_KEYS = {
    "format", "algorithm", "config", "n_items", "n_users_released", "rating_range", "implicit", "mean",
    "item_ids", "item_names", "epsilon_spent", "delta", "info",
}  # fmt: skip
INFO_KEYS = {"algorithm", "dataset", "engine", "epsilon"}
CONFIG_KEYS = {f.name for f in dataclasses.fields(ALSConfig)} - {"aggregation"} | set(Aggregation.KEYS) | set(JSON_KEYS)  # the public hyperparameters, the engine options, the flat keys of DP-SGD and the encoder family
# counts_hat / item_support: the released (noised) item counts and the bias stage's weight sums,
# the popularity the ranking reads (issue 33)
ARRAYS = {"item_factors", "item_bias", "item_ids", "encoder_params", "counts_hat", "item_support"}
METRIC_WORDS = ("rmse", "recall", "logloss", "accuracy", "sliced", "mse", "hit", "n_ratings", "test_", "valid_")


def key_paths(obj, prefix: str = "") -> set[str]:
    """Every key of a JSON object, recursively, as dotted paths (list items share their path)."""
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.add(prefix + k)
            out |= key_paths(v, prefix + k + ".")
    elif isinstance(obj, list):
        for v in obj:
            out |= key_paths(v, prefix)
    return out


def check_model(folder: Path, *, forbidden: tuple[str, ...] = ()) -> dict:
    """Assert the allowed keys and arrays; ``forbidden``: strings no file of the model may hold."""
    meta = json.loads((folder / "model.json").read_text())
    allowed = TOP_KEYS | {f"info.{k}" for k in INFO_KEYS} | {f"config.{k}" for k in CONFIG_KEYS}
    keys = key_paths(meta)
    assert keys <= allowed, f"unexpected keys in model.json: {sorted(keys - allowed)}"
    assert TOP_KEYS <= keys
    assert not [k for k in keys if any(w in k.lower() for w in METRIC_WORDS)]
    assert meta["info"]["dataset"] in (None, "csv", "parquet", "synthetic-mf", "ml-100k", "dataframe", "dataset")
    with np.load(folder / "model.npz", allow_pickle=False) as z:
        assert set(z.files) <= ARRAYS and "item_factors" in z.files
        for name in z.files:
            assert z[name].dtype.kind in "fiu", name  # numbers only: no text can hide there
    text = "".join((folder / name).read_text() for name in ("model.json", "ledger.json"))
    for needle in forbidden:
        assert needle not in text, needle
    for word in ("test_rmse", "valid_rmse", "test_recall", "recall_at", "logloss", "sliced", "noise_seed"):
        assert word not in text, word
    return meta


@pytest.mark.parametrize(("algorithm", "epsilon"), [("adadpals", 5.0), ("als", None)])
def test_saved_model_keys_synthetic(tmp_path: Path, algorithm: str, epsilon: float | None) -> None:
    res = fedpriv.train(algorithm, SPEC, epsilon=epsilon, steps=1, rank=3, noise_seed=2)
    assert "test_rmse" in res.metrics  # the run measured it; the model does not keep it
    meta = check_model(Path(res.save_model(tmp_path / "m")), forbidden=(SPEC, "seed=3", "users=300"))
    assert meta["info"] == {"algorithm": algorithm, "dataset": "synthetic-mf", "engine": "inprocess", "epsilon": epsilon}
    assert meta["epsilon_spent"] == res.epsilon
    # a private run keeps its released count; a non-private one released none (not the exact count)
    assert meta["n_users_released"] == (res.metrics["released_n_users"] if epsilon else 0)


def test_saved_model_keys_own_csv_on_the_command_line(tmp_path: Path, capsys) -> None:
    """A csv file whose path is known: neither the path nor the file's name reaches the model,
    and ``fedpriv recommend`` still works from it."""
    rng = np.random.default_rng(4)
    data = tmp_path / "private-folder" / "my-secret-ratings.csv"
    data.parent.mkdir()
    rows = [f"u{u},i{i},{rng.integers(1, 6)}" for u in range(250) for i in rng.choice(30, 10, replace=False)]
    data.write_text("user,item,rating\n" + "\n".join(rows) + "\n")
    items = tmp_path / "private-folder" / "catalogue-list.csv"
    items.write_text("item\n" + "".join(f"i{i}\n" for i in range(32)))
    argv = ["run", "adadpals", "--data", f"csv:{data}", "--data-opt", "rating_range=1,5", "--data-opt", f"items={items}",
            "--epsilon", "4", "--set", "steps=1", "--set", "rank=2", "--noise-seed", "5", "--quiet",
            "--out", str(tmp_path / "out"), "--save-model", str(tmp_path / "model")]
    assert main(argv) == 0
    capsys.readouterr()
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    meta = check_model(tmp_path / "model", forbidden=(str(tmp_path), "private-folder", "my-secret-ratings", "catalogue-list"))
    assert meta["info"] == {"algorithm": "adadpals", "dataset": "csv", "engine": "inprocess", "epsilon": 4.0}
    assert meta["n_items"] == 32 and meta["epsilon_spent"] == metrics["epsilon_spent"]
    (tmp_path / "me.csv").write_text("item,rating\ni1,5\ni2,1\n")
    assert main(["recommend", "--model", str(tmp_path / "model"), "--ratings", str(tmp_path / "me.csv"), "--k", "3", "--json"]) == 0
    recs = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(recs) == 3 and not {r["item"] for r in recs} & {"i1", "i2"}


def test_older_model_with_metrics_and_a_path_still_loads(tmp_path: Path) -> None:
    res = fedpriv.train("adadpals", SPEC, epsilon=5, steps=1, rank=3, noise_seed=2)
    path = Path(res.save_model(tmp_path / "old"))
    meta = json.loads((path / "model.json").read_text())
    meta["info"] = {"algorithm": "adadpals", "dataset": "csv:/home/someone/ratings.csv", "engine": "inprocess", "epsilon": 5,
                    "test_rmse": 0.93, "test_recall": 0.1}  # what older versions wrote
    (path / "model.json").write_text(json.dumps(meta))
    old = Model.load(path)
    assert old.info == {"algorithm": "adadpals", "dataset": "csv", "engine": "inprocess", "epsilon": 5}
    here = res.model.recommend([0, 1, 2], [5, 3, 1], k=5)
    assert old.recommend([0, 1, 2], [5, 3, 1], k=5) == here
    check_model(Path(old.save(tmp_path / "resaved")), forbidden=("/home/someone", "ratings.csv"))
