"""What a run directory says about itself: the code it ran on, whether it finished or failed, and a manifest
of its result files that a reader can verify.

Shared by the trainer and the study aggregator (docs/run_directories.md): every start appends a line to
``code_versions.jsonl``; the end writes ``manifest.json`` (each result file's size, SHA-256 and CSV row count, the
code version and config), then ``finished.json``; a failed cell writes ``failed.json``.  Every file is written
atomically, so a reader never sees a torn one.
"""

from __future__ import annotations

import csv
import hashlib
import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

from outlierlab.utils.atomic import write_atomic
from outlierlab.utils.dir_lock import LOCK_FILE, now_iso

FINISHED_MARKER = "finished.json"
FAILED_MARKER = "failed.json"
MANIFEST = "manifest.json"
CODE_VERSIONS = "code_versions.jsonl"
MANIFEST_SCHEMA = 1
#: Environment variable stating the commit of code that runs without git metadata (see :func:`code_version`).
CODE_VERSION_ENV = "OUTLIERLAB_CODE_VERSION"

#: Suffixes of a cell's result files (the manifest covers these; weights, checkpoints and event files it does not).
RESULT_SUFFIXES = (".csv", ".json", ".yaml", ".yml", ".md")
_NOT_RESULTS = {MANIFEST, FINISHED_MARKER, FAILED_MARKER, LOCK_FILE}
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def read_json(path: Path) -> Any | None:
    """A JSON file's content, or None where it is missing, unreadable or torn."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def read_yaml(path: Path) -> Any | None:
    """A YAML file's content, or None where it is missing or unreadable."""
    import yaml

    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, ValueError, yaml.YAMLError):
        return None


# ------------------------------------------------------------------------------------------ code version
def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(_PACKAGE_DIR), *args], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def code_version() -> dict[str, Any]:
    """``{"commit", "dirty", "describe"}`` of the git checkout holding this package (``dirty``: tracked files only);
    outside one, ``$OUTLIERLAB_CODE_VERSION`` with ``stated_by``, else nulls."""
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        # code shipped without git metadata (``git archive <commit>`` to a cluster node, a container, an accelerator
        # host): the launcher states the commit it exported; recorded as stated, with where it came from
        stated = os.environ.get(CODE_VERSION_ENV, "").strip()
        if stated:
            return {"commit": stated, "dirty": False, "describe": stated[:12], "stated_by": CODE_VERSION_ENV}
        return {"commit": None, "dirty": None, "describe": None}
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status),
            "describe": _git("describe", "--always", "--dirty", "--tags")}


def record_start(run_dir: Path, global_step: int,
                 config_changes: dict[str, list[Any]] | None = None) -> dict[str, Any]:
    """Append this start's code version, overrides and resume changes to ``code_versions.jsonl``."""
    line = {"started": now_iso(), "global_step_at_start": int(global_step), **code_version(),
            "overrides": _overrides(run_dir)}
    if config_changes:
        line["config_changes"] = config_changes
    with open(Path(run_dir) / CODE_VERSIONS, "a") as fh:
        fh.write(json.dumps(line) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return line


def changes_text(start: dict[str, Any], markdown: bool = False) -> str:
    """A start's changed settings as ``key before -> after, ...`` (``markdown``: keys as code); "" for none."""
    changes = start.get("config_changes")
    if not isinstance(changes, dict):
        return ""
    pairs = [(k, pair) for k, pair in changes.items() if isinstance(pair, list) and len(pair) == 2]
    if markdown:
        return ", ".join(f"`{k}` {a!r} → {b!r}" for k, (a, b) in pairs)
    return ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in pairs)


def code_versions(run_dir: Path) -> list[dict[str, Any]]:
    """Every parseable line of ``code_versions.jsonl`` (a line torn by a crash is skipped)."""
    try:
        lines = (Path(run_dir) / CODE_VERSIONS).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


# ------------------------------------------------------------------------------------------ finished / failed
def finished_run(run_dir: Path) -> dict[str, Any] | None:
    """``finished.json`` of a completed run (``global_step >= max_steps``), or None: THE definition."""
    done = read_json(Path(run_dir) / FINISHED_MARKER)
    if not isinstance(done, dict):
        return None
    step, max_steps = done.get("global_step"), done.get("max_steps")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (step, max_steps)) or step < max_steps:
        return None
    return done


def skip_finished(cfg: Any) -> dict[str, float] | None:
    """A finished run's final metrics where ``cfg`` only re-enters it (the same ``trainer.max_steps``, no ``ckpt_path``,
    ``skip_finished`` on), said in one line; else None.  train.py asks before torch loads: milliseconds per cell."""
    run_dir = Path(cfg.run_dir).resolve()
    done = finished_run(run_dir)
    if done is None or done.get("max_steps") != (cfg.get("trainer") or {}).get("max_steps") or \
            not cfg.get("skip_finished", True) or cfg.get("ckpt_path") not in (None, "", "null"):
        return None
    logging.getLogger(__name__).info("%s finished earlier (step %s): skipped; delete it, or give another run_dir, to "
                                     "train it again (skip_finished=false re-enters it from its last checkpoint: "
                                     "export and post-hoc run again)", run_dir, done.get("global_step"))
    return {k: float(v) for k, v in (done.get("metrics") or {}).items()}


def failed_run(run_dir: Path) -> dict[str, Any] | None:
    """``failed.json`` of a cell whose last attempt failed (and that has not finished since), or None."""
    if finished_run(run_dir) is not None:
        return None
    failed = read_json(Path(run_dir) / FAILED_MARKER)
    if (Path(run_dir) / FAILED_MARKER).is_file() and not isinstance(failed, dict):
        return {"error": "failed.json is unreadable"}
    return failed if isinstance(failed, dict) else None


def failed_line(info: dict[str, Any]) -> str:
    """``failed.json`` in one line: ``step N: <error>`` (the step where it is known)."""
    step = info.get("global_step")
    return (f"step {step}: " if isinstance(step, int) else "") + str(info.get("error", "no error recorded"))


#: A small file given up when the disk is full, so that ``failed.json`` can still be written.
ROOM_FILE = ".room"
ROOM_BYTES = 64 * 1024


def reserve_room(run_dir: Path) -> None:
    """Keep ``ROOM_FILE`` in ``run_dir`` (a no-op where the disk is already too full to hold it)."""
    try:
        path = Path(run_dir) / ROOM_FILE
        if not path.is_file() or path.stat().st_size < ROOM_BYTES:
            path.write_bytes(b"\0" * ROOM_BYTES)
    except OSError:
        (Path(run_dir) / ROOM_FILE).unlink(missing_ok=True)


def release_room(run_dir: Path) -> None:
    (Path(run_dir) / ROOM_FILE).unlink(missing_ok=True)


def mark_failed(run_dir: Path, error: str, global_step: int | None) -> dict[str, Any]:
    """Write ``failed.json``: the one-line error, the step reached and the code version."""
    info = {"error": error, "global_step": global_step, "failed": now_iso(), "code": code_version()}
    write_atomic(Path(run_dir) / FAILED_MARKER, json.dumps(info, indent=2))
    return info


def mark_finished(run_dir: Path, global_step: int, max_steps: int, metrics: dict[str, float],
                  config: dict[str, Any] | None, how: dict[str, Any] | None = None) -> dict[str, float]:
    """Write ``manifest.json``, then ``finished.json``, drop ``failed.json``; return the metrics recorded (a re-entry
    keeps the marker's).  ``how``: whether replicates can agree bit for bit (accelerator, determinism)."""
    run_dir = Path(run_dir)
    earlier = finished_run(run_dir)
    if earlier is not None and earlier["global_step"] == int(global_step) and isinstance(earlier.get("metrics"), dict):
        metrics = {**earlier["metrics"], **metrics}
    write_manifest(run_dir, config, global_step, max_steps)
    write_atomic(run_dir / FINISHED_MARKER, json.dumps({"global_step": int(global_step), "max_steps": int(max_steps),
                                                        "metrics": metrics, **(how or {})}, indent=2))
    (run_dir / FAILED_MARKER).unlink(missing_ok=True)
    release_room(run_dir)
    return metrics


# ------------------------------------------------------------------------------------------ manifest
def result_files(run_dir: Path) -> list[str]:
    """Sorted relative paths of the result files a manifest covers; not ``.hydra/`` (rewritten at launch)."""
    run_dir = Path(run_dir)
    out = []
    for root, dirs, files in os.walk(run_dir):
        # staging directories of an export in progress; Hydra's own folder (above)
        dirs[:] = [d for d in dirs if ".partial-" not in d and not (Path(root) == run_dir and d == ".hydra")]
        for name in files:
            rel = (Path(root) / name).relative_to(run_dir).as_posix()
            if name.endswith(RESULT_SUFFIXES) and rel not in _NOT_RESULTS and ".partial-" not in name:
                out.append(rel)
    return sorted(out)


def _csv_rows(path: Path) -> int:
    with open(path, newline="") as fh:
        return max(0, sum(1 for _ in csv.reader(fh)) - 1)


def describe_file(path: Path) -> dict[str, Any]:
    """``{"bytes", "sha256", "rows"}`` of one result file (``rows``: data rows of a CSV, else None)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    rows = _csv_rows(path) if path.suffix == ".csv" else None
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest(), "rows": rows}


def write_manifest(run_dir: Path, config: dict[str, Any] | None, global_step: int, max_steps: int) -> dict[str, Any]:
    """Write ``<run_dir>/manifest.json`` (schema 1) over every result file of the cell; return it."""
    run_dir = Path(run_dir)
    versions = code_versions(run_dir)
    first = versions[0] if versions else None
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "code_versions": versions,
        "code": None if first is None else {k: first.get(k) for k in ("commit", "dirty", "describe")},
        "config": config,
        "global_step": int(global_step),
        "max_steps": int(max_steps),
        "overrides": _overrides(run_dir),
        "files": {rel: describe_file(run_dir / rel) for rel in result_files(run_dir)},
    }
    write_atomic(run_dir / MANIFEST, json.dumps(manifest, indent=1, sort_keys=False))
    return manifest


def refresh_manifest(run_dir: Path, tool: str) -> dict[str, Any] | None:
    """Re-describe a finished cell's files after ``tool`` wrote some; None without a manifest."""
    run_dir = Path(run_dir)
    manifest = read_json(run_dir / MANIFEST)
    if not isinstance(manifest, dict) or finished_run(run_dir) is None:
        return None
    manifest["files"] = {rel: describe_file(run_dir / rel) for rel in result_files(run_dir)}
    manifest.setdefault("refreshed", []).append({"by": tool, "at": now_iso(), **code_version()})
    write_atomic(run_dir / MANIFEST, json.dumps(manifest, indent=1))
    return manifest


def _overrides(run_dir: Path) -> list[str] | None:
    """The cell's Hydra overrides (``.hydra/overrides.yaml``) when it finished; None if absent or unreadable."""
    value = read_yaml(Path(run_dir) / ".hydra" / "overrides.yaml")
    return [str(v) for v in value] if isinstance(value, list) else None


def csv_problem(path: Path) -> str | None:
    """What is wrong with a CSV's structure (empty, header only, cut, ragged), or None."""
    data = path.read_bytes()
    if not data.strip():
        return "empty file (zero bytes)" if not data else "empty file"
    if not data.endswith(b"\n"):
        return "truncated (last line has no newline: cut mid-row)"
    rows = list(csv.reader(data.decode("utf-8", errors="replace").splitlines()))
    if len(rows) < 2:
        return "header only (no data rows)"
    width = len(rows[0])
    for i, row in enumerate(rows[1:], start=2):
        if len(row) != width:
            return f"line {i} has {len(row)} fields, the header {width}"
    return None


def verify_manifest(run_dir: Path) -> list[str]:
    """Problems of a finished cell, one ``<cell dir>: <file>: <what is wrong>`` per file; [] if intact."""
    run_dir = Path(run_dir)
    problems = []
    if finished_run(run_dir) is None:
        what = "missing" if not (run_dir / FINISHED_MARKER).is_file() else "torn or short of max_steps"
        problems.append(f"{run_dir}: {FINISHED_MARKER}: {what}")
    manifest = read_json(run_dir / MANIFEST)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        what = "missing" if not (run_dir / MANIFEST).is_file() else "unreadable (torn?)"
        return problems + [f"{run_dir}: {MANIFEST}: {what}"]
    for rel, want in sorted(manifest["files"].items()):
        path = run_dir / rel
        if not path.is_file():
            problems.append(f"{run_dir}: {rel}: missing")
            continue
        if path.suffix == ".csv":
            bad = None if want.get("rows") == 0 else csv_problem(path)  # a CSV finished empty: hash only
            if bad:
                problems.append(f"{run_dir}: {rel}: {bad}")
                continue
        got = describe_file(path)
        if want.get("rows") is not None and got["rows"] != want["rows"]:
            problems.append(f"{run_dir}: {rel}: {got['rows']} data rows, the manifest says {want['rows']}")
        elif got["bytes"] != want.get("bytes"):
            problems.append(f"{run_dir}: {rel}: {got['bytes']} bytes, the manifest says {want.get('bytes')}")
        elif got["sha256"] != want.get("sha256"):
            problems.append(f"{run_dir}: {rel}: content changed (SHA-256 differs from the manifest)")
    return problems
