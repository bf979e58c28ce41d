"""MkDocs hooks: pages whose content is generated from the code at build time, so that they
cannot drift from it: the command line's help (``{{ cli_help }}``) and the metrics.json /
ledger.json schemas (``{{ schema:NAME }}``, read from the schema files the tests check)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("run", "recommend", "privacy", "experiment", "report", "deploy", "selection")


def _help(args: list[str]) -> str:
    out = subprocess.run([sys.executable, "-m", "fedpriv", *args, "--help"], capture_output=True, text=True, cwd=ROOT)
    return out.stdout.strip()


def _cli() -> str:
    parts = [f"### `fedpriv`\n\n```text\n{_help([])}\n```"]
    for cmd in COMMANDS:
        text = _help([cmd])
        if text:
            parts.append(f"### `fedpriv {cmd}`\n\n```text\n{text}\n```")
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
