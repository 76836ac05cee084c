"""Loggers whose history survives resuming into the same run directory.

``ResumableCSVLogger`` keeps ``metrics.csv`` (Lightning's deletes it), dropping only the abandoned timeline's rows
and adding the training row a kill right after a checkpoint lost (the checkpoint holds it: ``TRAIN_ROW``);
``TensorBoardResumePurge`` writes TensorBoard's restart marker at the resumed step, so redone steps do not show twice;
``one_console_for_lightning`` prints each Lightning log line once.
"""

from __future__ import annotations

import csv
import logging
import os
import sys
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from tensorboard.compat.proto.event_pb2 import Event, SessionLog

from outlierlab.utils.tables import MODEL_STEP, VALIDATION, write_csv


TRAIN_ROW = "outlierlab_train_row"  #: the checkpoint's key of the row its save came before (MLMLitModule)


class _ResumableWriter(ExperimentWriter):
    def __init__(self, log_dir: str) -> None:
        self._reconciled = False
        self.restored_row: dict[str, Any] | None = None  # the resumed checkpoint's TRAIN_ROW
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
                keep = [r for r in reader if r.get("step") not in (None, "") and _kept(r, first_new)]
            if (row := self.restored_row) is not None and row["step"] < first_new and not any(
                    int(float(r["step"])) == row["step"] and r.get("train/loss") not in (None, "") for r in keep):
                keep.append(row)  # killed between the checkpoint and the row: the checkpoint kept it
            self.metrics_keys = sorted(set(self.metrics_keys) | set(header))
            write_csv(self.metrics_file_path, keep, self.metrics_keys)  # atomic: a crash leaves the old file intact
        self._reconciled = True
        super().save()


def _kept(row: dict, first_new: int) -> bool:
    """Whether an interrupted session's row is kept: before step S, or the validation logged at S."""
    step = int(float(row["step"]))
    return step < first_new or (step == first_new and row.get(MODEL_STEP) not in (None, ""))


class ResumableCSVLogger(CSVLogger):
    """A ``CSVLogger`` that appends to an earlier run's ``metrics.csv`` on resume instead of deleting it."""

    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _ResumableWriter(log_dir=self.log_dir)
        return self._experiment


def write_purge_marker(writer, step: int) -> None:
    """Mark a restart at ``step`` as ``SummaryWriter(purge_step=step)`` does."""
    file_writer = writer._get_file_writer()
    file_writer.add_event(Event(step=int(step), file_version="brain.Event:2"))
    file_writer.add_event(Event(step=int(step), session_log=SessionLog(status=SessionLog.START)))
    file_writer.flush()


def validation_at(log_dir: str, step: int) -> dict[str, float]:
    """The ``val/*`` scalars at ``step`` in ``log_dir``'s events, relogged as the marker at S purges them."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    if not os.path.isdir(log_dir):
        return {}
    acc = EventAccumulator(log_dir, size_guidance={SCALARS: 0})  # 0: every event, no reservoir sampling
    acc.Reload()
    out = {}
    for tag in acc.Tags().get("scalars", []):
        if tag.startswith(VALIDATION):
            at = [e.value for e in acc.Scalars(tag) if e.step == step]
            if at:
                out[tag] = float(at[-1])
    return out


class TensorBoardResumePurge(Callback):
    """On resume, purge TensorBoard events at or after the resumed step; ``purged_from``: that step."""

    def __init__(self) -> None:
        self.purged_from: int | None = None

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if not trainer.is_global_zero:
            return
        step = int(checkpoint.get("global_step", 0))
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                kept = validation_at(logger.log_dir, step)  # read before the marker hides it
                write_purge_marker(logger.experiment, step)
                for tag, value in kept.items():
                    logger.experiment.add_scalar(tag, value, step)
                self.purged_from = step


def _drop_lightning_tips(record: logging.LogRecord) -> bool:
    """False for Lightning's "💡 Tip:" advertisements (see ``one_console_for_lightning``)."""
    return not str(record.msg).startswith("💡 Tip:")


#: Rich's console width when the console is a log file (see :func:`one_console_for_lightning`).
LOG_COLUMNS = 120


def one_console_for_lightning() -> None:
    """Print each Lightning log line once: its own console handler beside Hydra's root handlers doubles every line
    (Hydra issue #2898); kept where there are no root handlers.  Also drops Lightning's "💡 Tip:" lines and, where the
    console is a file and ``COLUMNS`` unset, gives Rich ``LOG_COLUMNS`` columns instead of 80."""
    if not sys.stdout.isatty() and "COLUMNS" not in os.environ:
        import rich  # Lightning's dependency for its rich bar and summary

        if rich.get_console().width < LOG_COLUMNS:
            rich.reconfigure(width=LOG_COLUMNS)
    rank_zero = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if _drop_lightning_tips not in rank_zero.filters:
        rank_zero.addFilter(_drop_lightning_tips)
    if not logging.getLogger().hasHandlers():
        return
    lightning_logger = logging.getLogger("lightning")
    for handler in list(lightning_logger.handlers):
        if type(handler) is logging.StreamHandler:  # Lightning's own console handler, not a file of the user's
            lightning_logger.removeHandler(handler)
