"""The documentation (issue 35): a short README whose links resolve, a site whose every part
exists, an API reference listing every public name, and (experiments suite, where Chromium is
installed) a strict MkDocs build whose index renders in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: a Sphinx role left raw on a rendered page (``:func:<code>x</code>``, or ``:class:`x``` as text)
SPHINX_ROLE_TEXT = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const|type):(?:<code>|`)")


def _hooks():
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sphinx_roles_of_the_docstrings_render_as_linked_code():
    """mkdocstrings (Google style) does not render Sphinx roles: docs/hooks.py turns each into
    code, linked to the object's entry when the page documents it."""
    hooks = _hooks()
    page = (
        '<h3 id="fedpriv.api.train">train</h3><h3 id="fedpriv.run.job.Job">Job</h3>'
        '<h3 id="fedpriv.errors.DataError">DataError</h3><h3 id="fedpriv.run.model.Model.save">save</h3>'
        "<p>See :func:<code>train</code>, :class:<code>fedpriv.run.Job</code>, :class:<code>~fedpriv.errors.DataError</code>,"
        " :meth:<code>Model.save</code>, :mod:<code>fedpriv.algorithms.pam</code> and :func:<code>fedpriv.nothing.here</code>.</p>"
    )
    out = hooks.sphinx_roles_to_code(page)
    assert not SPHINX_ROLE_TEXT.search(out), out
    assert '<a class="autorefs" href="#fedpriv.api.train"><code>train</code></a>' in out
    assert '<a class="autorefs" href="#fedpriv.run.job.Job"><code>fedpriv.run.Job</code></a>' in out  # re-exported name
    assert '<a class="autorefs" href="#fedpriv.errors.DataError"><code>DataError</code></a>' in out  # ~: the last part
    assert '<a class="autorefs" href="#fedpriv.run.model.Model.save"><code>Model.save</code></a>' in out
    assert "<code>fedpriv.algorithms.pam</code> and <code>fedpriv.nothing.here</code>." in out  # not on the page: code alone


def test_the_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 220
    assert "bash scripts/run.sh" in text and "bash scripts/test.sh" in text and "pip install" in text
    targets = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text) if not t.startswith("http")]
    assert targets and all((ROOT / t).exists() for t in targets), [t for t in targets if not (ROOT / t).exists()]
    assert not re.search(r"\b[Ii]ssues? \d", text)


def test_the_site_has_its_four_parts_and_references_every_public_name():
    import fedpriv

    nav = (ROOT / "mkdocs.yml").read_text()
    for part in ("Tutorials", "How-to guides", "Explanations", "Reference", "Results"):
        assert f"- {part}:" in nav
    for page in re.findall(r":\s+([\w/.-]+\.md)\s*$", nav, re.M):
        assert (ROOT / "docs" / page).exists(), page
    api = (ROOT / "docs" / "reference" / "api.md").read_text()
    documented = {line.split()[-1].rsplit(".", 1)[-1] for line in api.splitlines() if line.startswith(":::")}
    assert set(fedpriv.__all__) <= documented, set(fedpriv.__all__) - documented
    results = (ROOT / "docs" / "results" / "index.md").read_text()
    assert not re.search(r"\b[Ii]ssues? \d", results)  # results without internal issue numbers


@pytest.mark.experiments
def test_the_site_builds_strictly_and_its_index_renders(tmp_path):
    if shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None:
        pytest.fail("mkdocs is not installed: pip install -e '.[docs]' (scripts/test.sh does)")
    from tests.test_report import dump_dom

    site = tmp_path / "site"
    build = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "-d", str(site)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "load_model" in api and "RunReport" in api and "PersonalModel" in api
    # the docstrings' Sphinx roles are rendered as (linked) code, on every page
    assert not SPHINX_ROLE_TEXT.findall(api), SPHINX_ROLE_TEXT.findall(api)[:10]
    assert '<a class="autorefs" href="#fedpriv.api.train"><code>train</code></a>' in api
    for page in site.rglob("*.html"):
        assert not SPHINX_ROLE_TEXT.search(page.read_text(errors="replace")), page
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "fedpriv run" in cli and "fedpriv selection scenarios" in cli and "fedpriv deploy up" in cli  # nested commands too
    dom = dump_dom(site / "index.html")
    assert "<title>fedpriv</title>" in dom and "Tutorials" in dom and "Python quick start" in dom
