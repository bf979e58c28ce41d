"""Stopping a run leaves nothing behind: SIGINT, SIGTERM and SIGHUP on a long-running command
stop every process it started and remove its temporary folders, and the command exits 128 + n
with one line and no traceback (:mod:`fedpriv.util.stopping`).

The Flower run is the hard case: `flwr run` detaches its local SuperLink, which starts
SuperExec, the simulation and Ray's daemons in sessions of their own. The test gives the
command a fresh TMPDIR, which every process it starts inherits: after the stop, no process may
carry that TMPDIR in its environment and the folder must be empty."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fedpriv.util.processes import pids_with_env
from fedpriv.util.stopping import Stopped, stop_signals

ROOT = Path(__file__).resolve().parents[1]
SYN = "synthetic-mf:users=80,items=40,ratings=2400,seed=5"


def _start(args: list[str], tmp: Path, env_extra: dict | None = None) -> subprocess.Popen:
    tmp.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1", **(env_extra or {})}
    return subprocess.Popen([sys.executable, "-m", "fedpriv", *args], cwd=tmp.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_line(proc: subprocess.Popen, needle: str, seconds: float) -> tuple[list[str], threading.Thread]:
    """Waits until a line of ``proc``'s stderr contains ``needle``; returns the list the lines go
    to (all of them once the thread, returned too, has ended)."""
    lines: list[str] = []
    seen = threading.Event()

    def read():
        for line in proc.stderr:
            lines.append(line)
            if needle in line:
                seen.set()
        seen.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert seen.wait(seconds), f"no {needle!r} within {seconds} s:\n{''.join(lines)[-3000:]}"
    assert proc.poll() is None, f"the run ended before the signal:\n{''.join(lines)[-3000:]}"
    return lines, reader


def _left_behind(tmp: Path, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (pids := pids_with_env("TMPDIR", str(tmp), prefix=True)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return pids


@pytest.mark.flower
@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_a_signal_mid_round_stops_every_process_of_a_flower_run_and_removes_its_folders(tmp_path, sig):
    tmp = tmp_path / "tmp"
    out = tmp_path / "out"
    proc = _start(["run", "adadpals", "--data", SYN, "--epsilon", "2", "--engine", "flower", "--users-per-node", "20",
                   "--set", "rank=2", "--set", "steps=40", "--out", str(out)], tmp)
    try:
        lines, reader = _wait_for_line(proc, "[fedpriv] round step", 240)  # training has started: mid-round
        assert pids_with_env("TMPDIR", str(tmp), prefix=True), "the run's processes carry its TMPDIR"  # positive control of the oracle
        t0 = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
        seconds = time.monotonic() - t0
        left = _left_behind(tmp, max(0.0, 10.0 - seconds))
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in pids_with_env("TMPDIR", str(tmp), prefix=True):
            os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    tail = "".join(lines)
    assert code == 128 + sig, tail[-3000:]
    assert seconds <= 10.0, f"stopped in {seconds:.1f} s"
    assert left == [], f"processes left: {left}"
    assert "Traceback" not in tail
    assert tail.rstrip().splitlines()[-1].startswith(f"fedpriv: stopped by {signal.Signals(sig).name}"), tail[-500:]
    assert list(tmp.iterdir()) == [], f"left in TMPDIR: {[p.name for p in tmp.iterdir()]}"
    assert not out.exists()  # nothing half-written


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_an_in_process_run_stops_on_each_signal_with_one_line(tmp_path, sig):
    tmp = tmp_path / "tmp"
    out = tmp_path / "out"
    proc = _start(["run", "adadpals", "--data", "synthetic-mf:users=3000,items=400,ratings=150000,seed=1", "--epsilon", "2",
                   "--set", "rank=8", "--set", "steps=400", "--out", str(out)], tmp)
    try:
        lines, reader = _wait_for_line(proc, "adadpals:", 120)  # the step progress bar: training
        proc.send_signal(sig)
        code = proc.wait(timeout=30)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines)
    assert code == 128 + sig, text[-2000:]
    assert "Traceback" not in text
    assert text.rstrip().splitlines()[-1].startswith(f"fedpriv: stopped by {signal.Signals(sig).name}")
    assert not out.exists() and list(tmp.iterdir()) == []


def test_stop_signals_raise_stopped_and_let_the_cleanup_finish():
    cleaned = []
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stopped) as info:
        with stop_signals():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # interrupted by the handler
            finally:
                os.kill(os.getpid(), signal.SIGTERM)  # a second signal during the clean-up is ignored
                cleaned.append(True)
    assert cleaned == [True] and info.value.exit_code == 143 and info.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before  # the previous handler is back


@pytest.mark.flower
def test_ctrl_c_on_the_main_job_script_stops_everything_with_one_line():
    """`bash scripts/run.sh` interrupted mid-run as a terminal's Ctrl-C does (SIGINT to its
    whole process group), once the simulation is writing into the run's own folder: exit 130,
    one line, no traceback, no process left under the run's own FLWR_HOME (SuperLink,
    SuperExec, simulation, Ray: a private one in the run's temporary folder), and that folder,
    installed apps included, gone.

    The signal is sent as soon as the run's processes and its folder are seen, not at a log
    line: `flwr run --stream` may deliver the rounds' lines late, and the default run (the bias
    model, five rounds) can end within the time that checking its processes takes."""
    proc = subprocess.Popen(["bash", "scripts/run.sh"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    proc.stderr = proc.stdout  # one stream: _wait_for_line reads it
    home = None
    try:
        lines, reader = _wait_for_line(proc, "", 400)  # the reader thread, from the first line on
        deadline = time.monotonic() + 400
        while home is None:  # the run's own FLWR_HOME (a private one, in its temporary folder), as run.sh prints it
            found = [re.search(r"\(FLWR_HOME=([^)]+)\)", line) for line in list(lines)]
            home = next((Path(m.group(1)) for m in found if m), None)
            assert proc.poll() is None or home is not None, f"run.sh ended without naming its FLWR_HOME:\n{''.join(lines)[-3000:]}"
            assert time.monotonic() < deadline, f"run.sh named no FLWR_HOME:\n{''.join(lines)[-3000:]}"
            time.sleep(0.05)
        while True:  # the oracle's positive controls: the run's processes carry the project's FLWR_HOME, and write into their own folder
            running = pids_with_env("FLWR_HOME", str(home))
            run_tmp = {_environ(pid).get("TMPDIR") for pid in running} - {None}
            if len(run_tmp) == 1 and Path(next(iter(run_tmp))).is_dir() and any(Path(next(iter(run_tmp))).iterdir()):
                break
            assert proc.poll() is None, f"the run ended before its processes and folder were seen:\n{''.join(lines)[-3000:]}"
            assert time.monotonic() < deadline, f"no process of the run wrote into its folder:\n{''.join(lines)[-3000:]}"
            time.sleep(0.05)
        run_tmp = Path(next(iter(run_tmp)))
        assert run_tmp.name.startswith("fedpriv-run."), run_tmp
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=30)
        reader.join(timeout=10)
        left = []
        deadline = time.monotonic() + 10
        while (left := pids_with_env("FLWR_HOME", str(home))) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for pid in (pids_with_env("FLWR_HOME", str(home)) if home is not None else []):
            os.kill(pid, signal.SIGKILL)
    text = "".join(lines)
    assert code == 130, text[-3000:]
    assert left == []
    assert not run_tmp.exists(), f"the run's temporary folder is left: {sorted(p.name for p in run_tmp.iterdir())}"
    assert home.is_relative_to(run_tmp) and not home.exists()  # the private FLWR_HOME (its installed apps too) went with the run's folder
    assert "Traceback" not in text, text[-3000:]
    assert text.rstrip().splitlines()[-1].startswith("run.sh: stopped by SIGINT"), text[-500:]


def _environ(pid: int) -> dict:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def _script_project(tmp_path: Path, script: str) -> Path:
    """A copy of ``scripts/<script>`` and its helpers in a project of its own under ``tmp_path``,
    whose first long step (``pip install`` for run.sh, ``ci/venv.sh`` for test.sh) is a stand-in
    that records its PID in ``step.pid`` and sleeps: a stop during the script's setup, made
    reproducible."""
    project = tmp_path / "project"
    (project / "scripts").mkdir(parents=True)
    for name in (script, "steps.sh"):
        (project / "scripts" / name).write_text((ROOT / "scripts" / name).read_text())
    pidfile = project / "step.pid"
    bin_dir = project / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    python = bin_dir / "python"  # the real interpreter, but `-m pip install ...` sleeps
    python.write_text(f'#!/bin/sh\ncase "$*" in\n  *"-m pip install"*) echo $$ > "{pidfile}"; exec sleep 300;;\nesac\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    (project / "ci").mkdir()
    (project / "ci" / "venv.sh").write_text(f'echo $$ > "{pidfile}"\nexec sleep 300\n')
    return project


@pytest.mark.parametrize("script", ["run.sh", "test.sh"])
@pytest.mark.parametrize("how", ["SIGTERM to the script", "Ctrl-C (SIGINT to its process group)", "SIGHUP to the script"])
def test_a_stop_during_a_scripts_setup_stops_the_step_it_was_waiting_for(tmp_path, script, how):
    """`bash scripts/run.sh` and `bash scripts/test.sh` stopped while they install (pip, the
    venv script): the step they were waiting for is stopped too, the run's temporary folder is
    gone, and the script exits 128 + n with one line. Before scripts/steps.sh, bash deferred the
    script's trap until the step ended, and a signal to the script alone never reached the step,
    so `pip install` (here a stand-in that sleeps) kept running after the script was gone."""
    project = _script_project(tmp_path, script)
    pidfile = project / "step.pid"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHON": sys.executable}
    log = tmp_path / "output.txt"  # a file, not a pipe: a step left running would hold a pipe open
    with log.open("w") as out:
        proc = subprocess.Popen(["bash", f"scripts/{script}"], cwd=project, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    step_pid = None
    try:
        deadline = time.monotonic() + 60
        while not (pidfile.exists() and pidfile.read_text().strip()):
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"the script never reached its setup step:\n{log.read_text()}"
            time.sleep(0.05)
        step_pid = int(pidfile.read_text())
        assert Path(f"/proc/{step_pid}").exists()  # the positive control: the step runs when the signal is sent
        run_tmp = _environ(step_pid).get("TMPDIR") if script == "run.sh" else None
        sig = {"SIGTERM": signal.SIGTERM, "Ctrl-C": signal.SIGINT, "SIGHUP": signal.SIGHUP}[how.split()[0]]
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        text = log.read_text()
        if step_pid and Path(f"/proc/{step_pid}").exists():
            os.kill(step_pid, signal.SIGKILL)
            left = True
        else:
            left = False
    assert not left, f"the setup step (PID {step_pid}) is still running after the script stopped:\n{text}"
    assert code == 128 + sig, text
    name = signal.Signals(sig).name
    assert text.rstrip().splitlines()[-1].startswith(f"{script}: stopped by {name}"), text
    if run_tmp is not None:  # run.sh's own temporary folder (pip builds there)
        assert run_tmp.startswith("/tmp/fedpriv-run.") and not Path(run_tmp).exists(), run_tmp
