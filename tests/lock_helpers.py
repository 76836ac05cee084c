"""A second process holding a run directory's lock, for the tests of a second writer being refused."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}


@contextmanager
def held_run_lock(run_dir: Path):
    """Another process takes ``run_dir``'s lock (:func:`outlierlab.utils.dir_lock.lock_run_dir`) and holds it until the
    block ends; yields its pid."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\n"
                               "from outlierlab.utils.dir_lock import lock_run_dir\n"
                               f"lock = lock_run_dir({str(run_dir)!r}); print('held', flush=True); time.sleep(120)"],
                              cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()
