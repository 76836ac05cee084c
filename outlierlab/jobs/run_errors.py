"""How the entry points (train.py, probe.py, evaluate.py) end a job that failed.

A user error is one line on stderr, ``error: <root cause> (<the override that fixes it>)``, exit status 1
(``HYDRA_FULL_ERROR=1`` or ``OUTLIERLAB_DEBUG=1``: the traceback).  In a multirun a failing cell writes
``failed.json`` and the sweep goes on, exiting non-zero at its end.  Imports nothing heavy.
"""

from __future__ import annotations

import errno
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Collection

from outlierlab.jobs import sweep_outcomes
from outlierlab.jobs.run_state import FAILED_MARKER, mark_failed

# Errors that mean "the user asked for something that cannot work": reported as one line.
USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, PermissionError, OSError, FloatingPointError)
#: Raised by libraries for a configuration they reject, matched by name so that nothing heavy is imported here.
USER_ERROR_NAMES = {"MisconfigurationException", "RunDirBusy"}

#: Returned by :func:`run_main` for a cell of a multirun that failed or was skipped (the sweep goes on).
CELL_FAILED = object()

# (pattern in the root cause's message, the fix to suggest)
FIX_HINTS = (
    (re.compile(r"no supported (gpu|cuda|mps) backend|not available|no (gpu|cuda)", re.I),
     "run on the CPU with trainer.accelerator=cpu, or trainer.accelerator=auto to take what is there"),
    (re.compile(r"devices? .*(available|requested)|you requested (gpu|cuda|tpu|mps)|only has", re.I),
     "lower trainer.devices, or trainer.devices=auto to use every device there is"),
)


def _is_instantiation_error(exc: BaseException) -> bool:
    return type(exc).__name__ == "InstantiationException"


def root_cause(exc: BaseException) -> tuple[BaseException, str | None]:
    """The exception under Hydra's ``InstantiationException`` wrappers, and the innermost config key (full_key)."""
    key = None
    seen = set()
    while _is_instantiation_error(exc) and id(exc) not in seen:
        seen.add(id(exc))
        match = re.search(r"full_key: (\S+)", str(exc))
        key = match.group(1) if match else key
        if exc.__cause__ is None:
            break
        exc = exc.__cause__
    return exc, key


def is_user_error(exc: BaseException) -> bool:
    cause, _ = root_cause(exc)
    return (_is_instantiation_error(exc) or isinstance(cause, USER_ERRORS)
            or type(cause).__name__ in USER_ERROR_NAMES)


def _message(exc: BaseException) -> str:
    """The exception's first three non-empty lines on one line, at most 400 characters."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if _is_instantiation_error(exc) and len(lines) > 1:  # 'Error in call to target ...:' / 'ValueError("...")'
        lines = lines[1:2]
    text = " ".join(lines[:3])
    return (text[:397] + "...") if len(text) > 400 else (text or type(exc).__name__)


#: The errors of a full disk or quota, whichever layer raised them (torch's zip writer, TensorBoard's writer thread).
DISK_FULL = {errno.ENOSPC, errno.EDQUOT}


def os_error_in(exc: BaseException | None, errnos: Collection[int] | None = None) -> OSError | None:
    """The first ``OSError`` with an errno (one of ``errnos`` if given) in ``exc``'s chain of causes and contexts."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno and (errnos is None or exc.errno in errnos):
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def disk_full_error(exc: BaseException | None) -> OSError | None:
    """The full-disk ``OSError`` in ``exc``'s chain of causes and contexts, if any."""
    return os_error_in(exc, DISK_FULL)


def error_line(exc: BaseException, where: str | Path | None = None) -> str:
    """One line: the root cause and, where known, the override that fixes it (a full disk: file, remedy)."""
    full = disk_full_error(exc)
    if full is not None:
        target = full.filename or where
        return (f"no space left on the device{f' writing {target}' if target else ''} ({full.strerror}): free space "
                "there (or write elsewhere: hydra.run.dir=, paths.*) and run the same command again -- train.py "
                "resumes from its last checkpoint, whose files are written whole or not at all")
    cause, key = root_cause(exc)
    msg = _message(cause)
    if not isinstance(cause, USER_ERRORS) and type(cause).__name__ not in USER_ERROR_NAMES:
        msg = f"{type(cause).__name__}: {msg}"
    for pattern, fix in FIX_HINTS:
        trainer_error = (key or "").startswith("trainer") or type(cause).__name__ == "MisconfigurationException"
        if trainer_error and pattern.search(msg):
            return f"{msg} ({fix})"
    if key:
        # 'hidden_size=130 is not divisible by num_heads=4' under full_key 'model' -> model.hidden_size=...
        named = list(dict.fromkeys(re.findall(r"\b([A-Za-z_][A-Za-z0-9_]*)=", msg)))
        fix = " or ".join(f"{key}.{n}=..." for n in named) if named else f"a {key}.<option>=... override"
        return f"{msg} (in {key}: change it with {fix})"
    return msg


def _hydra_job() -> tuple[bool, Path | None]:
    """(whether this job is a cell of a multirun, its output directory); (False, None) outside Hydra."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except (ImportError, ValueError):
        return False, None
    return hc.mode == RunMode.MULTIRUN, Path(hc.runtime.output_dir)


def _record_cell_failure(exc: BaseException, line: str, cell: Path | None) -> None:
    """failed.json in the cell (unless the job wrote its own, with the step reached) and the sweep's record."""
    if cell is not None and not getattr(exc, "failed_recorded", False):
        try:
            mark_failed(cell, line, None)
        except OSError:
            pass  # an unwritable cell: the sweep's record below still names it
    sweep_outcomes.record(cell, "failed", line)


def run_main(job, cfg) -> Any:
    """Run ``job(cfg)``: a user error is one line and status 1; a multirun cell's failure is recorded."""
    try:
        return job(cfg)
    except Exception as e:  # noqa: BLE001 - sorted below: one line, recorded, or re-raised
        if os.environ.get("OUTLIERLAB_DEBUG") or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        multirun, cell = _hydra_job()
        user = is_user_error(e)
        line = error_line(e)
        if multirun:
            if type(e).__name__ == "RunDirBusy":
                print(f"skipped: {line}", file=sys.stderr, flush=True)
                sweep_outcomes.record(cell, "held", line)
                return CELL_FAILED
            if not user:
                traceback.print_exc()
            print(f"error: {line} -- cell {cell} failed ({FAILED_MARKER} written); the sweep goes on",
                  file=sys.stderr, flush=True)
            _record_cell_failure(e, line, cell)
            return CELL_FAILED
        if not user:
            raise
        print(f"error: {line}", file=sys.stderr)
        sys.exit(1)
