"""Whether a cell of a sweep can be read: finished by the trainer's own definition, and every file it contributes
intact.  Every problem is one line, ``<cell>: <file>: <what>``.  A cell with a manifest is verified against it
(``run_state.verify_manifest``); one without has its CSVs checked for what a crash or copy leaves: zero bytes, header
only, a cut last line, a row of another width."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from outlierlab.jobs import run_state
from outlierlab.jobs.run_state import csv_problem  # the one CSV-structure check, shared with verify_manifest

#: Code version of a cell without a manifest (made before cells recorded one).
UNKNOWN_CODE = "unknown"


def finished(path: Path, config: dict[str, Any], problems: list[str]) -> bool:
    """Training cells: ``run_state.finished_run`` and a marker covering the config's budget; a torn marker or
    one short of the budget is a problem (the cell is not merely unfinished). Other cells: their result file."""
    if (path / run_state.FINISHED_MARKER).is_file():
        done = run_state.finished_run(path)
        if done is None:
            problems.append(f"{path}: {run_state.FINISHED_MARKER}: torn, or short of its max_steps (not finished)")
            return False
        want = config.get("trainer.max_steps")
        if isinstance(want, int) and done["max_steps"] != want:
            problems.append(f"{path}: {run_state.FINISHED_MARKER}: records {done['global_step']} of {done['max_steps']} "
                            f"steps but the config asks for {want} (extended and not finished)")
            return False
        return True
    if (path / "checkpoints").is_dir():  # a training cell without its marker: stopped or still running
        return False
    return any((path / name).is_file() for name in ("results.json", "report.md", "probe_report.md"))


def code_version(manifest: dict) -> str:
    versions = manifest.get("code_versions") or []
    code = manifest.get("code") or {}
    seen = {(v.get("commit"), bool(v.get("dirty"))) for v in versions if isinstance(v, dict)}
    seen.add((code.get("commit"), bool(code.get("dirty"))))
    seen.discard((None, False))
    labels = sorted(f"{c[:12] if c else 'unknown'}{'-dirty' if d else ''}" for c, d in seen)
    return "+".join(labels) or UNKNOWN_CODE


def check_cell(path: Path, files: list[str]) -> tuple[list[str], str, list[str]]:
    """``(problems, code version, notes)`` of a finished cell: its manifest verified when it has one, else each
    of ``files`` (the CSVs the aggregator reads) checked by ``run_state.csv_problem``."""
    problems, notes = [], []
    if (path / run_state.MANIFEST).is_file():
        manifest = run_state.read_json(path / run_state.MANIFEST)  # None: torn or unreadable, verify_manifest names it
        if (path / run_state.FINISHED_MARKER).is_file():
            problems += run_state.verify_manifest(path)
        notes += resumed_with_changes(path)
        return problems, code_version(manifest) if isinstance(manifest, dict) else UNKNOWN_CODE, notes
    notes.append(f"{path.name}: no manifest: code version unknown")
    for rel in files:
        bad = csv_problem(path / rel)
        if bad:
            problems.append(f"{path}: {rel}: {bad}")
    return problems, UNKNOWN_CODE, notes


def resumed_with_changes(path: Path) -> list[str]:
    """One note per start that resumed the cell with other settings (``code_versions.jsonl``): its config.yaml
    states the last start's, so a reader of the study learns here that part of the run trained otherwise."""
    return [f"{path.name}: resumed at step {v.get('global_step_at_start', '?')} with other settings: {text}"
            for v in run_state.code_versions(path) if (text := run_state.changes_text(v))]
