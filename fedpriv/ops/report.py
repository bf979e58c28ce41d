"""Render a results folder of experiments into one self-contained HTML page.

``fedpriv report RESULTS_DIR --out report.html [--title T]``

``RESULTS_DIR`` is one experiment folder (it holds ``experiment.json``) or a folder whose immediate
subfolders are experiment folders. Each experiment folder ``E`` holds ``experiment.json``,
``results.csv`` (one row per run), optionally ``search.csv`` (the hyperparameter-search trials),
``tables/*.csv`` and ``plots/*.png`` (listed in ``experiment.json``) and ``runs/<id>/metrics.json``
+ ``ledger.json`` for the rows of ``results.csv`` whose ``run_dir`` is not empty.

The page has no external resource at all: the plots are embedded as ``data:image/png;base64`` URIs,
the CSS and the small script (which reports in a fixed banner how many plots the browser decoded)
are inline. Bad input raises :class:`~fedpriv.errors.ConfigError` naming the file (and, for a CSV,
the line); the page is written atomically, so an error leaves no half-written file.
"""

from __future__ import annotations

import argparse
import base64
import csv
import datetime as _dt
import html
import json
import os
import re
import struct
from pathlib import Path

from ..util import atomic
from ..errors import ConfigError

DEFAULT_TITLE = "fedpriv experiments"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REL_TOL = 1e-6  # epsilon_spent may exceed the target by this relative amount (float rounding)
RESULTS_REQUIRED = ("method", "dataset", "seed", "epsilon", "run_dir")
SEARCH_HIDDEN = ("experiment", "run_dir")  # constant or internal columns left out of the search table
_INT_RE = re.compile(r"[+-]?\d+\Z")


# ---------------------------------------------------------------- loading and validation


def _esc(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _inside(exp_dir: Path, rel, source: Path, what: str) -> Path:
    """``exp_dir / rel``, refusing absolute paths and paths leaving the experiment folder."""
    if not isinstance(rel, str) or not rel.strip():
        raise ConfigError(f"{what}: expected a relative path, got {rel!r}", field=str(source))
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts:
        raise ConfigError(
            f"{what}: path {rel!r} must be relative to the experiment folder, without '..'", field=str(source)
        )
    return exp_dir / p


def _load_json(path: Path, what: str):
    if not path.is_file():
        raise ConfigError(f"{what} not found", field=str(path))
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"malformed {what}: not UTF-8 ({exc.reason})", field=str(path)) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"malformed {what}: {exc.msg} at line {exc.lineno} column {exc.colno}", field=str(path)
        ) from None


def _read_csv(path: Path, required: tuple[str, ...] = ()) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows (dicts) of a CSV file; a row with the wrong number of fields is an error
    naming the file and its line."""
    if not path.is_file():
        raise ConfigError("file not found", field=str(path))
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f, strict=True)
            header = None
            rows: list[dict[str, str]] = []
            for record in reader:
                if not record:  # blank line
                    continue
                if header is None:
                    header = [h.strip() for h in record]
                    dup = sorted({h for h in header if header.count(h) > 1})
                    if dup:
                        raise ConfigError(
                            f"duplicate column(s) {', '.join(dup)} in the header", field=f"{path}:{reader.line_num}"
                        )
                    missing = [c for c in required if c not in header]
                    if missing:
                        raise ConfigError(
                            f"missing column(s) {', '.join(missing)} in the header", field=f"{path}:{reader.line_num}"
                        )
                    continue
                if len(record) != len(header):
                    raise ConfigError(
                        f"malformed CSV: expected {len(header)} fields (as in the header), got {len(record)}",
                        field=f"{path}:{reader.line_num}",
                    )
                rows.append(dict(zip(header, record)))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"malformed CSV: not UTF-8 ({exc.reason})", field=str(path)) from None
    except csv.Error as exc:
        raise ConfigError(f"malformed CSV: {exc}", field=f"{path}:{reader.line_num}") from None
    if header is None:
        raise ConfigError("malformed CSV: empty file (no header line)", field=str(path))
    return header, rows


def _check_experiment(doc, path: Path) -> dict:
    """Validate the types of the fields of ``experiment.json`` this module reads; fill defaults."""
    if not isinstance(doc, dict):
        raise ConfigError("malformed experiment.json: expected a JSON object", field=str(path))

    def bad(key: str, expected: str):
        raise ConfigError(
            f"malformed experiment.json: {key!r} must be {expected}, got {doc.get(key)!r}", field=str(path)
        )

    if not isinstance(doc.get("name"), str) or not doc["name"].strip():
        bad("name", "a non-empty string")
    for key in ("title", "description", "kind", "config_file", "config_text", "engine", "started", "finished"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            bad(key, "a string")
    if doc.get("quick") is not None and not isinstance(doc["quick"], bool):
        bad("quick", "true or false")
    for key in ("order", "seconds"):
        if doc.get(key) is not None and (isinstance(doc[key], bool) or not isinstance(doc[key], (int, float))):
            bad(key, "a number")
    cells = doc.get("cells", {})
    if not isinstance(cells, dict) or any(
        cells.get(k) is not None and (isinstance(cells[k], bool) or not isinstance(cells[k], int))
        for k in ("total", "done", "skipped")
    ):
        bad("cells", "an object {total, done, skipped} of integers")
    for key in ("headline", "commands"):
        value = doc.get(key, [])
        if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
            bad(key, "a list of strings")
    skipped = doc.get("skipped", [])
    if not isinstance(skipped, list) or not all(isinstance(s, dict) for s in skipped):
        bad("skipped", "a list of {cell, reason} objects")
    for key, fields in (("plots", ("caption",)), ("tables", ("title", "caption"))):
        items = doc.get(key, [])
        if not isinstance(items, list) or not all(
            isinstance(it, dict) and isinstance(it.get("file"), str) for it in items
        ):
            bad(key, "a list of objects with a 'file' string")
        for it in items:
            if any(it.get(f) is not None and not isinstance(it[f], str) for f in fields):
                bad(key, f"a list of objects whose {', '.join(fields)} are strings")
    out = dict(doc)
    out.update(
        cells=cells,
        skipped=skipped,
        plots=doc.get("plots", []),
        tables=doc.get("tables", []),
        headline=doc.get("headline", []),
        commands=doc.get("commands", []),
    )
    return out


def _number_or_none(doc: dict, key: str, path: Path):
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"malformed metrics.json: {key!r} must be a number or null, got {value!r}", field=str(path))
    return float(value)


def _load_run(exp_dir: Path, row: dict[str, str], results_path: Path, line_hint: str) -> dict:
    run_dir = _inside(exp_dir, row["run_dir"], results_path, f"run_dir of {line_hint}")
    metrics_path, ledger_path = run_dir / "metrics.json", run_dir / "ledger.json"
    metrics = _load_json(metrics_path, "metrics.json")
    if not isinstance(metrics, dict):
        raise ConfigError("malformed metrics.json: expected a JSON object", field=str(metrics_path))
    ledger = _load_json(ledger_path, "ledger.json")
    if not isinstance(ledger, list):
        raise ConfigError("malformed ledger.json: expected a JSON list of release records", field=str(ledger_path))
    for i, rec in enumerate(ledger):
        if (
            not isinstance(rec, dict)
            or not isinstance(rec.get("name"), str)
            or not isinstance(rec.get("mechanism"), str)
        ):
            raise ConfigError(
                f"malformed ledger.json: record {i} must be an object with string 'name' and 'mechanism'",
                field=str(ledger_path),
            )
    target = _number_or_none(metrics, "epsilon", metrics_path)
    spent = _number_or_none(metrics, "epsilon_spent", metrics_path)
    delta = _number_or_none(metrics, "delta", metrics_path)
    # a run that also released private recommendations after training: the target is the
    # training's, and the total composes training and recommendation (epsilon_training is checked)
    training = _number_or_none(metrics, "epsilon_training", metrics_path)
    warning = None
    if target is not None:
        checked = training if training is not None else spent
        if spent is None:
            warning = "epsilon_spent missing"
        elif checked > target * (1 + REL_TOL):
            warning = "epsilon_spent exceeds the target"

    def count(rec) -> int:
        c = rec.get("count")
        return c if isinstance(c, int) and not isinstance(c, bool) else 1

    return {
        "method": row.get("method", ""),
        "dataset": row.get("dataset", ""),
        "seed": row.get("seed", ""),
        "run_dir": row["run_dir"],
        "target": target,
        "spent": spent,
        "training": training,
        "delta": delta,
        "records": len(ledger),
        "releases": sum(count(r) for r in ledger),
        "mechanisms": sorted({r["mechanism"] for r in ledger}),
        "ledger": [(r["name"], count(r), r.get("noise_std"), r["mechanism"]) for r in ledger],
        "warning": warning,
    }


def _png(path: Path, source: Path) -> bytes:
    if not path.is_file():
        raise ConfigError(f"plot {path.name} listed but missing: {path}", field=str(source))
    data = path.read_bytes()
    if not data.startswith(PNG_SIGNATURE) or len(data) < 24:
        raise ConfigError(f"plot {path} is not a PNG file", field=str(source))
    return data


def _load_experiment(exp_dir: Path) -> dict:
    """Read and validate everything of one experiment folder (before any HTML is written)."""
    json_path = exp_dir / "experiment.json"
    exp = _check_experiment(_load_json(json_path, "experiment.json"), json_path)
    plots = []
    for i, item in enumerate(exp["plots"]):
        path = _inside(exp_dir, item["file"], json_path, f"plots[{i}].file")
        plots.append({"caption": item.get("caption") or "", "file": item["file"], "data": _png(path, json_path)})
    tables = []
    for i, item in enumerate(exp["tables"]):
        path = _inside(exp_dir, item["file"], json_path, f"tables[{i}].file")
        if not path.is_file():
            raise ConfigError(f"table {path.name} listed but missing: {path}", field=str(json_path))
        header, rows = _read_csv(path)
        tables.append(
            {
                "title": item.get("title") or path.stem,
                "caption": item.get("caption") or "",
                "file": item["file"],
                "header": header,
                "rows": rows,
            }
        )
    results_path = exp_dir / "results.csv"
    runs: list[dict] = []
    n_rows = 0
    if results_path.is_file() or (exp["cells"].get("done") or 0) > 0:
        _, rows = _read_csv(results_path, RESULTS_REQUIRED)
        n_rows = len(rows)
        for i, row in enumerate(rows):
            if row["run_dir"].strip():
                runs.append(_load_run(exp_dir, row, results_path, f"row {i + 1}"))
    search = None
    search_path = exp_dir / "search.csv"
    if search_path.exists():
        search = _read_csv(search_path, ("selected",))
    exp.update(dir=exp_dir, plot_items=plots, table_items=tables, runs=runs, n_rows=n_rows, search=search)
    return exp


def _experiment_dirs(root: Path) -> list[Path]:
    if not root.exists():
        raise ConfigError(f"no such folder: {root}", field="results_dir")
    if not root.is_dir():
        raise ConfigError(f"not a folder: {root}", field="results_dir")
    if (root / "experiment.json").is_file():
        return [root]
    return [
        d
        for d in sorted(root.iterdir())
        if d.is_dir() and not d.name.startswith(".") and (d / "experiment.json").is_file()
    ]


# ---------------------------------------------------------------- formatting


def _fmt_float(v: float) -> str:
    return f"{v:.4g}"


def _fmt_cell(text: str) -> tuple[str, bool]:
    """A CSV value for display: floats to 4 significant digits, ints and strings unchanged.
    Returns (text, is_number)."""
    s = text.strip()
    if not s:
        return "", False
    if _INT_RE.match(s):
        return s, True
    try:
        v = float(s)
    except ValueError:
        return s, False
    return _fmt_float(v), True


def _fmt_opt(v: float | None) -> str:
    return "" if v is None else _fmt_float(v)


def _fmt_params(text: str) -> str:
    """``params`` JSON as compact ``k=v, ...``; anything else as is."""
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text
    if not isinstance(doc, dict):
        return text
    parts = []
    for k, v in doc.items():
        if isinstance(v, float):
            v = _fmt_float(v)
        elif not isinstance(v, (str, int)):
            v = json.dumps(v, separators=(",", ":"))
        parts.append(f"{k}={v}")
    return ", ".join(parts)


def _merged_columns(header: list[str]) -> list[tuple[str, str | None, str | None]]:
    """Display columns: (label, column, std column). ``X_mean`` + ``X_std`` become one column ``X``."""
    cols: list[tuple[str, str | None, str | None]] = []
    for h in header:
        if h.endswith("_std") and h[: -len("_std")] + "_mean" in header:
            continue
        if h.endswith("_mean") and h[: -len("_mean")] + "_std" in header:
            cols.append((h[: -len("_mean")], h, h[: -len("_mean")] + "_std"))
        else:
            cols.append((h, h, None))
    return cols


def _html_table(header: list[str], rows: list[dict[str, str]], *, row_class=None, formatters=None) -> str:
    formatters = formatters or {}
    cols = _merged_columns(header)
    out = [
        '<div class="table-wrap"><table>',
        "<thead><tr>" + "".join(f"<th>{_esc(label)}</th>" for label, _, _ in cols) + "</tr></thead>",
        "<tbody>",
    ]
    for row in rows:
        cls = row_class(row) if row_class else None
        cells = []
        for _, col, std in cols:
            if col in formatters:
                text, num = formatters[col](row.get(col, "")), False
            else:
                text, num = _fmt_cell(row.get(col, ""))
                if std is not None:
                    s, _ = _fmt_cell(row.get(std, ""))
                    if s and text:
                        text = f"{text} ± {s}"
            cells.append(f'<td class="num">{_esc(text)}</td>' if num else f"<td>{_esc(text)}</td>")
        out.append((f'<tr class="{cls}">' if cls else "<tr>") + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "\n".join(out)


def _paragraphs(text: str) -> str:
    paras = [p.strip() for p in re.split(r"\n\s*\n", text or "") if p.strip()]
    return "\n".join("<p>" + "<br>\n".join(_esc(line) for line in p.splitlines()) + "</p>" for p in paras)


def _data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode("ascii")


# ---------------------------------------------------------------- page

CSS = """
* { box-sizing: border-box; }
html { scroll-padding-top: 56px; }
body { margin: 0; padding: 48px 0 40px; color: #1d1d1d; background: #ffffff;
  font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; }
#render-status { position: fixed; top: 0; left: 0; right: 0; height: 44px; line-height: 44px; \
padding: 0 16px; z-index: 10;
  background: #808080; color: #ffffff; font-weight: bold; font-size: 16px; }
main { max-width: 1200px; margin: 0 auto; padding: 0 20px; }
header { border-bottom: 2px solid #dddddd; margin-bottom: 12px; }
h1 { font-size: 26px; margin: 18px 0 4px; }
h2 { font-size: 21px; margin: 36px 0 6px; padding-top: 10px; border-top: 3px solid #3b6ea5; }
h3 { font-size: 17px; margin: 20px 0 6px; }
h4 { font-size: 15px; margin: 14px 0 4px; }
.muted { color: #666666; font-size: 13px; }
.meta { font-size: 13px; color: #333333; background: #f3f5f8; border: 1px solid #dde3ea; padding: 5px 8px; \
border-radius: 4px; }
.meta span + span::before { content: " · "; color: #999999; }
nav ol { margin: 6px 0 12px; padding-left: 24px; }
nav li { margin: 2px 0; }
a { color: #1f5aa6; }
pre { background: #f6f6f6; border: 1px solid #e2e2e2; padding: 8px 10px; overflow-x: auto; font-size: 12.5px; \
line-height: 1.35; margin: 6px 0; }
details { margin: 8px 0; }
summary { cursor: pointer; font-weight: 600; color: #27466e; }
.table-wrap { overflow-x: auto; margin: 4px 0 6px; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border: 1px solid #c8c8c8; padding: 3px 7px; vertical-align: top; text-align: left; }
th { background: #eef1f5; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tbody tr:nth-child(even) { background: #fafafa; }
tr.selected, tbody tr.selected:nth-child(even) { background: #dff3df; font-weight: 600; }
.caption { font-size: 13px; color: #444444; margin: 2px 0 12px; }
figure { margin: 14px 0 22px; max-width: 100%; }
figure img { display: block; max-width: 100%; height: auto; border: 1px solid #e0e0e0; }
figcaption { font-size: 13px; color: #444444; margin-top: 4px; }
ul.headline li { margin: 2px 0; }
.skipped li { margin: 2px 0; }
.ledger-warning { color: #d00000; font-weight: bold; }
.note { color: #555; font-size: 0.85em; }
tr.ledger-warning, tbody tr.ledger-warning:nth-child(even) { background: #ffe5e5; color: #b00000; font-weight: normal; }
table.ledger td { white-space: nowrap; }
table.ledger td:last-child, table.ledger td.mech { min-width: 240px; white-space: normal; }
table.ledger td.mech { min-width: 90px; }
ul.rel { list-style: none; margin: 0; padding: 0; font-size: 12px; }
ul.rel li { display: inline-block; margin: 0 12px 0 0; white-space: nowrap; }
"""

SCRIPT = """
window.addEventListener("load", function () {
  var imgs = document.getElementsByTagName("img");
  var n = imgs.length, ok = 0;
  for (var i = 0; i < n; i++) {
    if (imgs[i].complete && imgs[i].naturalWidth > 0) { ok++; }
  }
  var banner = document.getElementById("render-status");
  banner.textContent = ok + " of " + n + " plots rendered";
  banner.style.background = (ok === n && n > 0) ? "#00c000" : "#ff0000";
  banner.setAttribute("data-ok", String(ok));
  banner.setAttribute("data-total", String(n));
});
"""


def _ledger_section(runs: list[dict]) -> str:
    rows = []
    for r in runs:
        short = {"epsilon_spent missing": "missing", "epsilon_spent exceeds the target": "over target"}.get(
            r["warning"], r["warning"]
        )
        flag = (
            f'<br><span class="ledger-warning" title="{_esc(r["warning"])}">⚠&nbsp;{_esc(short)}</span>'
            if r["warning"]
            else ""
        )
        rel = "".join(
            f"<li>{_esc(name)}&nbsp;×{count}" + (f" σ={_esc(_fmt_float(std))}" if _is_number(std) else "") + "</li>"
            for name, count, std, _ in r["ledger"]
        )
        cells = [
            f"<td>{_esc(r['method'])}</td>",
            f"<td>{_esc(r['dataset'])}</td>",
            f'<td class="num">{_esc(r["seed"])}</td>',
            f'<td class="num">{_esc(_fmt_opt(r["target"]))}</td>',
            f'<td class="num">{_esc(_fmt_opt(r["spent"]))}'
            + (
                f'<br><span class="note">training {_esc(_fmt_opt(r["training"]))}, then recommendation</span>'
                if r.get("training") is not None
                else ""
            )
            + f"{flag}</td>",
            f'<td class="num">{_esc(_fmt_opt(r["delta"]))}</td>',
            f'<td class="num">{r["records"]}</td>',
            f'<td class="num">{r["releases"]}</td>',
            f'<td class="mech">{_esc(", ".join(r["mechanisms"]))}</td>',
            f'<td><ul class="rel">{rel}</ul></td>' if rel else "<td></td>",
        ]
        rows.append(('<tr class="ledger-warning">' if r["warning"] else "<tr>") + "".join(cells) + "</tr>")
    labels = (
        "method",
        "dataset",
        "seed",
        "ε target",
        "ε spent",
        "δ",
        "records",
        "releases",
        "mechanisms",
        "ledger: name ×count σ",
    )
    head = "".join(f"<th>{h}</th>" for h in labels)
    n_warn = sum(1 for r in runs if r["warning"])
    warn = f' — <span class="ledger-warning">{n_warn} flagged</span>' if n_warn else ""
    return (
        f'<details class="ledger"><summary>Privacy ledger of each run ({len(runs)} runs){warn}</summary>\n'
        f'<div class="table-wrap"><table class="ledger"><thead><tr>{head}</tr></thead><tbody>\n'
        + "\n".join(rows)
        + "\n</tbody></table></div></details>"
    )


def _search_section(search: tuple[list[str], list[dict[str, str]]]) -> str:
    header, rows = search
    cols = [h for h in header if h not in SEARCH_HIDDEN and any(row.get(h, "").strip() for row in rows)]
    if "selected" in cols:  # first column, as a check mark
        cols.remove("selected")
    cols = ["selected", *cols]
    n_sel = sum(1 for row in rows if _selected(row))
    table = _html_table(
        cols,
        rows,
        row_class=lambda row: "selected" if _selected(row) else None,
        formatters={
            "selected": lambda v: "✓" if v.strip() in ("1", "1.0", "true", "True") else "",
            "params": _fmt_params,
        },
    )
    summary = f"Hyperparameter search ({len(rows)} trials, {n_sel} selected; selected rows highlighted)"
    return f'<details class="search"><summary>{summary}</summary>\n{table}\n</details>'


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _selected(row: dict[str, str]) -> bool:
    return row.get("selected", "").strip() in ("1", "1.0", "true", "True")


def _png_size(data: bytes) -> tuple[int, int] | None:
    if data[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", data[16:24])


def _section(exp: dict, anchor: str) -> str:
    parts = [f'<section id="{_esc(anchor)}">', f"<h2>{_esc(exp.get('title') or exp['name'])}</h2>"]
    if exp.get("description"):
        parts.append(f'<div class="description">{_paragraphs(exp["description"])}</div>')
    if exp["headline"]:
        parts.append('<ul class="headline">' + "".join(f"<li>{_esc(h)}</li>" for h in exp["headline"]) + "</ul>")
    cells = exp["cells"]
    n_warn = sum(1 for r in exp["runs"] if r["warning"])
    meta = [
        f"kind: {_esc(exp.get('kind') or '?')}",
        f"engine: {_esc(exp.get('engine') or '?')}",
        "quick" if exp.get("quick") else "full",
        f"cells done: {cells.get('done', '?')}/{cells.get('total', '?')}",
        f"skipped: {cells.get('skipped', len(exp['skipped']))}",
        f"runs: {exp['n_rows']}",
    ]
    if exp.get("seconds") is not None:
        meta.append(f"{exp['seconds']:.1f} s")
    if isinstance(exp.get("run_seconds"), (int, float)):
        rs = exp["run_seconds"]
        meta.append(f"runs' own time {rs:.0f} s" if rs < 120 else f"runs' own time {rs / 60:.1f} min")
    if exp.get("started"):
        meta.append(
            f"started {_esc(exp['started'])}"
            + (f", finished {_esc(exp['finished'])}" if exp.get("finished") else ", not finished")
        )
    meta_html = "".join(f"<span>{m}</span>" for m in meta)
    if n_warn:
        meta_html += f'<span class="ledger-warning">ledger warnings: {n_warn}</span>'
    parts.append(f'<p class="meta">{meta_html}</p>')
    if exp["commands"]:
        parts.append("<h4>Reproduce</h4><pre>" + _esc("\n".join(exp["commands"])) + "</pre>")
    if exp.get("config_text"):
        label = f"Configuration ({_esc(exp['config_file'])})" if exp.get("config_file") else "Configuration"
        parts.append(f"<details><summary>{label}</summary><pre>{_esc(exp['config_text'])}</pre></details>")
    if exp["skipped"]:
        items = "".join(
            f"<li><b>{_esc(s.get('cell', '?'))}</b>: {_esc(s.get('reason', ''))}</li>" for s in exp["skipped"]
        )
        parts.append(f'<h3>Skipped cells ({len(exp["skipped"])})</h3><ul class="skipped">{items}</ul>')
    if not exp["plot_items"] and not exp["table_items"]:
        parts.append(
            '<p class="muted">No tables or plots for this experiment'
            + (" (see the skipped cells above)." if exp["skipped"] else ".")
            + "</p>"
        )
    if exp["table_items"]:
        parts.append("<h3>Tables</h3>")
        for t in exp["table_items"]:
            parts.append(f"<h4>{_esc(t['title'])}</h4>")
            parts.append(_html_table(t["header"], t["rows"]))
            if t["caption"]:
                parts.append(f'<p class="caption">{_esc(t["caption"])}</p>')
    if exp["plot_items"]:
        parts.append("<h3>Plots</h3>")
        for p in exp["plot_items"]:
            size = _png_size(p["data"])
            dims = f' width="{size[0]}" height="{size[1]}"' if size else ""
            parts.append(
                f'<figure><img alt="{_esc(p["caption"])}"{dims} src="{_data_uri(p["data"])}">'
                f"<figcaption>{_esc(p['caption'])}</figcaption></figure>"
            )
    if exp["search"] is not None:
        parts.append(_search_section(exp["search"]))
    if exp["runs"]:
        parts.append(_ledger_section(exp["runs"]))
    parts.append("</section>")
    return "\n".join(parts)


def _page(title: str, experiments: list[tuple[str, dict]]) -> str:
    now = _dt.datetime.now(_dt.UTC).astimezone().isoformat(timespec="seconds")
    toc = []
    for anchor, exp in experiments:
        n_warn = sum(1 for r in exp["runs"] if r["warning"])
        extra = f' <span class="ledger-warning">({n_warn} ledger warnings)</span>' if n_warn else ""
        skipped = (
            ' <span class="muted">(all cells skipped)</span>'
            if not exp["plot_items"] and not exp["table_items"] and exp["skipped"]
            else ""
        )
        toc.append(f'<li><a href="#{_esc(anchor)}">{_esc(exp.get("title") or exp["name"])}</a>{skipped}{extra}</li>')
    body = "\n".join(_section(exp, anchor) for anchor, exp in experiments)
    run_secs = [exp["run_seconds"] for _, exp in experiments if isinstance(exp.get("run_seconds"), (int, float))]
    modes = sorted({"quick" if exp.get("quick") else "full" for _, exp in experiments})
    total = f" · {'/'.join(modes)} mode · runs' own time {sum(run_secs) / 60:.1f} min" if run_secs else ""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_esc(title)}</title>
<style>{CSS}</style>
</head>
<body>
<div id="render-status">rendering...</div>
<main>
<header>
<h1>{_esc(title)}</h1>
<p class="muted">Generated {_esc(now)} · {len(experiments)} \
experiment{"s" if len(experiments) != 1 else ""}{_esc(total)}</p>
<nav><ol>
{chr(10).join(toc)}
</ol></nav>
</header>
{body}
</main>
<script>{SCRIPT}</script>
</body>
</html>
"""


def render(results_dir: str | os.PathLike, out_file: str | os.PathLike, *, title: str | None = None) -> dict:
    """Render; returns {"experiments": n, "plots": n, "tables": n, "runs": n}.

    Everything is read and validated before the page is written (atomically, to ``out_file``)."""
    root = Path(results_dir)
    dirs = _experiment_dirs(root)
    if not dirs:
        raise ConfigError(f"{root}: no experiment.json in it or in its immediate subfolders", field="results_dir")
    loaded = [_load_experiment(d) for d in dirs]
    loaded.sort(key=lambda e: (e.get("order") is None, e.get("order") or 0, e["name"], str(e["dir"])))
    used: set[str] = set()
    experiments = []
    for exp in loaded:
        anchor, k = exp["name"], 2
        while anchor in used:
            anchor, k = f"{exp['name']}-{k}", k + 1
        used.add(anchor)
        experiments.append((anchor, exp))
    atomic.write_text(Path(out_file), _page(title or DEFAULT_TITLE, experiments))
    return {
        "experiments": len(experiments),
        "plots": sum(len(e["plot_items"]) for e in loaded),
        "tables": sum(len(e["table_items"]) for e in loaded),
        "runs": sum(e["n_rows"] for e in loaded),
    }


def add_report_arguments(p: argparse.ArgumentParser) -> None:
    """Arguments of ``fedpriv report``."""
    p.add_argument("results_dir", help="one experiment folder (with experiment.json) or a folder of experiment folders")
    p.add_argument("--out", required=True, metavar="FILE.html", help="the self-contained HTML page to write")
    p.add_argument("--title", default=None, help=f"page title (default {DEFAULT_TITLE!r})")


def report_command(args: argparse.Namespace) -> int:
    """Render the page of :func:`add_arguments`'s arguments and print a one-line JSON summary."""
    summary = render(args.results_dir, args.out, title=getattr(args, "title", None))
    print(json.dumps({"out": str(args.out), **summary}))
    return 0
