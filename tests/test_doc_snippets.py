"""What the documentation says runs as written: every fenced shell and Python block of README.md,
docs/**/*.md, examples/*/README.md and docker/README.md runs on small data, or is listed in
:data:`SKIPPED` with the reason it cannot run here. A new or changed block fails this test
instead of a user: a new block runs by default, and a listed block whose text changed fails
until it is reviewed again (each entry holds the digest of the text it was reviewed on).

**Blocks.** A fence's language says what it is: ``bash``, ``sh``, ``shell`` and ``console``
blocks are commands, ``python`` blocks are code, anything else (``text``, ``toml``, ...) is not
run; a fence without a language fails :func:`test_every_fence_declares_its_language`. A block's
id is ``FILE#N``, the N-th (from 1) shell or Python block of FILE.

**How a block runs.** In a fresh temporary working directory holding the fixture files below:

- Python: the blocks of one page run in order in one namespace (a tutorial's second block uses
  the first's variables); a :class:`~fedpriv.errors.FedprivWarning` (e.g. a recommendation that
  fell back to the popularity list because no rating matched) is an error.
- Shell: ``bash -e`` on the block, ``.venv/bin`` first on ``PATH``, Flower offline with its home
  in the folder. ``console`` blocks run their ``$`` lines, and the output they show must appear,
  in order, in what the command prints (numbers within 0.2%). Every ``--out DIR`` and
  ``--save-model DIR`` of the block must exist afterwards, and no command may print a
  ``fedpriv: warning:`` (a documented command should not need one).
- A block identical to an earlier one (docs/index.md repeats the README) runs once, as the
  earlier one.

**Placeholders** (the same for every block):

- ``ml-100k:PATH`` and ``../shared/data``: the shared data (``tests/conftest.py:SHARED_DATA``);
  a block that needs it is skipped, naming it, where it is absent;
- ``ratings.csv`` / ``items.csv``: a generated table (150 users, 4,500 low-rank ratings on 1..5)
  and its catalogue, items ``1``..``200`` (integer ids, as MovieLens's, so the documented ids
  1, 50 and 181 exist); ``mine.csv``: one user's ratings of items 1, 50 and 181;
- ``simulations/``, ``benchmarks/`` and ``scripts/`` are links to the checkout's; ``examples/``
  is a copy (its scripts write beside themselves); ``.venv/bin`` holds ``fedpriv``, ``flwr`` and
  ``python`` of the test's environment, and ``pip`` refuses (a new block that installs packages
  fails instead of changing the shared environment);
- ``model/``, ``runs/``, ``results/``: written in the temporary folder.

Per-block substitutions (smaller data where the documented command takes minutes here) are in
:data:`SUBSTITUTIONS`, each with its reason; blocks that take longer than the default suite
allows run in the suite :data:`SUITES` names (scripts/test.sh runs the experiments and
deployment suites).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
SHELL = {"bash", "sh", "shell", "console"}
PYTHON = {"python", "py"}
ML100K = SHARED_DATA / "ml-100k" / "ml-100k.zip"
SMALL = "synthetic-mf:users=200,items=80,ratings=4000,seed=1"
SHORT_S, LONG_S = 300, 900  # a block's time limit: default suite, experiments / deployment suites


@dataclass(frozen=True)
class Skip:
    """A block that does not run here: ``digest`` of the text it was reviewed on, and why."""

    digest: str
    reason: str


# ----------------------------------------------------------------------------- the tables
#: THE table of blocks that do not run (block id -> the digest of the reviewed text, the reason)
SKIPPED: dict[str, Skip] = {
    "README.md#1": Skip("a389425614", "creates a virtual environment and pip-installs fedpriv (network; would change the shared .venv); tests/test_packaging.py builds and installs the package"),
    "README.md#2": Skip("0c03bb6a75", "pip-installs a built wheel into the environment (would change the shared .venv); tests/test_packaging.py builds the wheel and installs it in a fresh venv"),
    "README.md#3": Skip("3e54e58e0e", "scripts/test.sh runs every test suite (this file included; > 10 min) and both scripts pip-install into .venv; run.sh's job (`flwr run .`) is tests/test_flwr_run.py"),
    "README.md#7": Skip("04f74cd23b", "root and Docker (Debian base image, compose); tests/test_docker.py (deployment suite) builds the images and runs docker/compose.yml"),
    "README.md#8": Skip("f3e6aa6197", "pip-installs the docs extras (network) and opens a browser (xdg-open); tests/test_docs.py builds the site strictly"),
    "docs/how-to/deployment.md#2": Skip("12ed55c46b", "several hosts (10.0.0.1 and the nodes' hosts) and placeholders for a real deployment (SPEC, U, i); the deployment suite runs the same processes on loopback (tests/test_deploy.py)"),
    "docs/how-to/deployment.md#3": Skip("728b62204b", "root and Docker (sudo docker/build-images.sh, docker-compose); tests/test_docker.py (deployment suite) runs these steps"),
    "docs/how-to/experiments.md#1": Skip("3268072ac7", "every shipped experiment config in full (hours on this machine); tests/test_experiments.py (experiments suite) runs every config with --quick and renders the report"),
    "docs/how-to/gpu.md#1": Skip("06e9819a6a", "needs a CUDA GPU (exits 2 naming --device without one); tests/test_device.py runs the same path on torch's CPU device everywhere and on CUDA where present"),
    "docs/how-to/gpu.md#4": Skip("1affa8321e", "downloads wheels from the package index (network; the test's pip refuses) and runs the whole GPU check at the papers' shapes (needs a CUDA GPU); gpu.md#3 runs gpu_check.sh on torch's CPU device with small shapes"),
    "docs/how-to/ray-cluster.md#2": Skip("1d448f596f", "a Ray head on another host (10.0.0.5; network); tests/test_ray_cluster.py starts a head on loopback"),
    "docs/how-to/ray-cluster.md#3": Skip("18b77c0a95", "a Ray worker joining a head at 10.0.0.5 (network, a second host); tests/test_ray_two_hosts.py"),
    "docs/how-to/ray-cluster.md#4": Skip("87aa689d28", "a Ray cluster at 10.0.0.5 and a `job` from the page's text (network)"),
    "docs/how-to/ray-cluster.md#5": Skip("0fb8a3baf3", "a Ray cluster (RAY_ADDRESS=10.0.0.5), a shared /shared/fedpriv/tmp and `--data ...` left to the reader"),
    "docs/how-to/ray-cluster.md#6": Skip("24486f2184", "placeholders (<free> ports, /tmp/fpray-XXXX) for what tests/test_ray_cluster.py does (deployment suite)"),
    "docs/how-to/ray-cluster.md#7": Skip("5e2b56883c", "a SuperLink listening on 0.0.0.0 with the deployment's certificates (network)"),
    "docs/how-to/ray-cluster.md#8": Skip("a292b642b7", "registers a key with a running SuperLink of a real deployment (network)"),
    "docs/how-to/ray-cluster.md#9": Skip("05fd916aa8", "a SuperNode dialling link.example.org (network)"),
    "docs/results/defaults-grid.md#1": Skip("73b1edded1", "the defaults benchmark: 12 minutes of training on the four data sets"),
    "docs/results/index.md#1": Skip("7173028b12", "every shipped experiment config in full (hours); tests/test_experiments.py (experiments suite) runs every config with --quick and renders the report"),
    "docs/results/index.md#2": Skip("75e9226dcf", "the ML-100K hyperparameter search: 40 trials x 3 seeds of training (tens of minutes)"),
    "docs/tutorials/flwr-run.md#1": Skip("522b5f8546", "scripts/test.sh runs every test suite (this file included; > 10 min) and both scripts pip-install into .venv; run.sh's job (`flwr run .`) is tests/test_flwr_run.py"),
    "docker/README.md#1": Skip("6fc14cbd69", "installs Debian packages (root, network)"),
    "docker/README.md#2": Skip("55a3e46f09", "root and Docker (debootstrap, docker build); tests/test_docker.py (deployment suite)"),
    "docker/README.md#4": Skip("6737c32292", "Docker (docker-compose up, logs, exec); tests/test_docker.py (deployment suite)"),
    "docker/README.md#5": Skip("1a8b2ac410", "Docker (docker-compose exec); tests/test_docker.py (deployment suite)"),
    "docker/README.md#6": Skip("bc8db996a3", "Docker (docker-compose down, docker rmi); tests/test_docker.py (deployment suite)"),
}

#: blocks that run, but in another suite than the default one (block id -> (marker, why))
SUITES: dict[str, tuple[str, str]] = {
    "docs/explanations/algorithms.md#1": ("experiments", "pam on 50,000 users (about a minute here) and pam-exp on 5,000 (20 s)"),
    "docs/explanations/algorithms.md#2": ("experiments", "a private-recommendation run on ML-100K, the selection scenarios and bandit, and the ML-100K selection table: minutes"),
    "docs/how-to/secure-aggregation.md#2": ("experiments", "`flwr run` with 48 simulated nodes on ML-100K: about 2 minutes here"),
    "docs/how-to/deployment.md#1": ("deployment", "starts a SuperLink and 3 SuperNodes on loopback (TLS, node authentication) and runs a job on ML-100K over gRPC"),
    "docker/README.md#7": ("deployment", "starts a SuperLink and SuperNodes on loopback and runs a job on ML-100K over gRPC"),
    "examples/secure-fedavg/README.md#1": ("experiments", "two `flwr run`s of the example app (10 and 20 simulated nodes): minutes"),
    # the Flower-engine tests run on the newest supported Flower (scripts/test.sh)
    "README.md#6": ("flower", "`fedpriv run --engine flower`: `flwr run` on Flower's simulation runtime"),
}

#: per-block substitutions: block id -> [(documented text, what runs instead, why)]
SUBSTITUTIONS: dict[str, list[tuple[str, str, str]]] = {
    "README.md#6": [("ml-100k:PATH", SMALL, "`flwr run` with 48 simulated nodes on ML-100K takes about 2 minutes here; the in-process block above runs on ML-100K")],
    "docs/explanations/algorithms.md#2": [
        ("fedpriv selection scenarios --out", "fedpriv selection scenarios --quick --out", "the full scenarios take 110 s"),
        ("fedpriv selection bandit --out", "fedpriv selection bandit --quick --out", "the full bandit takes 30 s"),
    ],
    "docs/how-to/tuning.md#1": [("--data ml-100k:PATH", "--data csv:ratings.csv --data-opt rating_range=1,5 --data-opt items=items.csv",
                                 "five tuning runs on ML-100K take about 30 s here; the same on the generated table")],
    "examples/secure-fedavg/README.md#1": [("out='/tmp/secure-fedavg.json'", "out='$PWD/secure-fedavg.json'", "writes in the test's folder, not /tmp")],
}


# ----------------------------------------------------------------------------- the blocks
@dataclass(frozen=True)
class Block:
    id: str
    file: str  # relative to the repository root
    line: int  # of the opening fence
    lang: str
    code: str

    @property
    def digest(self) -> str:
        return digest(self.code)


def digest(code: str) -> str:
    return hashlib.sha256(code.strip().encode()).hexdigest()[:10]


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").glob("*/README.md")), ROOT / "docker" / "README.md"]
    return [f for f in files if f.is_file()]


FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


def fences(path: Path) -> list[tuple[int, str, str]]:
    """Every fenced block of a Markdown file: (line of the opening fence, language, text)."""
    out, lines, i = [], path.read_text(encoding="utf-8").splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = len(m["indent"]), m["fence"], m["info"].strip()
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", lines[j]):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        lang = info.split()[0].strip("{}.").lower() if info else ""
        out.append((i + 1, lang, "\n".join(body) + "\n"))
        i = j + 1
    return out


def collect() -> list[Block]:
    blocks = []
    for path in doc_files():
        rel = path.relative_to(ROOT).as_posix()
        n = 0
        for line, lang, code in fences(path):
            if lang in SHELL or lang in PYTHON:
                n += 1
                blocks.append(Block(f"{rel}#{n}", rel, line, lang, code))
    return blocks


BLOCKS = collect()
BY_ID = {b.id: b for b in BLOCKS}


def _first_of_same() -> dict[str, str]:
    """Shell block id -> the id of the earlier block with the same language and text."""
    seen, same = {}, {}
    for b in BLOCKS:
        if b.lang in SHELL:
            key = (b.lang, b.code.strip())
            if key in seen:
                same[b.id] = seen[key]
            else:
                seen[key] = b.id
    return same


SAME_AS = _first_of_same()


def _marks(ids) -> list:
    suites = {SUITES[i][0] for i in ids if i in SUITES}
    return [getattr(pytest.mark, s) for s in sorted(suites)]


# ----------------------------------------------------------------------------- fixture files
def _write_fixture(work: Path) -> None:
    rng = np.random.default_rng(7)
    n_users, n_items, per = 150, 200, 30
    U, V = rng.normal(0, 0.7, (n_users, 3)), rng.normal(0, 0.7, (n_items, 3))
    rows = ["user,item,rating"]
    for u in range(n_users):
        for i in rng.choice(n_items, per, replace=False):
            rows.append(f"{u + 1},{i + 1},{int(np.clip(np.rint(3 + U[u] @ V[i] + rng.normal(0, 0.5)), 1, 5))}")
    (work / "ratings.csv").write_text("\n".join(rows) + "\n")
    (work / "items.csv").write_text("item\n" + "".join(f"{i}\n" for i in range(1, n_items + 1)))
    (work / "mine.csv").write_text("item,rating\n1,5\n50,4\n181,5\n")
    for name in ("simulations", "benchmarks", "scripts"):
        (work / name).symlink_to(ROOT / name, target_is_directory=True)
    shutil.copytree(ROOT / "examples", work / "examples", ignore=shutil.ignore_patterns(".flwr", "__pycache__", "*.json"))
    # `.venv/bin/fedpriv` as documented, but no way into the shared environment's pip: a block
    # that installs packages fails here (PIP_NO_INDEX, PIP_DRY_RUN and refusing pip shims in _env)
    for folder in (work / ".venv" / "bin", work / ".guard"):
        folder.mkdir(parents=True)
    for name in ("fedpriv", "flwr", "python", "python3"):
        _script(work / ".venv" / "bin" / name, f'exec "{VENV_BIN / name}" "$@"')
    for name in ("pip", "pip3"):
        _script(work / ".venv" / "bin" / name, REFUSE_PIP)
        _script(work / ".guard" / name, REFUSE_PIP)


REFUSE_PIP = 'echo "the documentation tests install no package (list the block in SKIPPED)" >&2; exit 1'


def _script(path: Path, body: str) -> None:
    path.write_text(f"#!/usr/bin/env bash\n{body}\n")
    path.chmod(0o755)


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    _write_fixture(folder)
    monkeypatch.chdir(folder)
    return folder


def _without_comments(code: str) -> str:
    return "\n".join(re.sub(r"(^|\s)#.*$", "", line) for line in code.splitlines())


def _prepared(block: Block) -> str:
    """The block's text with its substitutions and the shared data's path."""
    code = block.code
    for old, new, _ in SUBSTITUTIONS.get(block.id, ()):
        assert old in code, f"{block.id}: the substitution's text {old!r} is no longer in the block: update SUBSTITUTIONS"
        code = code.replace(old, new)
    needs = [p for p in ("ml-100k:PATH", "../shared/data") if p in _without_comments(code)]
    if needs and not SHARED_DATA.is_dir():
        pytest.skip(f"{block.id} needs the shared data ({', '.join(needs)}), absent at {SHARED_DATA}")
    return code.replace("ml-100k:PATH", f"ml-100k:{ML100K}").replace("../shared/data", str(SHARED_DATA))


def _skip_listed(block_id: str) -> None:
    if block_id in SKIPPED:
        pytest.skip(f"{block_id}: {SKIPPED[block_id].reason}")
    if block_id in SAME_AS:
        pytest.skip(f"{block_id}: the same commands as {SAME_AS[block_id]}, which is run or listed there")


# ----------------------------------------------------------------------------- the tables are current
def test_every_fence_declares_its_language():
    """A command cannot hide in an unlabelled block: output, diagrams and synopses say ``text``."""
    bare = [f"{p.relative_to(ROOT)}:{line}" for p in doc_files() for line, lang, _ in fences(p) if not lang]
    assert not bare, f"fences without a language (bash, python, console, text, ...): {bare}"


def test_the_tables_name_current_blocks_and_their_reviewed_text():
    assert BLOCKS, "no documented blocks found"
    listed = set(SKIPPED) | set(SUITES) | set(SUBSTITUTIONS)
    assert not listed - set(BY_ID), f"listed blocks that no longer exist (ids shift when a block is added above): {sorted(listed - set(BY_ID))}"
    assert not set(SKIPPED) & set(SUITES), set(SKIPPED) & set(SUITES)
    assert not set(SKIPPED) & set(SAME_AS), f"list the first of identical blocks: {set(SKIPPED) & set(SAME_AS)}"
    changed = {i: BY_ID[i].digest for i, s in SKIPPED.items() if BY_ID[i].digest != s.digest}
    assert not changed, f"skipped blocks whose text changed since their reason was reviewed: check each still cannot run, then update its digest: {changed}"
    for block_id, subs in SUBSTITUTIONS.items():
        for old, _, why in subs:
            assert old in BY_ID[block_id].code and why, (block_id, old)
    for block_id, (suite, why) in SUITES.items():
        assert suite in ("experiments", "deployment", "flower") and why, block_id


def test_the_generated_fixture_holds_the_documented_ids(work):
    import pandas as pd

    df = pd.read_csv(work / "ratings.csv")
    catalogue = set(pd.read_csv(work / "items.csv")["item"])
    assert {1, 50, 181} <= catalogue and set(df["item"]) <= catalogue and df["rating"].between(1, 5).all()


# ----------------------------------------------------------------------------- shell blocks
NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")


def _same_line(doc: str, got: str) -> bool:
    """The same line up to spacing, numbers within 0.2% (noise multipliers move with dp-accounting)."""
    if NUMBER.sub("#", " ".join(doc.split())) != NUMBER.sub("#", " ".join(got.split())):
        return False
    return all(math.isclose(float(a), float(b), rel_tol=2e-3, abs_tol=1e-9) for a, b in zip(NUMBER.findall(doc), NUMBER.findall(got)))


def _console(code: str) -> list[tuple[str, list[str]]]:
    """A console block's commands (``$`` lines, with ``\\`` continuations) and the output shown after each."""
    steps: list[tuple[str, list[str]]] = []
    lines = code.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            cmd = line[2:]
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            steps.append((cmd, []))
        elif steps and line.strip() and line.strip() != "...":
            steps[-1][1].append(line)
        i += 1
    assert steps, "a console block without a `$ ` command"
    return steps


def _env(work: Path) -> dict:
    env = dict(os.environ)
    env.update(
        PATH=os.pathsep.join([str(work / ".guard"), str(VENV_BIN), env.get("PATH", "")]), PIP_NO_INDEX="1", PIP_DRY_RUN="1",
        FLWR_HOME=str(work / ".flwr"), FLWR_TELEMETRY_ENABLED="0",
        FLWR_DISABLE_UPDATE_CHECK="1", FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1", RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0",
        MPLBACKEND="Agg", PYTHONUNBUFFERED="1",
    )
    (work / ".flwr").mkdir(exist_ok=True)
    return env


def _bash(script: str, work: Path, timeout: float) -> subprocess.CompletedProcess:
    path = work / ".block.sh"
    path.write_text(script)
    proc = subprocess.Popen(["bash", "-e", str(path)], cwd=work, env=_env(work), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"ran past {timeout:.0f} s\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _deploy_down(code: str, work: Path) -> None:
    """Stop what a block's ``fedpriv deploy up`` started, whatever happened to the block."""
    for run_dir in re.findall(r"fedpriv deploy up\b.*?--run-dir\s+(\S+)", code):
        subprocess.run([str(VENV_BIN / "fedpriv"), "deploy", "down", "--run-dir", run_dir], cwd=work, env=_env(work), capture_output=True, timeout=120)


SHELL_IDS = [b.id for b in BLOCKS if b.lang in SHELL]


@pytest.mark.parametrize("block_id", [pytest.param(i, marks=_marks([i])) for i in SHELL_IDS])
def test_shell_block(block_id, work):
    block = BY_ID[block_id]
    _skip_listed(block_id)
    code = _prepared(block)
    timeout = LONG_S if block_id in SUITES else SHORT_S
    expected: list[tuple[str, list[str]]] = []
    if block.lang == "console":
        expected = _console(code)
        code = "\n".join(cmd for cmd, _ in expected) + "\n"
    try:
        if expected:
            outputs = []
            for cmd, _ in expected:
                r = _bash(cmd + "\n", work, timeout)
                assert r.returncode == 0, f"{block_id}: `{cmd}` exited {r.returncode}\n--- stderr\n{r.stderr[-4000:]}"
                outputs.append(r)
        else:
            r = _bash(code, work, timeout)
            assert r.returncode == 0, f"{block_id} ({block.file}:{block.line}) exited {r.returncode}\n--- stdout\n{r.stdout[-3000:]}\n--- stderr\n{r.stderr[-4000:]}"
            outputs = [r]
    finally:
        _deploy_down(code, work)
    for r in outputs:
        warned = [line for line in (r.stdout + r.stderr).splitlines() if "fedpriv: warning:" in line or "FedprivWarning" in line]
        assert not warned, f"{block_id}: a documented command warns: {warned}"
    for (cmd, shown), r in zip(expected, outputs):
        got = [line for line in r.stdout.splitlines() if line.strip()]
        at = 0
        for line in shown:
            while at < len(got) and not _same_line(line, got[at]):
                at += 1
            assert at < len(got), f"{block_id}: `{cmd}` no longer prints the documented line {line!r} (in order)\n--- it printed\n{r.stdout[-4000:]}"
            at += 1
    for flag, target in re.findall(r"(--out|--save-model)\s+([^\s;|&]+)", _without_comments(code)):
        path = Path(os.path.expandvars(target.strip("'\"")))
        assert (work / path).exists(), f"{block_id}: {flag} {target} was not written"


# ----------------------------------------------------------------------------- Python pages
PY_PAGES: dict[str, list[str]] = {}
for _b in BLOCKS:
    if _b.lang in PYTHON:
        PY_PAGES.setdefault(_b.file, []).append(_b.id)


@pytest.mark.parametrize("page", [pytest.param(p, marks=_marks(ids)) for p, ids in PY_PAGES.items()])
def test_python_blocks_of_a_page(page, work):
    from fedpriv.errors import FedprivWarning

    ids = PY_PAGES[page]
    runnable = [i for i in ids if i not in SKIPPED]
    if not runnable:
        pytest.skip("; ".join(f"{i}: {SKIPPED[i].reason}" for i in ids))
    sources = [(i, _prepared(BY_ID[i])) for i in runnable]
    namespace: dict = {"__name__": "__main__"}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FedprivWarning)
        for block_id, source in sources:
            exec(compile(source, f"<{block_id}>", "exec"), namespace)  # a failure's traceback names the block
