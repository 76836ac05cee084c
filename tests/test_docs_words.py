"""The docs describe the product, not how it was made: no page or comment narrates the project's history (which
stop, issue or session did what, which machine was borrowed when). History belongs in git; a benchmark gives
today's figure, its command and the machine."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

HISTORY = re.compile(r"\bstops? \d+|\bissues?[ -]\d+|\bthis (session|stop|round)\b|\b(last|previous|"
                     r"earlier|next) (stop|round|session)s?\b|\btwo stops\b|\bsince stop\b|\bstops? before\b|"
                     r"\blent\b|\bborrowed\b|\bthe issue's\b|\b(end|start) of the session\b|\bin the session\b", re.I)


def history_lines(paths) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{i}: {m.group(0)!r}"
            for p in paths for i, line in enumerate(p.read_text().splitlines(), 1)
            for m in [HISTORY.search(line)] if m]


def test_the_pattern_finds_history():
    found = [bool(HISTORY.search(s)) for s in ("measured on stop 60's machine", "see issue 48", "the issue-39 tests", "two stops before",
                                                "as this session found", "the machine lent to us")]
    assert all(found)
    assert not any(HISTORY.search(s) for s in ("the run stops at step 300", "an issue of the corpus", "each round of", "Lightning issue #21253"))


def test_readme_and_docs_pages_narrate_no_history():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert not (hits := history_lines(pages)), "history words:\n" + "\n".join(hits)


def test_the_code_narrates_no_history():
    """The package, its tests, benchmarks, scripts, the docs generators (lab/) and configs (this file's own examples
    apart)."""
    files = [p for folder in ("outlierlab", "tests", "benchmarks", "scripts", "lab", "configs")
             for p in sorted((ROOT / folder).rglob("*")) if p.suffix in (".py", ".yaml", ".sh") and p.is_file()
             and p != Path(__file__).resolve()]
    assert not (hits := history_lines(files)), "history words:\n" + "\n".join(hits)
