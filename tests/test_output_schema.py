"""The shape of ``metrics.json`` and ``ledger.json``, pinned by golden files.

Each command below runs once (in-process, small synthetic sets, few steps); the full key
structure of its two files is compared with ``tests/golden/<name>.json``: every key path with
the JSON type of its value (``a.b`` for nested objects, ``a[]`` for list elements, the keys of
list-of-object elements merged), in the order the files have them, and the names of the ledger
records in order. For the runs under ``--noise-seed`` marked ``pin``, the values that the seed
makes deterministic (epsilon spent, RMSE, the released mean and count, each record's noise std)
are pinned too, at the tolerance the arithmetic supports (:data:`TOLERANCES`): the privacy
accounting is float64 arithmetic of the run's configuration (1e-7 relative); the model's
metrics come from float32 kernels whose rounding differs with the CPU's vector width, the
native kernel against the torch path and the number of BLAS threads (1e-5 relative: 400 times
the largest difference measured between those paths). A test runs a pinned command through the
other kernel and one thread and checks it within these tolerances.

A change of the output format fails here on purpose. When the change is meant, rewrite the
golden files from the current code and review their diff:

    FEDPRIV_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/test_output_schema.py

Every run also goes through :class:`fedpriv.run.RunReport`: the round trip
``from_metrics(m).to_json()`` gives ``m`` back exactly (keys, order, values) and ``summary()``
names epsilon and the test metric.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
from pathlib import Path

import pytest

from fedpriv.cli import main

GOLDEN = Path(__file__).resolve().parent / "golden"
REGEN = os.environ.get("FEDPRIV_REGEN_GOLDEN", "") not in ("", "0")
SYN = "synthetic-mf:users=200,items=80,ratings=4000,seed=1"
RANK_STEPS = ["--set", "rank=3", "--set", "steps=2"]

#: name -> (arguments of `fedpriv run` without --out/--quiet, pin values?)
COMMANDS: dict[str, tuple[list[str], bool]] = {
    "adadpals": (["adadpals", "--data", SYN, "--epsilon", "2", "--delta", "1e-6", *RANK_STEPS, "--noise-seed", "11"], True),
    # no rank/steps given: the noise-aware rule chooses the model (config.given is empty)
    "adadpals-defaults": (["adadpals", "--data", SYN, "--epsilon", "2", "--noise-seed", "20"], False),
    "dpals-tail": (["dpals-tail", "--data", SYN, "--epsilon", "2", *RANK_STEPS, "--noise-seed", "12"], False),
    "bias": (["bias", "--data", SYN, "--epsilon", "2", "--noise-seed", "13"], True),
    # non-private, secret-noise statement (no noise seed): deterministic keys all the same
    "als": (["als", "--data", SYN, *RANK_STEPS], False),
    "dpsgd": (["dpsgd", "--data", SYN, "--epsilon", "2", *RANK_STEPS, "--noise-seed", "14"], False),
    "am-ssp": (["am-ssp", "--data", SYN, "--epsilon", "5", "--set", "rank=3", "--set", "steps=1", "--set", "ssp_steps=20", "--noise-seed", "15"], False),
    "secure": (["adadpals", "--data", SYN, "--epsilon", "2", "--aggregation", "secure", "--set", "users_per_shard=40", *RANK_STEPS, "--noise-seed", "16"], False),
    "recommend-mgem": (["adadpals", "--data", "synthetic-mf:users=150,items=60,ratings=4000,seed=2", "--epsilon", "3", *RANK_STEPS,
                        "--set", "recommend=mgem", "--set", "rec_candidates=25", "--set", "users_per_shard=30", "--noise-seed", "17"], False),
    # the held-out-users protocol (Recall@k; ratings >= 3.5 are the positives: no implicit synthetic kind exists)
    "heldout": (["adadpals", "--data", "synthetic-mf:users=300,items=80,ratings=6000,seed=1", "--epsilon", "4", "--set", "split=heldout", *RANK_STEPS, "--noise-seed", "18"], False),
    "pam": (["pam", "--data", "synthetic-personal:users=400,samples=8,d=6,k=2,noise=0.01,seed=3", "--epsilon", "2", "--set", "epochs=2", "--noise-seed", "19"], True),
}
#: the same through the Flower engine's code path (ServerApp logic on an in-memory grid, no `flwr run`)
FLOWER = "flower-localgrid"
FLOWER_RUN = dict(algorithm="adadpals", data="synthetic-mf:users=80,items=40,ratings=2400,seed=5", epsilon=3.0,
                  overrides={"rank": "2", "steps": "2", "users_per_node": "20"}, noise_seed=3)
NAMES = [*COMMANDS, FLOWER]

PINNED_METRICS = ("epsilon_spent", "epsilon_spent_pld", "epsilon_spent_rdp", "rho_zcdp", "epsilon_training", "valid_rmse", "test_rmse",
                  "test_mse", "subspace_error", "released_mean", "released_n_users")
#: relative tolerance of each pinned value (module docstring); the default is the privacy one
MODEL_REL = 1e-5
PRIVACY_REL = 1e-7
TOLERANCES = {"valid_rmse": MODEL_REL, "test_rmse": MODEL_REL, "test_mse": MODEL_REL, "subspace_error": MODEL_REL}


# ---------------------------------------------------------------- structure
def json_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    if isinstance(v, str):
        return "str"
    if isinstance(v, list):
        return "list"
    if isinstance(v, dict):
        return "object"
    raise TypeError(f"not a JSON value: {type(v).__name__}")


def schema(doc) -> dict[str, str]:
    """{key path: "type|type"} in first-seen order (the root is ""); list elements share the path ``p[]``."""
    seen: dict[str, set[str]] = {}

    def walk(v, path: str) -> None:
        seen.setdefault(path, set()).add(json_type(v))
        if isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{path}.{k}" if path else k)
        elif isinstance(v, list):
            for x in v:
                walk(x, f"{path}[]")

    walk(doc, "")
    return {p: "|".join(sorted(t)) for p, t in seen.items()}


def pinned_values(metrics: dict, ledger: list[dict]) -> dict:
    out = {k: metrics[k] for k in PINNED_METRICS if k in metrics}
    out["ledger_noise_std"] = [r.get("noise_std") for r in ledger]
    return out


def golden_doc(name: str, argv: list[str], metrics: dict, ledger: list[dict], pin: bool) -> dict:
    doc = {"command": argv, "metrics": schema(metrics), "ledger": schema(ledger), "ledger_names": [r.get("name") for r in ledger]}
    if pin:
        doc["values"] = pinned_values(metrics, ledger)
    return doc


# ---------------------------------------------------------------- the runs (once per module)
def _cli(argv: list[str], out: Path, quiet: bool = True) -> tuple[dict, list[dict], str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["run", *argv, "--out", str(out), *(["--quiet"] if quiet else [])])
    assert code == 0, f"fedpriv run {' '.join(argv)} exited {code}:\n{stderr.getvalue()}"
    return json.loads((out / "metrics.json").read_text()), json.loads((out / "ledger.json").read_text()), stdout.getvalue(), stderr.getvalue()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[dict, list[dict]]]:
    from fedpriv.testing.local_grid import LocalGrid
    from fedpriv.flower.server_app import run_job
    from fedpriv.run import run, write_outputs

    root = tmp_path_factory.mktemp("schema")
    out = {}
    for name, (argv, _) in COMMANDS.items():
        m, led, _, _ = _cli(argv, root / name)
        out[name] = (m, led)
    kw = dict(FLOWER_RUN)
    m, led = run(kw.pop("algorithm"), kw.pop("data"), engine="flower", progress=False, flower_runner=lambda job, n: run_job(LocalGrid(n), job), **kw)
    write_outputs(root / FLOWER, m, led)
    out[FLOWER] = (json.loads((root / FLOWER / "metrics.json").read_text()), json.loads((root / FLOWER / "ledger.json").read_text()))
    return out


def _argv(name: str) -> list[str]:
    if name == FLOWER:
        return ["<fedpriv.run.run, engine='flower', LocalGrid>", json.dumps(FLOWER_RUN, sort_keys=True)]
    return COMMANDS[name][0]


def _diff(kind: str, w: dict, g: dict) -> str:
    lines = [f"{kind}: missing {p} ({w[p]})" for p in w if p not in g]
    lines += [f"{kind}: new {p} ({g[p]})" for p in g if p not in w]
    lines += [f"{kind}: {p} was {w[p]}, now {g[p]}" for p in w if p in g and w[p] != g[p]]
    if not lines and list(w) != list(g):
        lines.append(f"{kind}: same keys, other order")
    return "\n".join(lines)


def _close(a, b, rel: float = PRIVACY_REL) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=rel, abs_tol=0.0)
    return a == b and type(a) is type(b)


def _value_problems(want: dict, got: dict) -> list[str]:
    out = []
    for key, value in want.items():
        rel = TOLERANCES.get(key, PRIVACY_REL)
        if not _close(value, got.get(key), rel):
            out.append(f"value {key}: was {value!r}, now {got.get(key)!r} (rel tol {rel:g})")
    return out


@pytest.mark.parametrize("name", NAMES)
def test_outputs_match_the_golden_files(runs, name):
    metrics, ledger = runs[name]
    pin = COMMANDS[name][1] if name in COMMANDS else False
    got = golden_doc(name, _argv(name), metrics, ledger, pin)
    path = GOLDEN / f"{name}.json"
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=1) + "\n")
        return
    assert path.is_file(), f"no golden file {path}: FEDPRIV_REGEN_GOLDEN=1 writes it"
    want = json.loads(path.read_text())
    assert want["command"] == got["command"], "the command changed: regenerate the golden file (FEDPRIV_REGEN_GOLDEN=1)"
    problems = [_diff("metrics.json", want["metrics"], got["metrics"]), _diff("ledger.json", want["ledger"], got["ledger"])]
    if want["ledger_names"] != got["ledger_names"]:
        problems.append(f"ledger.json names: was {want['ledger_names']}, now {got['ledger_names']}")
    problems += _value_problems(want.get("values", {}), got.get("values", {}))
    problems = [p for p in problems if p]
    assert not problems, f"{name}: outputs differ from {path.name} (FEDPRIV_REGEN_GOLDEN=1 rewrites it if meant):\n" + "\n".join(problems)


@pytest.mark.parametrize("name", NAMES)
def test_the_typed_report_gives_metrics_json_back(runs, name):
    from fedpriv.run import RunReport

    metrics, _ = runs[name]
    report = RunReport.from_metrics(metrics)
    assert report.to_json() == metrics and list(report.to_json()) == list(metrics)
    assert json.dumps(report.to_json()) == json.dumps(metrics)  # same order, same values, nested too
    text = report.summary()
    assert report.algorithm in text and ("epsilon" in text if metrics["private"] else "non-private" in text)
    assert any(k in text for k in ("test RMSE", "test MSE", "Recall@", "log-loss"))


def test_the_schema_walk_sees_nested_paths_and_types():
    doc = {"a": 1, "b": [{"x": 1.0}, {"x": None, "y": "s"}], "c": {"d": True, "e": []}}
    got = schema(doc)
    assert list(got.items()) == [("", "object"), ("a", "int"), ("b", "list"), ("b[]", "object"), ("b[].x", "float|null"), ("b[].y", "str"),
                                 ("c", "object"), ("c.d", "bool"), ("c.e", "list")]
    assert _diff("m", {"a": "int", "b": "str"}, {"b": "str", "a": "int"}) == "m: same keys, other order"
    assert "now float" in _diff("m", {"a": "int"}, {"a": "float"}) and not _close(1.0, 1.0 + 1e-6) and _close(1.0, 1.0 + 1e-9)
    # the tolerances: a model metric moved by 1e-4 or an epsilon by 1e-6 is a change, not rounding
    assert _value_problems({"valid_rmse": 1.0, "epsilon_spent": 2.0}, {"valid_rmse": 1.0 + 2e-6, "epsilon_spent": 2.0 + 1e-8}) == []
    assert len(_value_problems({"valid_rmse": 1.0, "epsilon_spent": 2.0}, {"valid_rmse": 1.0001, "epsilon_spent": 2.000002})) == 2


def test_the_pinned_values_hold_on_the_other_kernel_and_one_thread(tmp_path, monkeypatch):
    """The golden values are not one CPU's: the same command through the torch kernels
    (FEDPRIV_NATIVE=0) on one thread gives them within the tolerances (its own float32
    rounding, like another CPU's), while the schema stays exact."""
    monkeypatch.setenv("FEDPRIV_NATIVE", "0")
    monkeypatch.setenv("FEDPRIV_THREADS", "1")
    argv, _ = COMMANDS["adadpals"]
    metrics, ledger, _, _ = _cli(argv, tmp_path / "out")
    want = json.loads((GOLDEN / "adadpals.json").read_text())
    got = golden_doc("adadpals", argv, metrics, ledger, True)
    assert _diff("metrics.json", want["metrics"], got["metrics"]) == ""
    assert _value_problems(want["values"], got["values"]) == []
