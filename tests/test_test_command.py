"""The test command touches the machine only as its suites need (issue 58 item 5): a filtered run
(`bash scripts/test.sh ARGS...`) installs no system package and starts no daemon, even as root;
the whole run sets up Debian's packages and dockerd first (the positive control runs that set-up
function alone). apt-get, dockerd and docker are stand-ins here that record their calls. The
whole run lints (ci/lint.sh: ruff, mypy) right after the default suite; a filtered run does not."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the system set-up runs as root only")


def _stubs(tmp_path: Path) -> tuple[dict, Path]:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    for name in ("apt-get", "dockerd", "debootstrap", "docker-compose", "chromium"):
        (bin_dir / name).write_text(f"#!/bin/sh\necho {name} \"$@\" >> {log}\n")
    # docker info answers once a (stand-in) dockerd was started
    (bin_dir / "docker").write_text(f"#!/bin/sh\necho docker \"$@\" >> {log}\ngrep -q '^dockerd' {log} 2>/dev/null\n")
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env.pop("FEDPRIV_REQUIRE_BROWSER", None)
    env.pop("FEDPRIV_REQUIRE_DOCKER", None)
    return env, log


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_a_filtered_run_installs_no_package_and_starts_no_daemon(tmp_path):
    env, log = _stubs(tmp_path)
    out = subprocess.run(["bash", "scripts/test.sh", "-p", "no:cacheprovider", "--collect-only", "-q", "-m", "not deployment", "tests/test_layers.py"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert _calls(log) == [], _calls(log)
    # positive control: the whole run's set-up, alone, as root: it installs and starts dockerd
    fn = f"source <(sed -n '/^system_setup() {{/,/^}}/p' {ROOT / 'scripts' / 'test.sh'}); system_setup"
    ctl = subprocess.run(["bash", "-c", fn], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)  # its build/ log lands there
    assert ctl.returncode == 0, ctl.stderr[-2000:]
    assert any(c.startswith("dockerd") for c in _calls(log)), _calls(log)


def _stand_in_project(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of scripts/test.sh and its helper in a project of its own under ``tmp_path`` whose
    steps (ci/venv.sh, ci/lint.sh, ci/install-check.sh and the two venvs' python) are stand-ins
    that record their calls in ``steps.log``: the run's steps in order, in seconds."""
    project, log = tmp_path / "project", tmp_path / "steps.log"
    (project / "scripts").mkdir(parents=True)
    for name in ("test.sh", "steps.sh"):
        (project / "scripts" / name).write_text((ROOT / "scripts" / name).read_text())
    (project / "ci").mkdir()
    for name in ("venv.sh", "lint.sh", "install-check.sh"):
        (project / "ci" / name).write_text(f'echo "ci/{name} $*" >> "{log}"\n')
    for venv in (".venv", ".venv-newest"):
        python = project / venv / "bin" / "python"
        python.parent.mkdir(parents=True)
        # `python -c ...` is the suite header asking for the venv's Flower version: not a step
        python.write_text(f'#!/bin/sh\nif [ "$1" = -c ]; then echo flwr 0; exit 0; fi\necho "{venv}/bin/python $*" >> "{log}"\n')
        python.chmod(0o755)
    return project, log


@pytest.mark.parametrize("args", [[], ["--all"], ["tests/test_layers.py"]], ids=["whole run", "--all", "filtered run"])
def test_the_whole_run_lints_right_after_the_default_suite_and_a_filtered_run_does_not(tmp_path, args):
    env, _ = _stubs(tmp_path)  # the system set-up's apt-get, dockerd and docker: stand-ins too
    project, log = _stand_in_project(tmp_path)
    out = subprocess.run(["bash", "scripts/test.sh", *args], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    steps = _calls(log)
    lint = [i for i, s in enumerate(steps) if s.startswith("ci/lint.sh")]
    if args == ["tests/test_layers.py"]:
        assert lint == [] and steps == ["ci/venv.sh .venv ci/constraints-oldest.txt", ".venv/bin/python -m pytest -q tests/test_layers.py"], steps
    else:
        assert len(lint) == 1 and steps[lint[0]] == "ci/lint.sh .venv", steps
        default_suite = ".venv/bin/python -m pytest -q -m not deployment and not experiments and not flower and not slow"
        assert lint[0] == 2 and steps[1].startswith(default_suite), steps  # after the venv, the default suite, then lint
        assert len(steps) > 3 and "lint and types" in out.stderr, (steps, out.stderr[-2000:])


@pytest.mark.parametrize("ruff_rc, mypy_rc", [(0, 0), (1, 0), (0, 1)])
def test_lint_prints_what_it_runs_runs_both_and_fails_on_any_finding(tmp_path, ruff_rc, mypy_rc):
    """ci/lint.sh VENV: `ruff check fedpriv`, then mypy (its files from pyproject.toml), each printed
    first; mypy runs after ruff found something; the exit status is 1 when either found anything.
    The venv's python is a stand-in that records its arguments and answers with the given codes."""
    log = tmp_path / "calls.log"
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> "{log}"\ncase "$2" in ruff) exit {ruff_rc};; mypy) exit {mypy_rc};; esac\nexit 9\n')
    python.chmod(0o755)
    out = subprocess.run(["bash", str(ROOT / "ci" / "lint.sh"), str(tmp_path / "venv")], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert _calls(log) == ["-m ruff check fedpriv", "-m mypy"], (_calls(log), out.stderr)
    assert out.stdout.splitlines() == [f"ci/lint.sh: {python} -m ruff check fedpriv", f"ci/lint.sh: {python} -m mypy"], out.stdout
    assert out.returncode == (1 if ruff_rc or mypy_rc else 0), out.stderr
