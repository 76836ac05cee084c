"""The docs site builds with ``mkdocs build --strict`` with every link check at ``warn`` (a dead link, a link to a
folder, a broken anchor or an unresolved API reference fails it), every page of docs/ is reachable from its
navigation, and the built site is what a reader sees: no raw Sphinx role in any page, numpy-style parameter tables
in the API reference, no relative link that leads nowhere, and the notebook with its outputs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml

from tests.conftest import ROOT

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")

#: A Sphinx cross-reference role as Markdown leaves it: the role's name, then the backticked target (Markdown turns
#: the backticks into <code>).
RAW_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|obj|exc|math|ref):(?:`|<code)")


def _nav_pages(node) -> set[str]:
    if isinstance(node, str):
        return {node}
    if isinstance(node, list):
        return set().union(*(_nav_pages(n) for n in node)) if node else set()
    if isinstance(node, dict):
        return set().union(*(_nav_pages(v) for v in node.values()))
    return set()


def _config() -> dict:
    # mkdocs.yml has no custom YAML tags, so the safe loader reads it
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text())


def test_every_docs_page_is_in_the_navigation():
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} | {p.name for p in (ROOT / "docs").glob("*.ipynb")}
    missing = sorted(pages - _nav_pages(_config()["nav"]))
    assert not missing, f"docs pages not in mkdocs.yml's nav: {missing}"


def test_the_readme_map_links_pages_of_the_site():
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\(docs/([\w\-]+\.md)", readme))
    assert linked and linked <= _nav_pages(_config()["nav"])


def test_link_checks_fail_a_strict_build():
    # at `info` mkdocs only reports a dead link, and `--strict` passes it
    validation = _config()["validation"]
    assert validation["links"]["not_found"] == "warn"
    assert validation["unrecognized_links"] == "warn" and validation["anchors"] == "warn"
    # the docstrings are numpy-style: with `sphinx` their Parameters sections render as one paragraph
    mkdocstrings = next(p["mkdocstrings"] for p in _config()["plugins"] if isinstance(p, dict) and "mkdocstrings" in p)
    assert mkdocstrings["handlers"]["python"]["options"]["docstring_style"] == "numpy"


def test_no_docstring_of_the_package_uses_a_sphinx_role():
    """The API reference renders docstrings as Markdown, where a role (``:func:`name```) prints as it is written: a
    cross-reference is a backticked name (``name``), in every module, rendered in the reference or not yet."""
    import ast

    found = []
    for path in sorted((ROOT / "outlierlab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {m.group()}"
                          for m in re.finditer(r":(?:class|func|meth|mod|attr|data|obj|exc|math|ref):`[^`]*`",
                                               node.value.value)]
    assert not found, "Sphinx roles in docstrings (write ``name``):\n" + "\n".join(found)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("docs")
    # run from a temporary directory: the theme keeps a .cache/ folder in the working directory. Not --quiet: it
    # drops the warnings before --strict counts them, and a build with dead links passes
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(out / "site")],
                          cwd=out, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert done.returncode == 0 and not warnings, "\n".join(warnings) or done.stderr[-3000:]
    return out / "site"


@pytest.mark.slow
def test_the_site_builds_strict(site):
    reference = (site / "reference" / "index.html").read_text()
    # the API reference is generated from the docstrings, not written by hand
    assert "outlierlab.api.evaluate" in reference and "OutlierMonitor" in reference
    assert (site / "quickstart" / "index.html").exists()


@pytest.mark.slow
def test_no_page_shows_a_raw_sphinx_role(site):
    raw = {str(page.relative_to(site)): sorted(set(RAW_ROLE.findall(page.read_text()))) or RAW_ROLE.search(
        page.read_text()).group() for page in site.rglob("*.html") if RAW_ROLE.search(page.read_text())}
    assert not raw, f"raw Sphinx roles in the built site: {raw}"


@pytest.mark.slow
def test_the_reference_renders_numpy_sections(site):
    reference = (site / "reference" / "index.html").read_text()
    evaluate = reference[reference.index('id="outlierlab.api.evaluate"'):reference.index('id="outlierlab.api.probe_positions"')]
    # a Parameters section is a table of names, not one paragraph that starts "Parameters ----------"
    assert "----------" not in evaluate
    assert re.search(r'doc-section-title">\s*Parameters', evaluate)
    for name in ("texts", "analyses", "transforms", "out_dir", "overrides", "settings", "plots"):
        assert re.search(rf"<code>{name}</code>", evaluate), name


@pytest.mark.slow
def test_the_reference_names_every_valid_analysis_and_transform(site):
    from outlierlab.evaluation.registry import ANALYSIS_MODULES
    from outlierlab.configuration.overrides import group_options

    reference = (site / "reference" / "index.html").read_text()
    evaluate = reference[reference.index('id="outlierlab.api.evaluate"'):reference.index('id="outlierlab.api.probe_positions"')]
    named = set(re.findall(r"<code>(\w+)</code>", evaluate[evaluate.index("Valid analyses"):]))
    missing = sorted((set(ANALYSIS_MODULES) | set(group_options("transform"))) - named)
    assert not missing, f"ol.evaluate's reference does not list {missing}"


class _Links(HTMLParser):
    def __init__(self):
        super().__init__()
        self.targets: list[str] = []

    def handle_starttag(self, tag, attrs):
        for key, value in attrs:
            if key in ("href", "src") and value:
                self.targets.append(value)


@pytest.mark.slow
def test_every_relative_link_of_the_site_leads_somewhere(site):
    """What mkdocs leaves as it is (a folder, a file outside docs/) is a dead link in the site: every relative href
    and src of every built page reaches a page or a file of the site."""
    dead, checked = [], 0
    for page in site.rglob("*.html"):
        if page.name == "404.html":
            continue  # served at any depth, it links from the site's root ("/assets/...")
        parser = _Links()
        parser.feed(page.read_text())
        for target in parser.targets:
            parts = urlsplit(target)
            if parts.scheme or parts.netloc or not parts.path:
                continue  # another site, mailto:, data:, or an anchor on the page itself
            checked += 1
            path = (page.parent / unquote(parts.path)).resolve()
            if not (path.is_file() or (path / "index.html").is_file()):
                dead.append(f"{page.relative_to(site)}: {target}")
    assert checked > 1000 and not dead, "\n".join(sorted(set(dead)))


@pytest.mark.slow
def test_the_notebook_page_shows_its_outputs(site):
    page = (site / "quickstart" / "index.html").read_text()
    assert "(6, 384)" in page                       # the first cell's result: MiniLM's layers and width
    assert "accuracy" in page and "<img" in page    # the probe's table and the anisotropy figure
