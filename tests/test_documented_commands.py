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

ENTRY = re.compile(r"python3? (train|probe|evaluate|scripts/prepare_data)\.py\b")  # prepare_data: train's config
#: the other commands the docs show: the package's jobs and reports, scripts/ and benchmarks/ (argparse each)
TOOL = re.compile(r"python3? (?:-m ((?:outlierlab|lab)\.[a-z_.]+)|((?:scripts|benchmarks)/[a-z_]+\.py))\b")
#: where a command shown inline or in a block ends: a backtick, a comment, a pipe between alternatives, prose
END = re.compile(r"`| #| \| |\s{2,}\(|\)\.?$|;|\s(?:2?>|&&|&|\|\||and|then)(?:\s|$)")
SOURCES = ["README.md", "docs/*.md", "configs/*.yaml", "configs/*/*.yaml", "train.py", "probe.py", "evaluate.py",
           "outlierlab/**/*.py", "lab/*.py", "scripts/*.py", "scripts/*.sh", "benchmarks/*.py"]


PLACEHOLDER = re.compile(r"<[^>]*>|…|\.\.\.|\$\{[^}]*\}|\$\w+")


def shown_failing(rest: str, next_line: str) -> bool:
    """A command the docs show failing on purpose: "error" or "fails" after it on its line (``# error: ...``), or an
    ``error:`` line under it."""
    return bool(re.search(r"\b(error|fails?)\b", rest, re.I)) or next_line.lstrip().startswith("error:")


def documented_commands(entry: re.Pattern = ENTRY) -> list[tuple[str, str, list[str]]]:
    """(source file, command as written, its words after the script or module) for every documented command line
    matching ``entry`` that is not shown failing on purpose."""
    found = []
    for pattern in SOURCES:
        for path in sorted(ROOT.glob(pattern)):
            lines = path.read_text().splitlines()
            for i, line in enumerate(lines):
                m = entry.search(line)
                if not m or shown_failing(line[m.end():], lines[i + 1] if i + 1 < len(lines) else ""):
                    continue
                text = line[m.start():]
                in_span = line[:m.start()].count("`") % 2 == 1 and "`" not in text
                while (text.rstrip().endswith("\\") or in_span) and i + 1 < len(lines):  # a shell continuation,
                    i += 1                                            # or an inline code span wrapped by the page
                    text = text.rstrip().rstrip("\\") + " " + lines[i].strip().lstrip("#").strip()
                    in_span = in_span and "`" not in lines[i]
                if path.suffix == ".py":  # a command in a string split over literals: "... " "'analyses=[...]'"
                    text = re.sub(r"(?<=\S) ?\"\s+\"", " ", text)
                text = END.split(PLACEHOLDER.sub("X", text))[0].strip()
                try:
                    words = shlex.split(text)
                except ValueError:  # a command cut mid-quote by the page's layout: not a command to run
                    continue
                start = len(m.group(0).split())
                if len(words) > start and words[start] in ("—", "-", "…"):  # a heading in prose, not a command
                    continue
                found.append((str(path.relative_to(ROOT)), text, [w for w in words[start:] if w != "\\"]))
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
        if w.partition("=")[2] == "X":  # a placeholder value (pos=$pos, trainer.max_steps=$STEPS): the user's to give
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
        from outlierlab.evaluation.core import check_settings, selected_analyses, selected_transforms

        names = [str(n) for n in (cfg.get("analyses") or [])]
        own = {n: object() for n in names if "." in n}  # a researcher's own analysis module (docs/extending.md)
        selected_transforms(cfg)
        check_settings(cfg, selected_analyses(cfg, given=own))


COMMANDS = documented_commands()


def test_the_docs_show_many_commands():
    assert len(COMMANDS) >= 100
    assert {ENTRY.search(c).group(1) for _, c, _ in COMMANDS} == {"train", "probe", "evaluate", "scripts/prepare_data"}


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["train", "probe", "evaluate"])
def test_every_documented_command_composes_and_passes_the_preflight_check(entry):
    failures = []
    seen = set()
    for source, text, words in COMMANDS:
        if ENTRY.search(text).group(1).replace("scripts/prepare_data", "train") != entry:
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


class _Parsed(Exception):
    """Raised in place of running the command once its arguments parsed."""


def parses(target: str, argv: list[str], monkeypatch) -> str | None:
    """None if ``python -m target`` / ``python target`` accepts ``argv`` (its argparse parser, nothing run), else
    argparse's message."""
    import argparse
    import contextlib
    import io
    import os
    import runpy
    import sys

    parse, parse_known = argparse.ArgumentParser.parse_args, argparse.ArgumentParser.parse_known_args
    inside = []

    def parse_then_stop(self, args=None, namespace=None):
        inside.append(1)  # parse_args calls parse_known_args: let it through
        parse(self, args, namespace)
        raise _Parsed

    def parse_known_then_stop(self, args=None, namespace=None):
        result = parse_known(self, args, namespace)
        if inside:
            return result
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_then_stop)
    monkeypatch.setattr(sys, "argv", [target, *argv])
    monkeypatch.setattr(sys, "path", list(sys.path))  # a script's sys.path.insert stays with it
    environ = dict(os.environ)  # and its os.environ.setdefault(...)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            if target.endswith(".py"):
                runpy.run_path(str(ROOT / target), run_name="__main__")
            else:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
    except _Parsed:
        return None
    except SystemExit as e:
        return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {e.code}"
    except Exception as e:  # noqa: BLE001 -- it ran past its arguments (or has none to parse)
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    finally:
        monkeypatch.undo()
        os.environ.clear()
        os.environ.update(environ)
    return "ran to the end without parsing its arguments with argparse"


def tool_words(words: list[str]) -> list[str]:
    """A usage line's words as a command: optional brackets dropped (``[--out DIR]``), the first of alternatives
    (``clm|mlm``), an upper-case placeholder (``STEP``, ``DIR``) a value that parses as a number too."""
    out = []
    for w in words:
        w = w.lstrip("[").rstrip("]").split("|")[0]
        out.append("1" if re.fullmatch(r"[A-Z][A-Z_]*", w) else w)
    return [w for w in out if w]


def uses_argparse(target: str) -> bool:
    import importlib.util

    spec = None if target.endswith(".py") else importlib.util.find_spec(target)
    path = ROOT / target if target.endswith(".py") else Path(spec.origin)
    return "ArgumentParser" in path.read_text()


def exists(target: str) -> bool:
    """The script or module a documented command runs is there (a module moved or renamed leaves its old name in
    the docs)."""
    import importlib.util

    if target.endswith(".py"):
        return (ROOT / target).is_file()
    try:
        return importlib.util.find_spec(target) is not None
    except ModuleNotFoundError:  # a parent package that does not exist
        return False


def test_every_documented_job_script_and_benchmark_command_parses(monkeypatch):
    """``python -m outlierlab.studies.aggregate ... --contrast ...``, ``python scripts/export_cells.py ...``,
    ``python benchmarks/evaluate_vs_forward.py --repeat 3``: each documented flag is one the tool takes."""
    commands = documented_commands(TOOL)
    assert len(commands) >= 150
    failures, seen = [], set()
    for source, text, words in commands:
        m = TOOL.match(text)
        key = (m.group(1) or m.group(2), tuple(tool_words(words)))
        if key[0] not in seen and not exists(key[0]):
            seen.add(key[0])
            failures.append(f"{source}: {text!r}: no module or script {key[0]}")
            continue
        if not words or key in seen or not uses_argparse(key[0]):  # a bare mention; a tool reading sys.argv itself
            continue
        seen.add(key)
        problem = parses(key[0], list(key[1]), monkeypatch)
        if problem:
            failures.append(f"{source}: {text!r}: {problem}")
    assert not failures, "\n".join(failures)


def test_a_bad_override_is_caught():
    """The check can fail: the override this test was written for, and an unknown key."""
    with pytest.raises(Exception, match="Config group override"):
        preflight("probe", overrides_to_compose(["order_use=false"]))
    with pytest.raises(Exception):
        preflight("train", overrides_to_compose(["model.no_such_key=1"]))


def test_a_bad_flag_is_caught(monkeypatch):
    assert parses("outlierlab.studies.dim_identity", ["cells", "--out", "x"], monkeypatch) is None
    assert "unrecognized arguments: --no-such-flag" in parses("outlierlab.studies.dim_identity",
                                                               ["cells", "--out", "x", "--no-such-flag"], monkeypatch)
