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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fedpriv"
# third-party modules imported without being declared, and why
NOT_DECLARED = {
    "ray": "Flower's simulation runtime: declared through flwr[simulation]",
    "threadpoolctl": "optional: imported inside try/except ImportError (fedpriv/util/threads.py)",
}


def _declared() -> set[str]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[\[<>=!~ ;]", d, maxsplit=1)[0].strip().lower().replace("_", "-") for d in deps}


def _imported() -> dict[str, str]:
    """Top-level third-party module -> the first file importing it."""
    out: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "fedpriv":
                    out.setdefault(top, str(path.relative_to(ROOT)))
    return out


def test_every_imported_third_party_module_is_declared():
    declared, owners = _declared(), md.packages_distributions()
    missing = {}
    for module, where in _imported().items():
        if module in NOT_DECLARED:
            continue
        dists = {d.lower().replace("_", "-") for d in owners.get(module, [module])}
        if not dists & declared:
            missing[module] = (where, sorted(dists))
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
    assert {"cryptography", "pycryptodome", "absl-py", "dp-accounting", "flwr", "torch"} <= declared


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
