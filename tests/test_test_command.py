"""The test command touches the machine only as its suites need (issue 58 item 5): a filtered run
(`bash scripts/test.sh ARGS...`) installs no system package and starts no daemon, even as root;
the whole run sets up Debian's packages and dockerd first (the positive control runs that set-up
function alone). apt-get, dockerd and docker are stand-ins here that record their calls."""

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
