"""A multirun that survives a failing cell and says so at its end.

``run_errors.run_main`` returns from a failing cell and records its outcome as a file
(``<sweep dir>/.sweep_outcomes/<launch id>/<digest>.json``); ``SweepOutcomes``, a Hydra callback, prints the failed and
skipped cells at the end and exits non-zero if any failed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from outlierlab.jobs.run_state import read_json
from outlierlab.utils.atomic import write_atomic

ENV = "OUTLIERLAB_SWEEP_ID"
OUTCOMES = ".sweep_outcomes"


def _sweep_dir() -> Path | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().sweep.dir)
    except (ImportError, ValueError):
        return None


def record(cell: Path | None, kind: str, line: str, sweep_dir: Path | None = None) -> None:
    """Note that ``cell`` of the current launch ``failed`` or was ``held`` by another process (else a no-op)."""
    launch, sweep_dir = os.environ.get(ENV), sweep_dir or _sweep_dir()
    if not launch or sweep_dir is None:
        return
    folder = sweep_dir / OUTCOMES / launch
    folder.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha1(str(cell).encode()).hexdigest()[:16]
    # whole or not at all: read() skips a torn outcome, which would drop a failure from the sweep's list
    write_atomic(folder / f"{name}.json", json.dumps({"cell": str(cell), "kind": kind, "error": line}))


def read(sweep_dir: Path, launch: str) -> list[dict[str, Any]]:
    """The outcomes the cells of one launch recorded (``record``), by cell; a file torn by a kill is skipped."""
    outcomes = map(read_json, (Path(sweep_dir) / OUTCOMES / launch).glob("*.json"))
    return sorted((o for o in outcomes if isinstance(o, dict)), key=lambda o: o.get("cell", ""))


class SweepOutcomes(Callback):
    """Lists a multirun's failed and skipped cells at its end; exits with status 1 if any cell failed."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        os.environ[ENV] = uuid.uuid4().hex  # jobs started from now on (workers, SLURM jobs) inherit it

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        launch = os.environ.pop(ENV, None)
        if not launch:
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        outcomes = read(sweep_dir, launch)
        shutil.rmtree(sweep_dir / OUTCOMES / launch, ignore_errors=True)
        try:
            (sweep_dir / OUTCOMES).rmdir()
        except OSError:
            pass  # another launch's outcomes are still there
        held = [o for o in outcomes if o["kind"] == "held"]
        failed = [o for o in outcomes if o["kind"] == "failed"]
        for o in held:
            print(f"skipped (held by another process): {o['cell']}", file=sys.stderr)
        for o in failed:
            print(f"failed: {o['cell']}: {o['error']}", file=sys.stderr)
        if failed:
            print(f"error: {len(failed)} cell(s) of this sweep failed (see failed.json in each); fix them and run the "
                  "same command again (train.py skips finished cells)", file=sys.stderr, flush=True)
            sys.exit(1)
