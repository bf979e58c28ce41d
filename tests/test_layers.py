"""The layers of fedpriv import in one direction, and no module imports itself back.

    base → data → privacy → algorithms → engines → run → experiments / operations → CLI

Every ``import`` of a fedpriv module is an edge, at module level or inside a function (an import
inside a function hides the graph, it does not leave it). A module may import its own layer or a
lower one, never a higher one; and the module graph has no cycle. Every module of the package
must belong to a layer (a new module without one fails here). The test prints what it checked.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fedpriv"
SUMMARY: list[str] = []  # printed at the end of the pytest run (tests/conftest.py)

#: (layer, modules): exact module names or package prefixes ending with "."
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("fedpriv", "fedpriv.errors", "fedpriv.atomic", "fedpriv.draws", "fedpriv.threads")),
    ("data", ("fedpriv.data.",)),
    ("privacy", ("fedpriv.privacy.",)),
    ("algorithms", ("fedpriv.algorithms.", "fedpriv.selection.", "fedpriv.metrics", "fedpriv.evaluation")),
    ("engines", ("fedpriv.loop", "fedpriv.engine", "fedpriv.personalization", "fedpriv.flower.")),
    ("run", ("fedpriv.run.", "fedpriv.model")),
    ("operations", ("fedpriv.api", "fedpriv.experiments.", "fedpriv.report", "fedpriv.flower.app", "fedpriv.flower.launcher", "fedpriv.flower.deploy.")),
    ("cli", ("fedpriv.cli", "fedpriv.__main__")),
]


def layer_of(module: str) -> int | None:
    """The highest layer whose pattern matches (operations' flower modules over engines')."""
    found = None
    for i, (_, patterns) in enumerate(LAYERS):
        for p in patterns:
            if module == p or (p.endswith(".") and (module.startswith(p) or module == p[:-1])):
                found = i
    return found


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
    assert not missing, f"modules without a layer (add them to LAYERS): {missing}"


def test_imports_go_down_the_layers_and_make_no_cycle():
    mods = modules()
    edges = [(a, b, line) for a, b, line in imports(mods) if b in mods]
    upward = [f"{mods[a].relative_to(PACKAGE.parent)}:{line}: {a} ({LAYERS[layer_of(a)][0]}) imports {b} ({LAYERS[layer_of(b)][0]})"
              for a, b, line in edges if layer_of(b) > layer_of(a)]
    found = cycles(edges)
    SUMMARY.append(f"layers: checked {len(edges)} imports between {len(mods)} modules in {len(LAYERS)} layers "
                   f"({' → '.join(name for name, _ in LAYERS)}): {len(upward)} upward, {len(found)} cycles")
    print(SUMMARY[-1])
    assert not upward, "imports that go up a layer:\n" + "\n".join(upward)
    assert not found, f"import cycles: {found}"


def test_the_check_sees_an_upward_import_and_a_cycle():
    """The contract has teeth: an upward import and a cycle in a made-up graph are found."""
    assert layer_of("fedpriv.privacy.ledger") < layer_of("fedpriv.algorithms.als")
    assert layer_of("fedpriv.flower.deploy") > layer_of("fedpriv.run") > layer_of("fedpriv.flower.server_app")
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
