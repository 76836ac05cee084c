"""Every ``python train.py|probe.py|evaluate.py ...`` command the README, the docs, the config comments and the entry
points show composes, and passes the pre-flight check its entry point runs before any model or data loads.

A documented override that no longer exists (or never did: ``probe.py order_use=false`` was read by Hydra as
evaluate's ``order_use`` config group and refused) costs a reader a failed run; composing each command here costs
a fraction of a second.  Placeholders (``RUN``, ``<run>``, ``…``) are strings to a composition, so they compose; a
sweep (``-m pos=learned,none``) composes its first cell; Hydra's own settings (``hydra.*``, ``hydra/launcher=...``)
are left to Hydra at launch.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import ROOT, compose

ENTRY = re.compile(r"python3? (train|probe|evaluate)\.py\b")
#: where a command shown inline or in a block ends: a backtick, a comment, a pipe between alternatives, prose
END = re.compile(r"`| #| \| |\s{2,}\(|\)\.?$|;|\s(?:2?>|&&|&|\|\|)(?:\s|$)")
SOURCES = ["README.md", "docs/*.md", "configs/*.yaml", "configs/*/*.yaml", "train.py", "probe.py", "evaluate.py"]


PLACEHOLDER = re.compile(r"<[^>]*>|…|\.\.\.|\$\{[^}]*\}|\$\w+")


def shown_failing(line: str, next_line: str) -> bool:
    """A command the docs show failing on purpose: an ``# error: ...`` comment or an ``error:`` line under it."""
    comment = line.split("#", 1)[1] if "#" in line else ""
    return "error" in comment.lower() or next_line.lstrip().startswith("error:")


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(source file, command as written, its words after the script) for every documented command line that is not
    shown failing on purpose."""
    found = []
    for pattern in SOURCES:
        for path in sorted(ROOT.glob(pattern)):
            lines = path.read_text().splitlines()
            for i, line in enumerate(lines):
                m = ENTRY.search(line)
                if not m or shown_failing(line, lines[i + 1] if i + 1 < len(lines) else ""):
                    continue
                text = line[m.start():]
                while text.rstrip().endswith("\\") and i + 1 < len(lines):  # a shell continuation
                    i += 1
                    text = text.rstrip()[:-1] + " " + lines[i].strip().lstrip("#").strip()
                text = END.split(PLACEHOLDER.sub("X", text))[0].strip()
                try:
                    words = shlex.split(text)
                except ValueError:  # a command cut mid-quote by the page's layout: not a command to run
                    continue
                if len(words) > 2 and words[2] in ("—", "-", "…"):  # a heading in prose, not a command
                    continue
                found.append((str(path.relative_to(ROOT)), text, [w for w in words[2:] if w != "\\"]))
    return found


def overrides_to_compose(words: list[str]) -> list[str]:
    """The overrides a composition takes: flags and Hydra's own settings dropped, placeholders made plain strings,
    a sweep's first value."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    kept = []
    for w in words:
        if w.startswith(("-", "hydra.", "hydra/")) or w in ("job", "hydra", "all") or "=" not in w:
            continue  # flags, Hydra's own settings, a bare placeholder
        if w.startswith("[") and "|" in w:  # a usage synopsis: [pos=learned|none|...]
            continue
        key, _, value = w.partition("=")
        if value == "X" and "." not in key:  # a placeholder where a config group's option goes (pos=$pos)
            continue
        kept.append(w)
    parsed = OverridesParser.create().parse_overrides(kept)
    out = []
    for o, w in zip(parsed, kept):
        if o.is_sweep_override():
            first = next(o.sweep_string_iterator())
            out.append(f"{o.get_key_element()}={first}")
        else:
            out.append(w)
    return out


def preflight(entry: str, overrides: list[str]) -> None:
    """Compose ``entry``'s config and run the checks its entry point runs before loading anything."""
    cfg = compose(entry, overrides)
    if entry == "train":
        from outlierlab.jobs.startup import check_train_config

        check_train_config(cfg)
    elif entry == "evaluate":
        from outlierlab.jobs.evaluation import check_settings, selected_analyses, selected_transforms

        names = [str(n) for n in (cfg.get("analyses") or [])]
        own = {n: object() for n in names if "." in n}  # a researcher's own analysis module (docs/extending.md)
        selected_transforms(cfg)
        check_settings(cfg, selected_analyses(cfg, given=own))


COMMANDS = documented_commands()


def test_the_docs_show_many_commands():
    assert len(COMMANDS) >= 100
    assert {ENTRY.search(c).group(1) for _, c, _ in COMMANDS} == {"train", "probe", "evaluate"}


@pytest.mark.parametrize("entry", ["train", "probe", "evaluate"])
def test_every_documented_command_composes_and_passes_the_preflight_check(entry):
    failures = []
    seen = set()
    for source, text, words in COMMANDS:
        if ENTRY.search(text).group(1) != entry:
            continue
        try:
            overrides = tuple(overrides_to_compose(words))
            if overrides in seen:
                continue
            seen.add(overrides)
            preflight(entry, list(overrides))
        except Exception as e:  # noqa: BLE001 -- every failure listed, with its source
            failures.append(f"{source}: {text!r}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
    assert not failures, "\n".join(failures)


def test_a_bad_override_is_caught():
    """The check can fail: the override this test was written for, and an unknown key."""
    with pytest.raises(Exception, match="Config group override"):
        preflight("probe", overrides_to_compose(["order_use=false"]))
    with pytest.raises(Exception):
        preflight("train", overrides_to_compose(["model.no_such_key=1"]))
