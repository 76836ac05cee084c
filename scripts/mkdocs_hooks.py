"""mkdocs hooks (mkdocs.yml ``hooks:``): the API reference's list of the analyses and transforms ``ol.evaluate``
accepts, read when the site is built from the registry and ``configs/transform/``, as ``help(ol.evaluate)`` reads
them, so the page cannot fall behind an analysis added to the registry."""

from __future__ import annotations

import sys
from pathlib import Path

#: Where in a page the list goes.
MARKER = "<!-- ol.evaluate's valid names -->"


def valid_names() -> str:
    """The list, as Markdown."""
    root = str(Path(__file__).resolve().parent.parent)
    if root not in sys.path:  # this checkout's package, whichever one the environment's install points at
        sys.path.insert(0, root)
    from outlierlab.api import DEFAULT_ANALYSES
    from outlierlab.evaluation.registry import ANALYSIS_MODULES
    from outlierlab.configuration.overrides import group_options

    def code(names) -> str:
        return ", ".join(f"`{n}`" for n in names)

    return (f"**Valid analyses** (`analyses=[...]`): {code(ANALYSIS_MODULES)}, or the dotted path of a module of "
            f"one's own ([Evaluating](evaluating.md) says what each computes; default: {code(DEFAULT_ANALYSES)}).  \n"
            f"**Valid transforms** (`transforms=[...]`): {code(group_options('transform'))}.")


def on_page_markdown(markdown: str, **kwargs) -> str:
    return markdown.replace(MARKER, valid_names()) if MARKER in markdown else markdown
