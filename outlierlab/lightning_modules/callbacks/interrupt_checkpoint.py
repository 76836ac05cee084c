"""Save ``last.ckpt`` when a scheduler or a person stops training with SIGTERM, so a resumed run loses at
most the step in flight.

Lightning already turns SIGTERM into an orderly stop: its signal handler sets ``trainer.received_sigterm``,
and the training loop raises ``SIGTERMException`` at the end of the current batch -- after the optimizer
step, the schedulers and the loggers, i.e. at a consistent state -- then calls every callback's
``on_exception``. Lightning's :class:`~lightning.pytorch.callbacks.OnExceptionCheckpoint` saves on *any*
exception, including a non-finite loss or a bug, whose checkpoint must not become the one a resumed run
trusts; this subclass saves only for SIGTERM, and under the name the resume logic reads (``last.ckpt``),
written to a temporary name and renamed so a kill during the write leaves the previous ``last.ckpt`` intact.

SLURM sends SIGTERM at preemption and at the time limit (then SIGKILL after ``KillWait``); submitit's
requeue then restarts the cell, which finds ``last.ckpt`` and resumes (``outlierlab.jobs.training``).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import OnExceptionCheckpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException

log = logging.getLogger(__name__)


class InterruptCheckpoint(OnExceptionCheckpoint):
    """On SIGTERM: write ``<dirpath>/<filename>.ckpt`` (default ``last.ckpt``) at the end of the current step."""

    def __init__(self, dirpath: str, filename: str = "last") -> None:
        super().__init__(dirpath, filename)

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        if not isinstance(exception, SIGTERMException):
            return
        os.makedirs(self.dirpath, exist_ok=True)
        tmp = os.path.join(self.dirpath, f".{self.filename}.interrupted{self.FILE_EXTENSION}")
        trainer.save_checkpoint(tmp)
        if trainer.is_global_zero:
            os.replace(tmp, self.ckpt_path)
            log.warning("SIGTERM at global step %d: saved %s; run again in the same directory to resume",
                        trainer.global_step, self.ckpt_path)

    def teardown(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        pass  # OnExceptionCheckpoint deletes its file at a normal end; ours is the run's last.ckpt: keep it
