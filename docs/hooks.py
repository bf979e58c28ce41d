"""MkDocs hooks: pages whose content is generated from the code at build time, so that they
cannot drift from it: the command line's help (``{{ cli_help }}``) and the metrics.json /
ledger.json schemas (``{{ schema:NAME }}``, read from the schema files the tests check).

The docstrings cross-reference each other with Sphinx roles (``:func:`train```,
``:class:`~fedpriv.errors.DataError```), which mkdocstrings' Google style does not render: the
page would show ``:func:`` before the name. :func:`on_page_content` turns every role into the
name as code, linked to its entry when the page documents it (the anchor mkdocstrings gives
each object is its full path), the leading ``~`` giving the last component alone, as in Sphinx."""

from __future__ import annotations

import html
import importlib
import inspect
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cli() -> str:
    """The help of every command, nested ones included (``fedpriv deploy up``), read off the
    parser the command line runs (:func:`fedpriv.cli._parser`)."""
    import argparse

    from fedpriv.cli import _parser

    parts: list[str] = []

    def walk(parser: argparse.ArgumentParser, words: list[str]) -> None:
        parts.append(f"### `{' '.join(['fedpriv', *words])}`\n\n```text\n{parser.format_help().strip()}\n```")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*words, name])

    walk(_parser(), [])
    return "\n\n".join(parts)


def _schema(name: str) -> str:
    doc = json.loads((ROOT / "tests" / "golden" / f"{name}.json").read_text())
    rows = ["| key | type |", "|---|---|"]
    for key, kind in doc["metrics"].items():
        if key:
            rows.append(f"| `{key}` | {kind} |")
    return "\n".join(rows)


def _ledger() -> str:
    doc = json.loads((ROOT / "tests" / "golden" / "adadpals.json").read_text())
    rows = ["| key | type |", "|---|---|"]
    for key, kind in doc.get("ledger", {}).items():
        if key:
            rows.append(f"| `{key}` | {kind} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "{{ cli_help }}" in markdown:
        markdown = markdown.replace("{{ cli_help }}", _cli())
    if "{{ ledger_schema }}" in markdown:
        markdown = markdown.replace("{{ ledger_schema }}", _ledger())
    return re.sub(r"\{\{ schema:([\w-]+) \}\}", lambda m: _schema(m.group(1)), markdown)


#: a Sphinx role as rendered from a docstring: ``:func:`x``` -> ``:func:<code>x</code>``
SPHINX_ROLE = re.compile(r":(?:py:)?(func|class|meth|mod|attr|data|exc|obj|const|type):<code>([^<]*)</code>")
ANCHOR = re.compile(r'\bid="((?:fedpriv)[\w.]*)"')


def _canonical(path: str) -> str | None:
    """The full path where the object ``path`` names is defined (``fedpriv.run.Job`` ->
    ``fedpriv.run.job.Job``), None when it cannot be imported."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:  # not a module: try the shorter prefix
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return None
        if inspect.ismodule(obj):
            return obj.__name__
        module, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        return f"{module}.{qual}" if module and qual else None
    return None


def _target(name: str, anchors: set[str]) -> str | None:
    """The anchor on this page of the object a role names: its full path, where it is defined,
    or (a relative name: ``train``, ``Model.load``) the one anchor that ends with it (the least
    nested, when methods share the name)."""
    if name in anchors:
        return name
    if name.startswith("fedpriv."):
        canonical = _canonical(name)
        return canonical if canonical in anchors else None
    ends = [a for a in anchors if a.endswith("." + name)]
    if len(ends) > 1:  # a module-level name before the methods of the same name (train, Engine.train)
        depth = min(a.count(".") for a in ends)
        ends = [a for a in ends if a.count(".") == depth]
    return ends[0] if len(ends) == 1 else None


def sphinx_roles_to_code(page_html: str) -> str:
    """Every Sphinx role of ``page_html`` as code, linked to its anchor where the page has one."""
    anchors = set(ANCHOR.findall(page_html))

    def one(m: re.Match) -> str:
        text = html.unescape(m.group(2)).strip()
        short = text.startswith("~")
        name = text.lstrip("~").removesuffix("()")
        shown = name.rsplit(".", 1)[-1] if short else name
        code = f"<code>{html.escape(shown)}</code>"
        target = _target(name, anchors)
        return f'<a class="autorefs" href="#{target}">{code}</a>' if target else code

    return SPHINX_ROLE.sub(one, page_html)


def on_page_content(page_html: str, page, config, files) -> str:
    return sphinx_roles_to_code(page_html)
