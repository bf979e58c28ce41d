"""The package a user installs (issue 35): every third-party module that ``fedpriv/`` imports is
declared in ``pyproject.toml``; no library file names a path outside the project; the license,
changelog, version and type marker ship; and the wheel, installed into a fresh virtual
environment outside the checkout, runs ``fedpriv run bias`` and the README's Python quick start."""

from __future__ import annotations

import ast
import importlib.metadata as md
import os
import re
import subprocess
import sys
import sysconfig
import tomllib

import pytest
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fedpriv"
# import name -> distribution name, for modules whose distribution is named otherwise; used when
# the distribution is not installed here (importlib.metadata then cannot tell)
DIST_OF = {"Crypto": "pycryptodome", "absl": "absl-py", "yaml": "pyyaml", "sklearn": "scikit-learn", "PIL": "pillow", "google": "protobuf"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _dependencies() -> list[str]:
    """The dependencies and the ``torch`` extra (the encoder family and the GPU; every import of
    torch is either inside a function of those paths or guarded: tests/test_packaging.py
    ``test_the_main_job_runs_without_torch``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["dependencies"] + project["optional-dependencies"]["torch"]


def _declared() -> set[str]:
    return {_norm(re.split(r"[\[<>=!~ ;(]", d, maxsplit=1)[0].strip()) for d in _dependencies()}


def _imports_in(tree: ast.AST) -> list[str]:
    """Every absolute import of a module: ``import x``, ``from x import y`` and
    ``importlib.import_module("x")`` / ``__import__("x")`` with a literal name, wherever they stand
    (inside functions, and inside ``try: ... except ImportError`` too: an optional import is an
    import, and a user without the package gets the slow path silently)."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if called in ("import_module", "__import__") and not node.args[0].value.startswith("."):
                names.append(node.args[0].value)
    return names


def _imported() -> dict[str, str]:
    """Top-level third-party module -> the first file importing it."""
    out: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in _imports_in(ast.parse(path.read_text())):
            top = name.split(".")[0]
            if top not in sys.stdlib_module_names and top not in ("fedpriv", "__future__"):
                out.setdefault(top, str(path.relative_to(ROOT)))
    return out


def _missing(imported: dict[str, str], declared: set[str]) -> dict[str, tuple[str, list[str]]]:
    owners = md.packages_distributions()
    missing = {}
    for module, where in imported.items():
        dists = {_norm(d) for d in owners.get(module, [])} or {_norm(DIST_OF.get(module, module))}
        if not dists & declared:
            missing[module] = (where, sorted(dists))
    return missing


def test_every_imported_third_party_module_is_declared():
    """No exceptions: what fedpriv/ imports, even optionally or only through a dependency's
    dependency (ray through flwr[simulation]), is declared in pyproject.toml."""
    declared = _declared()
    missing = _missing(_imported(), declared)
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
    assert {"cryptography", "pycryptodome", "absl-py", "dp-accounting", "flwr", "torch", "threadpoolctl", "ray"} <= declared


def test_the_import_check_catches_an_optional_import_left_undeclared():
    """The check sees an import inside ``try/except ImportError`` and one by
    ``importlib.import_module``: dropping threadpoolctl from the declared set is caught."""
    tree = ast.parse("try:\n    import threadpoolctl\nexcept ImportError:\n    threadpoolctl = None\n"
                     "def f():\n    import importlib\n    return importlib.import_module('some_optional_pkg.sub')\n")
    assert {"threadpoolctl", "some_optional_pkg.sub"} <= set(_imports_in(tree))
    assert "threadpoolctl" in _imported() and "fedpriv/util/threads.py" == _imported()["threadpoolctl"]
    missing = _missing(_imported(), _declared() - {"threadpoolctl"})
    assert set(missing) == {"threadpoolctl"}, missing


def test_dependencies_are_ranges_that_admit_the_ci_pins():
    """Exact versions belong in CI (ci/constraints-*.txt), not in the package: no ``==``/``===``
    in ``dependencies``, Flower bounded to the supported releases, Python 3.11 to 3.13; and every
    range admits the versions both constraint files pin (oldest: Flower 1.39.0, newest: 1.42.0;
    torch 2.13.0 in both)."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(d) for d in project["dependencies"] + project["optional-dependencies"]["torch"]]
    pinned = [str(r) for r in reqs if any(s.operator in ("==", "===") for s in r.specifier)]
    assert not pinned, f"exact pins in dependencies (put them in ci/constraints-*.txt): {pinned}"
    for group, deps in project.get("optional-dependencies", {}).items():
        assert not [d for d in deps if re.search(r"===?", d)], group
    by_name = {_norm(r.name): r for r in reqs}
    assert str(by_name["flwr"].specifier) in ("<1.43,>=1.39", ">=1.39,<1.43") and by_name["flwr"].extras == {"simulation"}
    assert project["requires-python"] == ">=3.11,<3.14"
    classifiers = project["classifiers"]
    assert {f"Programming Language :: Python :: 3.{m}" for m in (11, 12, 13)} <= set(classifiers)
    assert not [c for c in classifiers if re.match(r"Programming Language :: Python :: 3\.(\d+)$", c) and int(c.rsplit(".", 1)[1]) not in (11, 12, 13)]
    for which, flwr in (("oldest", "1.39.0"), ("newest", "1.42.0")):
        pins = {}
        for line in (ROOT / "ci" / f"constraints-{which}.txt").read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                name, _, version = line.partition("==")
                assert version and "[" not in name, f"constraints-{which}.txt: {line!r} (name==version only: pip's constraints take no extras)"
                pins[_norm(name)] = version
        assert pins["flwr"] == flwr and pins["torch"] == "2.13.0", which
        for name, req in by_name.items():
            if name in pins:
                assert req.specifier.contains(pins[name], prereleases=True), f"{req} does not admit {name}=={pins[name]} of constraints-{which}.txt"
        assert set(by_name) <= set(pins), f"constraints-{which}.txt pins no {sorted(set(by_name) - set(pins))}"


def test_pip_install_keeps_the_installed_flower(tmp_path):
    """``pip install .`` beside the installed Flower (1.42.0 in .venv-newest, 1.39.0 in .venv)
    resolves without touching it: a dry run (no index: every dependency must be satisfied by what
    is installed) would install fedpriv and nothing else, flwr and torch stay."""
    import json

    flwr, torch = md.version("flwr"), md.version("torch")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("PIP_")}
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "--no-build-isolation", "--disable-pip-version-check",
                        "--quiet", "--report", "-", str(ROOT)], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert r.returncode == 0, f"pip could not resolve fedpriv beside flwr {flwr}:\n{r.stderr[-3000:]}"
    report = json.loads(r.stdout)
    would = {_norm(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
    assert set(would) == {"fedpriv"}, f"pip would also install {would}"
    assert md.version("flwr") == flwr and md.version("torch") == torch


def test_no_library_file_names_a_path_outside_the_project():
    bad = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py") if re.search(r"\.\./shared|/work/", p.read_text())]
    assert not bad, bad
    from fedpriv.ops.experiments.config import default_data_root

    assert not Path(default_data_root()).is_absolute() or os.environ.get("FEDPRIV_DATA")


def test_license_changelog_version_and_type_marker():
    import fedpriv

    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]
    assert f"## {fedpriv.__version__}" in (ROOT / "CHANGELOG.md").read_text()
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == fedpriv.__version__
    assert (PACKAGE / "py.typed").exists()
    out = subprocess.run([sys.executable, "-m", "fedpriv", "--version"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"fedpriv {fedpriv.__version__}"


QUICK_START = '''
import fedpriv

data = fedpriv.load_data("csv:ratings.csv", rating_range=(1, 5), items="items.csv")
result = fedpriv.train("adadpals", data, epsilon=5.0)
print(result.epsilon, result.metrics["test_rmse"])
result.save_model("model/")
model = fedpriv.load_model("model/")
print(model.recommend(items=["i1", "i7"], ratings=[5, 3], k=10))
print(fedpriv.plan("adadpals", epsilon=5.0, steps=3).to_markdown())
print("FROM", fedpriv.__file__)
'''


def test_the_wheel_installs_outside_the_checkout_and_runs(tmp_path):
    """Build the wheel, install it (no dependencies: those of this environment are made visible
    by a path entry, never the checkout) into a fresh venv in a temporary folder, and run the
    command line and the README's quick start from there."""
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(ROOT)], check=True, capture_output=True, timeout=600)
    wheel = next(wheels.glob("fedpriv-*.whl"))
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    assert "fedpriv/py.typed" in names and "fedpriv/algorithms/_segment_stats.c" in names
    assert any(n.endswith("LICENSE") for n in names)  # the license ships in the wheel's metadata
    # a clean environment for every step: a PYTHONPATH naming the checkout (set by other code of
    # this test process) would make pip see fedpriv as installed already and skip the wheel
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME") and not k.startswith("PIP_")}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300, env=env, cwd=tmp_path)
    py = venv / "bin" / "python"
    installed = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "--force-reinstall", "-q", str(wheel)], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr[-2000:]
    site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True, env=env).stdout.strip()
    Path(site, "_deps_of_the_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # numpy, flwr, torch...: not fedpriv
    work = tmp_path / "user"
    work.mkdir()
    found = subprocess.run([str(py), "-c", "import fedpriv, sys; print(fedpriv.__file__)"], cwd=work, env=env, capture_output=True, text=True)
    assert found.returncode == 0, found.stderr[-3000:]
    assert found.stdout.startswith(str(venv)) and str(ROOT) not in found.stdout
    cli = subprocess.run([str(venv / "bin" / "fedpriv"), "run", "bias", "--data", "synthetic-mf:users=200,items=40,ratings=3000,seed=1", "--epsilon", "2", "--out", "out", "--quiet"],
                         cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr[-2000:]
    assert (work / "out" / "metrics.json").exists() and (work / "out" / "ledger.json").exists()
    rows = ["user,item,rating"] + [f"u{u},i{(u * 7 + j) % 30},{1 + (u + j) % 5}" for u in range(120) for j in range(12)]
    (work / "ratings.csv").write_text("\n".join(rows) + "\n")
    (work / "items.csv").write_text("item\n" + "\n".join(f"i{i}" for i in range(30)) + "\n")
    quick = subprocess.run([str(py), "-c", QUICK_START], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert quick.returncode == 0, quick.stderr[-2000:]
    assert f"FROM {venv}" in quick.stdout and (work / "model" / "model.npz").exists()


def test_the_main_job_runs_without_torch(tmp_path):
    """torch is an extra: on a machine without it (blocked here by an import hook) the main job's
    algorithms train and the encoder family says which extra it needs. Positive control: the same
    hook makes ``import torch`` fail."""
    hook = tmp_path / "sitecustomize.py"
    hook.write_text("import sys\n"
                    "class _NoTorch:\n"
                    "    def find_spec(self, name, path=None, target=None):\n"
                    "        if name == 'torch' or name.startswith('torch.'):\n"
                    "            raise ImportError('No module named torch (blocked)')\n"
                    "sys.meta_path.insert(0, _NoTorch())\n")
    code = ("import fedpriv, sys\n"
            "try:\n    import torch\n    sys.exit('torch importable: the hook failed')\nexcept ImportError:\n    pass\n"
            "data = fedpriv.load_data('synthetic-mf:users=120,items=60,ratings=3000,seed=1')\n"
            "for alg in ('adadpals', 'bias', 'topk'):\n"
            "    r = fedpriv.train(alg, data, epsilon=5.0, steps=1)\n"
            "    assert r.epsilon <= 5.0 * 1.001, r.epsilon\n"
            "assert 'torch' not in sys.modules\n"
            "try:\n    fedpriv.train('am-ssp', data, epsilon=5.0, steps=1)\nexcept ImportError as e:\n    print('ENCODER:', e)\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "fedpriv[torch]" in out.stdout


def test_an_unsupported_python_is_refused_by_name_before_any_dependency(tmp_path):
    """pip does not check the project's own requires-python before resolving its dependencies (on
    3.10 it failed on Flower, after downloading): setup.py refuses by name at once. Skipped where no
    Python 3.10 is installed."""
    import shutil

    candidates = [shutil.which("python3.10"), "/root/.pyenv/versions/3.10.13/bin/python3"]
    py = next((c for c in candidates if c and Path(c).exists() and subprocess.run([c, "-c", "import venv"], capture_output=True).returncode == 0), None)
    if py is None:
        pytest.skip("no Python 3.10 on this machine")
    subprocess.run([py, "-m", "venv", str(tmp_path / "v")], check=True, timeout=120)
    out = subprocess.run([str(tmp_path / "v" / "bin" / "pip"), "install", "--no-build-isolation", "--no-deps", "-e", str(ROOT)],
                         capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "fedpriv needs Python 3.11, 3.12 or 3.13" in text and "this is Python 3.10" in text, text[-2000:]
