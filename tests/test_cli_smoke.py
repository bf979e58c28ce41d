"""Every command of the command line answers ``--help`` and runs once on tiny inputs.

The commands are read off the parser (:func:`fedpriv.cli._parser`, nested ones included:
``privacy plan``, ``selection scenarios``, ``deploy up``, ...), so a new command without an
entry in :data:`SMOKE` fails :func:`test_every_command_has_a_smoke_test`. Each entry is one real
invocation (in this process, through :func:`fedpriv.cli.main`, with small data and a temporary
folder) and what it must produce; where a real invocation needs long-lived processes (a
SuperLink and SuperNodes) the entry runs the command's checks instead and expects the clear
error they give, with the reason it stops there. One test runs the installed ``fedpriv``
console script itself.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from fedpriv.cli import _parser, main

SYN = "synthetic-mf:users=200,items=80,ratings=4000,seed=1"


def commands(parser: argparse.ArgumentParser | None = None, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every leaf command of the parser, as the words that name it."""
    parser = parser or _parser()
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [prefix]
    return [leaf for action in subs for name, sub in action.choices.items() for leaf in commands(sub, (*prefix, name))]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Smoke:
    """One invocation: ``argv`` (``{tmp}`` is the test's folder, ``{model}`` a saved model,
    ``{results}`` an experiment's results folder, ``{deployment}`` a prepared deployment whose
    ports nothing listens on), the exit code, and a check of what it wrote or printed
    (``check(tmp, out, err)``); ``why``: why it stops at a checked error."""

    argv: list[str]
    code: int = 0
    check: Callable[[Path, str, str], None] | None = None
    error: str | None = None  # a regex the error (stderr) must match, with code 2
    why: str = ""
    needs: list[str] = field(default_factory=list)


def _files(*names: str) -> Callable[[Path, str, str], None]:
    def check(tmp: Path, out: str, err: str) -> None:
        missing = [n for n in names if not (tmp / n).exists()]
        assert not missing, f"not written: {missing}"

    return check


def _run_check(tmp: Path, out: str, err: str) -> None:
    m = json.loads((tmp / "run" / "metrics.json").read_text())
    assert m["algorithm"] == "adadpals" and m["epsilon_spent"] <= 2.0 + 1e-9 and m["test_rmse"] > 0
    assert json.loads((tmp / "run" / "ledger.json").read_text()) and (tmp / "model" / "model.npz").is_file()
    assert json.loads(out.strip().splitlines()[-1])["algorithm"] == "adadpals"


def _plan_check(tmp: Path, out: str, err: str) -> None:
    plan = json.loads(out)
    assert plan and "epsilon" in json.dumps(plan)


def _recommend_check(tmp: Path, out: str, err: str) -> None:
    lines = [json.loads(x) for x in out.splitlines()]
    assert [r["rank"] for r in lines] == [1, 2, 3] and not {r["item"] for r in lines} & {3, 7}


def _compose_check(tmp: Path, out: str, err: str) -> None:
    assert "services:" in out and "superlink" in out and "supernode-1" in out


def _experiment_check(tmp: Path, out: str, err: str) -> None:
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["experiments"][0]["name"] == "smoke" and summary["experiments"][0]["runs"] == 1
    assert (tmp / "exp" / "smoke" / "results.csv").is_file()


def _report_check(tmp: Path, out: str, err: str) -> None:
    page = (tmp / "report.html").read_text()
    assert "<html" in page.lower() and "smoke" in page.lower()


#: command -> its smoke invocation
SMOKE: dict[tuple[str, ...], Smoke] = {
    ("run",): Smoke(["run", "adadpals", "--data", SYN, "--epsilon", "2", "--set", "steps=1", "--set", "rank=2", "--out", "{tmp}/run",
                     "--save-model", "{tmp}/model", "--quiet"], check=_run_check),
    ("privacy", "plan"): Smoke(["privacy", "plan", "adadpals", "--epsilon", "5", "--set", "steps=2", "--json"], check=_plan_check),
    ("recommend",): Smoke(["recommend", "--model", "{model}", "--ratings", "{tmp}/me.csv", "--k", "3", "--json"], check=_recommend_check, needs=["model"]),
    ("selection", "scenarios"): Smoke(["selection", "scenarios", "--out", "{tmp}/sel", "--scenarios", "s1-bimodal-pos", "--epsilons", "1",
                                       "--trials", "30", "--mechanisms", "rnm", "uniform"], check=_files("sel/selection.json")),
    ("selection", "bandit"): Smoke(["selection", "bandit", "--out", "{tmp}/bandit", "--horizon", "200", "--reps", "2", "--policies", "ucb", "mgem"],
                                   check=_files("bandit/bandit.json", "bandit/bandit.png")),
    ("deploy", "partition"): Smoke(["deploy", "partition", "--data", SYN, "--users-per-node", "100", "--out", "{tmp}/part"],
                                   check=_files("part/public", "part/node-0", "part/node-1")),
    ("deploy", "prepare"): Smoke(["deploy", "prepare", "--run-dir", "{tmp}/dep", "--nodes", "2", "--data", SYN, "--users-per-node", "100"],
                                 check=_files("dep/deploy.json", "dep/certs/ca.crt", "dep/keys/node-0", "dep/public-keys/node-1.pub", "dep/node-data")),
    ("deploy", "compose"): Smoke(["deploy", "compose", "--nodes", "2"], check=_compose_check),
    ("deploy", "certs"): Smoke(["deploy", "certs", "{tmp}/c", "--nodes", "2"], check=_files("c/certs/ca.crt", "c/certs/server.pem", "c/public-keys/node-1.pub")),
    ("deploy", "down"): Smoke(["deploy", "down", "--run-dir", "{deployment}"], needs=["deployment"],
                              check=lambda tmp, out, err: json.loads(out)["stopped"] == []),
    ("deploy", "up"): Smoke(["deploy", "up", "--run-dir", "{tmp}/up", "--nodes", "0"], code=2, error=r"--nodes:",
                            why="a real `up` starts a SuperLink and SuperNodes that outlive the command (tests/test_deploy.py, deployment suite); here its checks, before anything starts"),
    ("deploy", "run"): Smoke(["deploy", "run", "--run-dir", "{tmp}/nothing-here", "als"], code=2, error=r"--run-dir",
                             why="needs a running deployment (`deploy up`; tests/test_deploy.py, deployment suite); here: no deployment in the folder"),
    ("deploy", "status"): Smoke(["deploy", "status", "--run-dir", "{deployment}"], code=2, error=r"SuperLink|supernode ls", needs=["deployment"],
                                why="asks a running SuperLink for its nodes (deployment suite); here a prepared deployment that was never started"),
    ("deploy", "register"): Smoke(["deploy", "register", "--run-dir", "{deployment}", "--wait", "1"], code=2, error=r"did not answer within", needs=["deployment"],
                                  why="registers the node keys with a running SuperLink (deployment suite); here a prepared deployment that was never started"),
    ("experiment",): Smoke(["experiment", "--out", "{tmp}/exp", "{tmp}/smoke.toml"], check=_experiment_check),
    ("report",): Smoke(["report", "{results}", "--out", "{tmp}/report.html"], check=_report_check, needs=["results"]),
}

EXPERIMENT = f"""
[experiment]
name = "smoke"
title = "Smoke"
description = "one cell"
kind = "grid"

[datasets]
tiny = "{SYN}"

[grid]
datasets = ["tiny"]
epsilons = [2]
seeds = 1

[methods.ada]
algorithm = "adadpals"
params = {{ steps = 1, rank = 2 }}
"""


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    import fedpriv

    path = tmp_path_factory.mktemp("model") / "model"
    fedpriv.train("als", SYN, steps=1, rank=2).save_model(path)
    return path


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("results")
    (folder / "smoke.toml").write_text(EXPERIMENT)
    assert main(["experiment", "--out", str(folder / "exp"), str(folder / "smoke.toml")]) == 0
    return folder / "exp"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory) -> Path:
    """A prepared deployment (certificates, keys, per-node data) that was never started, on
    ports nothing listens on: the commands that talk to its SuperLink reach no one else's."""
    run_dir = tmp_path_factory.mktemp("deployment") / "dep"
    argv = ["deploy", "prepare", "--run-dir", str(run_dir), "--nodes", "2", "--data", SYN, "--users-per-node", "100",
            "--fleet-port", str(_free_port()), "--control-port", str(_free_port())]
    assert main(argv) == 0
    return run_dir


# ----------------------------------------------------------------------------- tests
def test_every_command_has_a_smoke_test():
    found = set(commands())
    assert found, "no commands found on the parser"
    assert not found - set(SMOKE), f"commands without a smoke test: add them to SMOKE: {sorted(found - set(SMOKE))}"
    assert not set(SMOKE) - found, f"smoke tests of commands that no longer exist: {sorted(set(SMOKE) - found)}"
    for cmd, smoke in SMOKE.items():
        assert smoke.argv[: len(cmd)] == list(cmd), cmd
        assert (smoke.code == 0) == (smoke.error is None) and (smoke.code == 0 or smoke.why), cmd


@pytest.mark.parametrize("cmd", sorted(SMOKE), ids=" ".join)
def test_help(cmd, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*cmd, "--help"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: fedpriv {' '.join(cmd)}"), out[:300]
    assert "--help" in out and len(out.splitlines()) >= 3


@pytest.mark.parametrize("cmd", sorted(SMOKE), ids=" ".join)
def test_one_real_invocation(cmd, tmp_path, capsys, monkeypatch, request):
    smoke = SMOKE[cmd]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "me.csv").write_text("item,rating\n3,5\n7,4\n")
    (tmp_path / "smoke.toml").write_text(EXPERIMENT)
    fill = {"tmp": str(tmp_path)} | {name: str(request.getfixturevalue(name)) for name in smoke.needs}
    capsys.readouterr()
    argv = [re.sub(r"\{(\w+)\}", lambda m: fill[m.group(1)], a) for a in smoke.argv]
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == smoke.code, f"fedpriv {' '.join(argv)} exited {code}\n--- stdout\n{out[-2000:]}\n--- stderr\n{err[-3000:]}"
    if smoke.error is not None:
        assert re.search(smoke.error, err), err[-2000:]
        assert re.search(r"^fedpriv: error: ", err, re.M) and "Traceback" not in err, err  # a clear message, no traceback
    if smoke.check is not None:
        smoke.check(tmp_path, out, err)


def test_the_console_script_runs():
    """The installed ``fedpriv`` entry point itself (the others call :func:`main`)."""
    exe = Path(sys.executable).parent / "fedpriv"
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=120)
    assert version.returncode == 0 and version.stdout.startswith("fedpriv "), version.stderr[-2000:]
    usage = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "usage: fedpriv" in usage.stderr
