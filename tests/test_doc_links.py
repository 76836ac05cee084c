"""Every relative link of the README and docs/ reaches a file in the repository, and every ``#anchor`` into a Markdown
page names one of its headings (GitHub's slugs) -- the committed CSVs and studies the docs cite move with the code."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped (word characters, '-', '_' and spaces kept),
    spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found, seen, in_code = set(), {}, False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        m = None if in_code else re.match(r"#{1,6} (.+)", line)
        if m:
            s = slug(m.group(1))
            found.add(s if s not in seen else f"{s}-{seen[s]}")  # a repeated heading gets -1, -2, ...
            seen[s] = seen.get(s, 0) + 1
    return found


def links() -> list[tuple[Path, str]]:
    return [(page, m.group(1)) for page in pages() for m in LINK.finditer(page.read_text())
            if not m.group(1).startswith(("http://", "https://", "mailto:"))]


def test_every_relative_link_reaches_a_file():
    assert len(links()) > 100
    missing = [f"{page.relative_to(ROOT)}: {target}" for page, target in links()
               if target.split("#")[0] and not (page.parent / target.split("#")[0]).exists()]
    assert not missing, "\n".join(missing)


def test_every_anchor_names_a_heading():
    checked, wrong = 0, []
    for page, target in links():
        path, _, fragment = target.partition("#")
        linked = page.parent / path if path else page
        if not fragment or linked.suffix != ".md" or not linked.exists():
            continue
        checked += 1
        if fragment not in anchors(linked):
            wrong.append(f"{page.relative_to(ROOT)}: {target}")
    assert checked >= 5 and not wrong, "\n".join(wrong)


def test_the_slugs_are_githubs():
    assert slug("Which dimension, and since when (`outlierlab.studies.dim_identity`)") == \
        "which-dimension-and-since-when-outlierlabstudiesdim_identity"
    assert slug("Every scheme in the recipe: sinusoidal, relative, rope, alibi") == \
        "every-scheme-in-the-recipe-sinusoidal-relative-rope-alibi"
