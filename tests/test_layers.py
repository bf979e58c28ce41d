"""The layers of fedpriv import in one direction, and no module imports itself back.

The map is read from the folders: each folder of the package is one layer, in this order (a
folder's place is its layer), and the few top-level modules sit where their role puts them:

    util, errors → data → privacy → algorithms → engine and flower (the engines) → testing →
    run (and model) → studies → ops (and api) → cli

Every ``import`` of a fedpriv module is an edge, at module level or inside a function (an import
inside a function hides the graph, it does not leave it). A module may import its own layer or a
lower one, never a higher one; and the module graph has no cycle. A module in a new folder, or a
new top-level module, fails here until its layer is named. The test prints what it checked.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fedpriv"
SUMMARY: list[str] = []  # printed at the end of the pytest run (tests/conftest.py)

#: the layers, lowest first: (name, the package's folders in it, its top-level modules)
ORDER: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("base", ("util",), ("__init__", "errors")),
    ("data", ("data",), ()),
    ("privacy", ("privacy",), ()),
    ("algorithms", ("algorithms",), ()),
    ("engine", ("engine",), ()),  # the one loop, the aggregators, the in-process drivers
    ("flower", ("flower",), ()),  # the Flower engine: ServerApp, ClientApp, secure rounds
    ("testing", ("testing",), ()),
    ("run", ("run",), ()),
    ("studies", ("studies",), ()),
    ("operations", ("ops",), ("api",)),
    ("cli", (), ("cli", "__main__")),
]
LAYERS = [(name, folders, tops) for name, folders, tops in ORDER]


def _folders() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}


def layer_of(module: str) -> int | None:
    """The layer of ``fedpriv.FOLDER...`` (its first folder) or of a top-level module."""
    parts = module.split(".")
    if parts[0] != "fedpriv":
        return None
    head = parts[1] if len(parts) > 1 else "__init__"
    is_folder = head in _folders()
    for i, (_, folders, tops) in enumerate(ORDER):
        if (is_folder and head in folders) or (not is_folder and head in tops):
            return i
    return None


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports(mods: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(importer, imported module, line) for every import of a fedpriv module."""
    edges = []
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if target.split(".")[0] != "fedpriv":
                    continue
                for alias in node.names:  # `from . import x` imports the module x
                    sub = f"{target}.{alias.name}"
                    edges.append((mod, sub if sub in mods else target, node.lineno))
            elif isinstance(node, ast.Import):
                edges += [(mod, a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "fedpriv"]
    return [(a, b, line) for a, b, line in edges if a != b]


def cycles(edges) -> list[list[str]]:
    graph = defaultdict(set)
    for a, b, _ in edges:
        graph[a].add(b)
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_every_module_has_a_layer():
    missing = [m for m in modules() if layer_of(m) is None]
    assert not missing, f"modules without a layer (name their folder or top-level module in ORDER): {missing}"
    named = {f for _, folders, _ in ORDER for f in folders}
    assert _folders() == named, f"folders of the package and folders of the map differ: {sorted(_folders() ^ named)}"


def test_imports_go_down_the_layers_and_make_no_cycle():
    mods = modules()
    edges = [(a, b, line) for a, b, line in imports(mods) if b in mods]
    upward = [f"{mods[a].relative_to(PACKAGE.parent)}:{line}: {a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
              for a, b, line in edges if layer_of(b) > layer_of(a)]
    found = cycles(edges)
    SUMMARY.append(f"layers: checked {len(edges)} imports between {len(mods)} modules in {len(LAYERS)} layers "
                   f"({' → '.join(name for name, _, _ in LAYERS)}): {len(upward)} upward, {len(found)} cycles")
    print(SUMMARY[-1])
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)
    assert not found, f"import cycles: {found}"


def test_the_check_sees_an_upward_import_and_a_cycle():
    """The contract has teeth: an upward import and a cycle in a made-up graph are found."""
    assert layer_of("fedpriv.privacy.ledger") < layer_of("fedpriv.algorithms.als")
    assert layer_of("fedpriv.ops.deploy.job") > layer_of("fedpriv.run.job") > layer_of("fedpriv.flower.server_app") > layer_of("fedpriv.engine.loop")
    assert layer_of("fedpriv.cli") > layer_of("fedpriv.api") > layer_of("fedpriv.run.model") > layer_of("fedpriv.errors")
    assert layer_of("fedpriv.nowhere") is None and layer_of("fedpriv.newfolder.x") is None
    assert cycles([("a", "b", 1), ("b", "c", 1), ("c", "a", 1), ("c", "d", 1)]) == [["a", "b", "c"]]


def test_no_two_public_functions_share_a_name():
    """One name, one meaning: no public module-level function or class is defined under the
    same name in two modules of the package (a reader, or an import, cannot confuse them)."""
    seen: dict[str, list[str]] = defaultdict(list)
    for mod, path in modules().items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                seen[node.name].append(mod)
    shared = {name: mods for name, mods in seen.items() if len(mods) > 1}
    assert not shared, f"public names defined in more than one module: {shared}"


def _algorithm_names() -> set[str]:
    from fedpriv.algorithms.families import all_algorithms

    return set(all_algorithms())


#: the modules that may spell an algorithm's name in a comparison: its own module, and the registry
OWN_MODULES = {"fedpriv.algorithms.registry", "fedpriv.algorithms.family", "fedpriv.algorithms.pam", "fedpriv.algorithms.bias",
               "fedpriv.algorithms.dpals_uniform"}


def test_no_algorithm_name_is_compared_as_a_string_outside_its_module():
    """Behaviour hangs on what an algorithm declares (its registry spec), not on its name: no
    ``algorithm == "bias"`` or ``state.algorithm in ("pam", ...)`` outside the algorithm's own
    module and the registry."""
    names = _algorithm_names()
    found = []
    for mod, path in modules().items():
        if mod in OWN_MODULES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            about_algorithm = any((isinstance(x, ast.Name) and x.id in ("algorithm", "alg")) or (isinstance(x, ast.Attribute) and x.attr == "algorithm") for x in sides)
            literals = {c.value for x in sides for c in ([x] if isinstance(x, ast.Constant) else getattr(x, "elts", [])) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
            if about_algorithm and literals & names:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {sorted(literals & names)}")
    assert not found, "algorithm names compared outside their own module:\n" + "\n".join(found)
