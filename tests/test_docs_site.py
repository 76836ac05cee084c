"""The docs site builds with ``mkdocs build --strict`` (warnings, broken anchors and unresolved API references fail it)
and every page of docs/ is reachable from its navigation."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from tests.conftest import ROOT

pytest.importorskip("mkdocs")
pytest.importorskip("mkdocstrings")


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


def test_the_site_builds_strict(tmp_path):
    # run from tmp_path: the theme keeps a .cache/ folder in the working directory
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-f", str(ROOT / "mkdocs.yml"),
                           "-d", str(tmp_path / "site")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    # the API reference is generated from the docstrings, not written by hand
    assert "outlierlab.api.evaluate" in reference and "OutlierMonitor" in reference
    assert (tmp_path / "site" / "quickstart" / "index.html").exists()
