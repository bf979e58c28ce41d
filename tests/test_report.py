"""``fedpriv.ops.report``: one self-contained HTML page from a results folder of experiments.

Builds a small results folder (two experiments: one with tables, plots, a search and runs with
ledgers; one whose cells were all skipped), renders it and checks the page's content, the errors
on bad input, the command-line entry point, and (in a headless browser) that every embedded plot
decodes, with a negative control whose corrupted image must turn the banner red."""

from __future__ import annotations

import argparse
import base64
import csv
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from fedpriv.errors import ConfigError
from fedpriv.ops.report import add_report_arguments, report_command, render

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RESULT_COLUMNS = [
    "experiment", "cell", "method", "algorithm", "dataset", "epsilon", "delta", "seed", "engine", "params", "run_dir",
    "epsilon_spent", "rounds", "bytes_up", "bytes_down", "seconds", "valid_rmse", "test_rmse",
]  # fmt: skip
DESCRIPTION = "Compares <b>DP-ALS</b> & AdaDPALS on synthetic data.\n\nSecond paragraph:\nline two."
SKIP_REASON = "needs ml-20m, which is not present at /data/ml-20m"


# ---------------------------------------------------------------- fixture builder


def _plot(path: Path, kind: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5), dpi=80)
    xs = [0.5, 1, 2, 4, 8]
    ax.plot(xs, [1.4 - 0.05 * kind - 0.1 * i for i in range(5)], marker="o", label="adadpals")
    ax.plot(xs, [1.5 - 0.08 * i for i in range(5)], marker="s", label="dpals-uniform")
    ax.set_xscale("log")
    ax.set_xlabel("epsilon")
    ax.set_ylabel("test RMSE")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    plt.close(fig)


def _write_csv(path: Path, header: list[str], rows: list[list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def _run(exp: Path, run_id: str, epsilon, spent, ledger: list[dict]) -> str:
    d = exp / "runs" / run_id
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps({"epsilon": epsilon, "epsilon_spent": spent, "delta": 1e-5, "test_rmse": 0.91}))
    (d / "ledger.json").write_text(json.dumps(ledger))
    return f"runs/{run_id}"


LEDGER = [
    {"name": "mean", "mechanism": "gaussian", "sensitivity": 4.0, "noise_std": 12.5, "noise_multiplier": 3.1, "count": 1, "sampling_rate": None, "dim": 1},
    {"name": "item_stats_A", "mechanism": "gaussian", "sensitivity": 1.0, "noise_std": 2.375, "noise_multiplier": 2.375, "count": 3, "dim": 16},
    {"name": "pick_rank", "mechanism": "exponential"},  # only name and mechanism: every other key is optional
]


def build_full(exp: Path) -> dict:
    """The experiment with everything: 2 tables, 2 plots, a search, 5 result rows (4 with runs)."""
    exp.mkdir(parents=True)
    _plot(exp / "plots" / "rmse_vs_epsilon.png", 0)
    _plot(exp / "plots" / "rmse_by_bucket.png", 1)
    _write_csv(
        exp / "tables" / "rmse.csv",
        ["method", "dataset", "epsilon", "test_rmse_mean", "test_rmse_std", "n"],
        [["adadpals", "synthetic", 1.0, 0.912345678, 0.0123456, 3], ["dpals-uniform", "synthetic", 1.0, 1.0456789, 0.02, 3]],
    )
    _write_csv(exp / "tables" / "cost.csv", ["method", "bytes_up", "seconds"], [["adadpals", 123456, 12.3456789]])
    def row(cell, method, eps, seed, params, run_dir, spent, valid, test):
        private = eps != ""
        return ["fig", cell, method, method, "synthetic", eps, 1e-5 if private else "", seed, "inprocess", params, run_dir, spent, 5, 10, 20, 1.5, valid, test]

    rows = [
        row("eps=1", "adadpals", 1.0, 0, '{"rank": 4, "lr": 0.05}', _run(exp, "r-ok", 1.0, 1.0000001, LEDGER), 1.0000001, 0.9, 0.91),
        row("eps=1", "adadpals", 1.0, 1, '{"rank": 4}', _run(exp, "r-over", 1.0, 1.25, LEDGER[:2]), 1.25, 0.9, 0.92),
        row("eps=1", "dpals-uniform", 1.0, 0, "{}", _run(exp, "r-nospent", 1.0, None, LEDGER[:1]), "", 0.95, 0.96),
        row("nonprivate", "als", "", 0, "{}", _run(exp, "r-als", None, None, []), "", 0.8, 0.81),
        row("eps=8", "adadpals", 8.0, 0, "{}", "", "", "", ""),  # a row without a run folder
    ]
    _write_csv(exp / "results.csv", RESULT_COLUMNS, rows)
    # the search: the first three rows as trials, the second one selected
    search_rows = [r[:10] + ["", "", "", "", "", "", 0.9 + 0.01 * i, "", 1 if i == 1 else 0, "valid_rmse"] for i, r in enumerate(rows[:3])]
    _write_csv(exp / "search.csv", [*RESULT_COLUMNS, "selected", "search_metric"], search_rows)
    doc = {
        "name": "fig_rmse",
        "title": "RMSE against epsilon",
        "description": DESCRIPTION,
        "kind": "sweep",
        "config_file": "simulations/experiments/fig_rmse.toml",
        "config_text": 'name = "fig_rmse"\n[grid]\nepsilon = [1, 8]  # <not html>\n',
        "quick": True,
        "engine": "inprocess",
        "order": 2,
        "started": "2025-01-01T10:00:00",
        "finished": "2025-01-01T10:05:00",
        "seconds": 300.25,
        "cells": {"total": 3, "done": 3, "skipped": 0},
        "skipped": [],
        "plots": [
            {"file": "plots/rmse_vs_epsilon.png", "caption": "Test RMSE vs epsilon (mean of 3 seeds)"},
            {"file": "plots/rmse_by_bucket.png", "caption": "RMSE by item-popularity bucket"},
        ],
        "tables": [
            {"file": "tables/rmse.csv", "title": "Test RMSE per method", "caption": "Mean ± std over seeds."},
            {"file": "tables/cost.csv", "title": "Communication cost", "caption": "Bytes sent by clients."},
        ],
        "headline": ["AdaDPALS beats DP-ALS at every epsilon."],
        "commands": ["fedpriv experiment run simulations/experiments/fig_rmse.toml --quick"],
    }
    (exp / "experiment.json").write_text(json.dumps(doc, indent=1))
    return doc


def build_skipped(exp: Path) -> dict:
    """An experiment whose cells were all skipped: no plots, no tables, a results.csv with only a header."""
    exp.mkdir(parents=True)
    _write_csv(exp / "results.csv", RESULT_COLUMNS, [])
    doc = {
        "name": "appendix_ml20m",
        "title": "Appendix: MovieLens 20M",
        "description": "Needs the large data set.",
        "kind": "sweep",
        "config_file": "simulations/experiments/appendix_ml20m.toml",
        "config_text": "name = 'appendix_ml20m'\n",
        "quick": False,
        "engine": "flower",
        "order": 1,
        "started": "2025-01-01T10:05:00",
        "finished": "2025-01-01T10:05:01",
        "seconds": 0.5,
        "cells": {"total": 2, "done": 0, "skipped": 2},
        "skipped": [{"cell": "ml-20m eps=1", "reason": SKIP_REASON}, {"cell": "ml-20m eps=8", "reason": SKIP_REASON}],
        "plots": [],
        "tables": [],
    }
    (exp / "experiment.json").write_text(json.dumps(doc, indent=1))
    return doc


def build_results(root: Path) -> Path:
    build_full(root / "fig_rmse")
    build_skipped(root / "appendix_ml20m")
    (root / "notes").mkdir()  # a subfolder without experiment.json is ignored
    return root


@pytest.fixture
def results(tmp_path) -> Path:
    return build_results(tmp_path / "results")


IMG_SRC = re.compile(r"<img\b[^>]*\bsrc=\"([^\"]*)\"")


# ---------------------------------------------------------------- content


def test_render_writes_one_self_contained_page(results, tmp_path):
    out = tmp_path / "site" / "report.html"
    summary = render(results, out, title="My <report>")
    assert summary == {"experiments": 2, "plots": 2, "tables": 2, "runs": 5}
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]  # no temporary file left
    page = out.read_text(encoding="utf-8")

    # every image is an embedded PNG, byte for byte the source file
    srcs = IMG_SRC.findall(page)
    assert len(srcs) == 2
    for src, name in zip(srcs, ["rmse_vs_epsilon.png", "rmse_by_bucket.png"]):
        assert src.startswith("data:image/png;base64,")
        data = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert data.startswith(PNG_SIGNATURE)
        assert data == (results / "fig_rmse" / "plots" / name).read_bytes()
    # nothing external
    low = page.lower()
    for needle in ('src="http', "href=\"http", "<link", "@import", "src='http", "url("):
        assert needle not in low, needle
    assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', page))
    assert all(s.startswith("data:") for s in re.findall(r'\bsrc="([^"]*)"', page))

    # title, toc, tables, captions, skip reasons, escaped description
    assert "<title>My &lt;report&gt;</title>" in page and "<h1>My &lt;report&gt;</h1>" in page
    assert 'href="#fig_rmse"' in page and 'href="#appendix_ml20m"' in page
    assert page.index('id="appendix_ml20m"') < page.index('id="fig_rmse"')  # sorted by order, not name
    for text in ("Test RMSE per method", "Communication cost", "Mean ± std over seeds.", "Bytes sent by clients.",
                 "Test RMSE vs epsilon (mean of 3 seeds)", "RMSE by item-popularity bucket", "AdaDPALS beats DP-ALS at every epsilon.",
                 "fedpriv experiment run simulations/experiments/fig_rmse.toml --quick", "ml-20m eps=1"):  # fmt: skip
        assert text in page, text
    assert page.count(SKIP_REASON) == 2
    assert "Compares &lt;b&gt;DP-ALS&lt;/b&gt; &amp; AdaDPALS on synthetic data.</p>" in page
    assert "<b>DP-ALS</b>" not in page
    assert "<p>Second paragraph:<br>\nline two.</p>" in page
    assert '<figure><img alt="Test RMSE vs epsilon (mean of 3 seeds)"' in page
    assert "epsilon = [1, 8]  # &lt;not html&gt;" in page  # the config, escaped, in a <details>
    assert "quick" in page and "cells done: 3/3" in page and "cells done: 0/2" in page

    # summary tables: 4 significant digits, mean ± std merged, ints kept
    assert "<th>test_rmse</th>" in page and "test_rmse_std" not in page.split('id="fig_rmse"')[1].split("<h3>Plots")[0]
    assert "0.9123 ± 0.01235" in page and "1.046 ± 0.02" in page
    assert '<td class="num">123456</td>' in page and '<td class="num">12.35</td>' in page

    # search: selected row highlighted, params compact
    search = page.split('<details class="search">')[1].split("</details>")[0]
    assert "3 trials, 1 selected" in search
    assert search.count('<tr class="selected">') == 1 and "rank=4, lr=0.05" in search

    # ledger: one row per run with a run_dir; spent epsilon, releases, mechanisms; flags
    ledger = page.split('<details class="ledger">')[1].split("</details>")[0]
    assert ledger.count("<tr") == 1 + 4
    assert "1.25" in ledger and ">1<" in ledger  # epsilon_spent and the target of the overspent run
    assert "mean&nbsp;×1 σ=12.5" in ledger and "item_stats_A&nbsp;×3 σ=2.375" in ledger and "pick_rank&nbsp;×1</li>" in ledger
    assert "exponential, gaussian" in ledger
    ok_row = next(r for r in ledger.split("<tr")[1:] if "item_stats_A" in r and "pick_rank" in r)
    assert '<td class="num">3</td><td class="num">5</td>' in ok_row  # 3 records, 1 + 3 + 1 releases
    assert "ledger-warning" not in ok_row  # spent within 1e-6 relative of the target
    flagged = [r for r in ledger.split("<tr")[1:] if r.startswith(' class="ledger-warning"')]
    assert len(flagged) == 2
    assert "epsilon_spent exceeds the target" in flagged[0] and "1.25" in flagged[0]
    assert "epsilon_spent missing" in flagged[1]
    assert "ledger warnings: 2" in page  # in the section's metadata line
    assert "No tables or plots for this experiment (see the skipped cells above)." in page


def test_render_one_experiment_folder(results, tmp_path):
    out = tmp_path / "one.html"
    assert render(results / "appendix_ml20m", out) == {"experiments": 1, "plots": 0, "tables": 0, "runs": 0}
    page = out.read_text()
    assert "<h1>fedpriv experiments</h1>" in page and SKIP_REASON in page and "<img" not in page


# ---------------------------------------------------------------- errors


def _break_missing_plot(root: Path) -> Path:
    (root / "fig_rmse" / "plots" / "rmse_by_bucket.png").unlink()
    return root


def _break_results_csv(root: Path) -> Path:
    path = root / "fig_rmse" / "results.csv"
    lines = path.read_text().splitlines()
    lines.insert(3, "fig,eps=1,adadpals,too,few,fields")  # becomes line 4
    path.write_text("\n".join(lines) + "\n")
    return root


def _break_table_csv(root: Path) -> Path:
    with open(root / "fig_rmse" / "tables" / "cost.csv", "a") as f:
        f.write("a,b,c,d\n")  # line 3
    return root


def _break_experiment_json(root: Path) -> Path:
    path = root / "appendix_ml20m" / "experiment.json"
    path.write_text(path.read_text()[:-20])
    return root


def _break_ledger(root: Path) -> Path:
    (root / "fig_rmse" / "runs" / "r-over" / "ledger.json").write_text('{"not": "a list"}')
    return root


def _empty(root: Path) -> Path:
    for d in ("fig_rmse", "appendix_ml20m"):
        shutil.rmtree(root / d)
    return root


@pytest.mark.parametrize(
    "breaker,needles",
    [
        (lambda root: root.parent / "does-not-exist", ["no such folder", "does-not-exist"]),
        (_empty, ["no experiment.json"]),
        (_break_missing_plot, ["rmse_by_bucket.png", "missing"]),
        (_break_results_csv, ["results.csv:4", "expected 18 fields", "got 6"]),
        (_break_table_csv, ["cost.csv:3", "expected 3 fields"]),
        (_break_experiment_json, ["appendix_ml20m/experiment.json", "malformed experiment.json"]),
        (_break_ledger, ["r-over/ledger.json", "malformed ledger.json"]),
    ],
    ids=["missing-folder", "no-experiments", "missing-plot", "results-csv-row", "table-csv-row", "experiment-json", "ledger-json"],
)
def test_render_errors_name_the_file_and_write_nothing(results, tmp_path, breaker, needles):
    root = breaker(results)
    out_dir = tmp_path / "site"
    out_dir.mkdir()
    with pytest.raises(ConfigError) as err:
        render(root, out_dir / "report.html")
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))
    assert list(out_dir.iterdir()) == []  # no page, no temporary file


def test_error_keeps_an_existing_page(results, tmp_path):
    out = tmp_path / "report.html"
    out.write_text("old page")
    _break_missing_plot(results)
    with pytest.raises(ConfigError):
        render(results, out)
    assert out.read_text() == "old page"


# ---------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fedpriv report")
    add_report_arguments(p)
    return p


def test_command_prints_a_json_summary(results, tmp_path, capsys):
    out = tmp_path / "r.html"
    args = _parser().parse_args([str(results), "--out", str(out), "--title", "Quick results"])
    assert report_command(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0]) == {"out": str(out), "experiments": 2, "plots": 2, "tables": 2, "runs": 5}
    assert "<h1>Quick results</h1>" in out.read_text()
    args = _parser().parse_args([str(results), "--out", str(tmp_path / "d.html")])
    assert args.title is None and report_command(args) == 0
    assert "<h1>fedpriv experiments</h1>" in (tmp_path / "d.html").read_text()


def test_command_arguments():
    with pytest.raises(SystemExit):
        _parser().parse_args(["results"])  # --out is required
    with pytest.raises(ConfigError, match="results_dir: no such folder"):
        report_command(_parser().parse_args(["/nonexistent/results", "--out", "/nonexistent/x.html"]))


# ---------------------------------------------------------------- headless browser

BROWSER_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--hide-scrollbars",
]  # fmt: skip


def find_browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def _browser() -> str:
    found = find_browser()
    if found is None:
        if os.environ.get("FEDPRIV_REQUIRE_BROWSER") == "1":
            pytest.fail("FEDPRIV_REQUIRE_BROWSER=1 but no headless browser found (chromium, chromium-browser, google-chrome, /usr/bin/chromium)")
        pytest.skip("no headless browser (chromium, chromium-browser, google-chrome) found")
    return found


def _chromium(html_path: Path, extra: list[str], width: int, height: int) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="fedpriv-chromium-") as profile:
        size = f"--window-size={width},{height}"
        cmd = [_browser(), *BROWSER_FLAGS, f"--user-data-dir={profile}", size, "--virtual-time-budget=5000", *extra, Path(html_path).resolve().as_uri()]
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc


def screenshot(html_path: Path, png_path: Path, width: int = 1200, height: int = 2400) -> Path:
    """Headless chromium screenshot of ``html_path`` (scripts run first) into ``png_path``."""
    _chromium(html_path, [f"--screenshot={Path(png_path).resolve()}"], width, height)
    assert Path(png_path).is_file(), f"chromium wrote no screenshot {png_path}"
    return Path(png_path)


def dump_dom(html_path: Path, width: int = 1200, height: int = 2400) -> str:
    """The DOM of ``html_path`` after its scripts ran (``--dump-dom``)."""
    return _chromium(html_path, ["--dump-dom"], width, height).stdout


def _banner(dom: str) -> str:
    m = re.search(r'<div id="render-status"[^>]*>([^<]*)</div>', dom)
    assert m, "no #render-status in the dumped DOM"
    return m.group(1)


def _share_of_colour(png: Path, rgb: tuple[int, int, int], rows: range, tol: int = 30) -> float:
    from PIL import Image

    with Image.open(png) as im:
        im = im.convert("RGB")
        px = [im.getpixel((x, y)) for y in rows for x in range(0, im.width, 2)]
    return sum(all(abs(a - b) <= tol for a, b in zip(p, rgb)) for p in px) / len(px)


@pytest.fixture(scope="module")
def browser_pages(tmp_path_factory):
    """The good page and a copy whose first image has a corrupted base64 payload."""
    _browser()
    base = tmp_path_factory.mktemp("browser")
    root = build_results(base / "results")
    good = base / "good.html"
    n = render(root, good)["plots"]
    page = good.read_text()
    marker = "data:image/png;base64,"
    i = page.index(marker) + len(marker)
    assert page[i : i + 8] == "iVBORw0K"  # base64 of the PNG signature
    bad = base / "bad.html"
    bad.write_text(page[:i] + "AAAAAAAAAAAAAAAAAAAAAAAA" + page[i + 24 :])  # signature and IHDR destroyed
    return good, bad, n


def test_browser_renders_every_plot(browser_pages, tmp_path):
    from PIL import Image

    good, _, n = browser_pages
    assert n == 2
    assert _banner(dump_dom(good)) == f"{n} of {n} plots rendered"
    png = screenshot(good, tmp_path / "good.png")
    with Image.open(png) as im:
        assert im.width == 1200
        rgb = im.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20)
    assert _share_of_colour(png, (0x00, 0xC0, 0x00), range(5, 31)) > 0.8  # green banner
    non_white = sum(c for c, p in colours if p != (255, 255, 255))
    assert non_white > 0.01 * rgb.width * rgb.height  # not blank
    assert len(colours) > 300  # text and plots, not a flat fill


def test_browser_negative_control_corrupted_image(browser_pages, tmp_path):
    _, bad, n = browser_pages
    assert _banner(dump_dom(bad)) == f"{n - 1} of {n} plots rendered"
    png = screenshot(bad, tmp_path / "bad.png")
    assert _share_of_colour(png, (0xFF, 0x00, 0x00), range(5, 31)) > 0.8  # red banner
    assert _share_of_colour(png, (0x00, 0xC0, 0x00), range(5, 31)) < 0.01


def test_missing_browser_skips_unless_required(monkeypatch):
    monkeypatch.setitem(globals(), "find_browser", lambda: None)
    monkeypatch.delenv("FEDPRIV_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception):
        _browser()
    monkeypatch.setenv("FEDPRIV_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="FEDPRIV_REQUIRE_BROWSER=1"):
        _browser()
