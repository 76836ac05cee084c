"""Loggers whose history survives resuming into the same run directory.

* Lightning's CSVLogger deletes an existing ``metrics.csv`` when a run resumes, losing the history a
  researcher plots. ``ResumableCSVLogger`` keeps it: on its first write it drops only the rows of
  the abandoned timeline (steps at or after the first step the resumed run logs) and appends from there,
  so the file has no gap and no duplicated step.
* TensorBoard keeps every event file of a run directory: after a crash at step 14 and a resume from the
  step-10 checkpoint, steps 11-14 show twice. ``TensorBoardResumePurge`` writes TensorBoard's
  restart marker (a ``SessionLog.START`` event at the resumed step, what ``SummaryWriter(purge_step=…)``
  writes) the moment the checkpoint is loaded, before anything of the new session is logged; TensorBoard's
  reader then discards the earlier events at or after that step.
"""

from __future__ import annotations

import csv
import os
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from tensorboard.compat.proto.event_pb2 import Event, SessionLog

from outlierlab.utils.tables import write_csv


class _ResumableWriter(ExperimentWriter):
    def __init__(self, log_dir: str) -> None:
        self._reconciled = False
        super().__init__(log_dir)

    def _check_log_dir_exists(self) -> None:  # the parent deletes metrics.csv here
        pass

    def save(self) -> None:
        if not self.metrics:
            return
        if not self._reconciled and os.path.isfile(self.metrics_file_path):
            first_new = min(int(m["step"]) for m in self.metrics)
            with open(self.metrics_file_path, newline="") as f:
                reader = csv.DictReader(f)
                header = list(reader.fieldnames or [])
                keep = [r for r in reader if r.get("step") not in (None, "") and int(float(r["step"])) < first_new]
            self.metrics_keys = sorted(set(self.metrics_keys) | set(header))
            write_csv(self.metrics_file_path, keep, self.metrics_keys)  # atomic: a crash leaves the old file intact
        self._reconciled = True
        super().save()


class ResumableCSVLogger(CSVLogger):
    """``lightning.pytorch.loggers.CSVLogger`` that appends to, rather than deletes, an earlier
    run's ``metrics.csv`` when resuming into the same directory."""

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ResumableWriter(log_dir=self.log_dir)
        return self._experiment


def write_purge_marker(writer, step: int) -> None:
    """Mark a restart at ``step`` in a ``torch.utils.tensorboard.SummaryWriter``'s event file.

    The same two events ``SummaryWriter(purge_step=step)`` writes when it opens a file: the file version
    (TensorBoard honours restart markers only in version-2 files) and ``SessionLog.START``, on which the
    reader purges every event seen so far with a step >= ``step``.
    """
    file_writer = writer._get_file_writer()
    file_writer.add_event(Event(step=int(step), file_version="brain.Event:2"))
    file_writer.add_event(Event(step=int(step), session_log=SessionLog(status=SessionLog.START)))
    file_writer.flush()


class TensorBoardResumePurge(Callback):
    """On resume, purge the TensorBoard events the interrupted run wrote at or after the resumed step.

    Works with Lightning's own ``TensorBoardLogger``; the step is read
    from the checkpoint in ``on_load_checkpoint``, which runs before the new session logs anything.

    Attributes
    ----------
    purged_from : int or None
        The step of the last marker written (None: this run did not resume).
    """

    def __init__(self) -> None:
        self.purged_from: int | None = None

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if not trainer.is_global_zero:
            return
        step = int(checkpoint.get("global_step", 0))
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                write_purge_marker(logger.experiment, step)
                self.purged_from = step
