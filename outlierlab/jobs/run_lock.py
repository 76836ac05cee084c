"""One process per run directory: ``outlierlab.utils.dir_lock.lock_dir`` on ``<run_dir>/run.lock``, taken
before anything is written (a second ``train.py``, ``posthoc`` or export on the same run gets one line naming the
holder)."""

from __future__ import annotations

from pathlib import Path

from outlierlab.jobs.run_state import LOCK_FILE
from outlierlab.utils.dir_lock import DirBusy, DirLock


class RunDirBusy(DirBusy):
    """Another live process holds the run directory; ``holder`` is its record."""

    def __init__(self, run_dir: Path, holder: dict | None) -> None:
        super().__init__(run_dir, holder, "run directory",
                         "wait for it to finish, stop it, or choose another directory (hydra.run.dir=)")
        self.run_dir = Path(run_dir)


def lock_run_dir(run_dir: Path) -> DirLock:
    """Take ``<run_dir>/run.lock`` for this process, or raise ``RunDirBusy`` (one line)."""
    from outlierlab.utils import dir_lock

    try:
        return dir_lock.lock_dir(run_dir, LOCK_FILE)
    except DirBusy as e:
        raise RunDirBusy(run_dir, e.holder) from None
