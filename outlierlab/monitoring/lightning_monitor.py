"""The Lightning side of the two outlier monitors: when to record, resume handling, the trainer's loggers.

What a record computes and writes is not here: each monitor is an adapter over a framework-free tracker
(``LayerNormTracker``, ``HiddenStateTracker``), written by ``outlierlab.monitoring.recording.publish``: the same
objects ``OutlierMonitor`` and ``OutlierMonitorCallback`` use, so every loop writes the same rows.

A monitor records at step 0 (in ``on_train_start``, before the first optimizer update), every
``every_n_steps`` optimizer steps, whenever a checkpoint is saved, and at the end of training — at most
once per step.  Only global rank 0 computes and writes; other ranks skip (the statistics are on rank 0's
copy of the weights, identical under DDP).

Resume: in ``on_train_start`` the loops are restored, so ``trainer.global_step`` is the resumed step.
Rows after it (written by the interrupted run past its last checkpoint) are removed, and the step
itself is recorded only if the history lacks it — so the history continues with no gap and no
duplicate.  A fresh run (step 0, no ``ckpt_path``) starts a new file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger

from outlierlab.monitoring import arguments
from outlierlab.monitoring.recording import is_image_step, publish
from outlierlab.monitoring.history import HistoryCSV


class LightningOutlierMonitor(L.Callback):
    """Base class; subclasses set ``tracker`` (its ``filename`` names the history), ``prepare`` and ``compute``.

    ``out_dir``: folder of the CSV history and the latest PNGs (config: ``${run_dir}/monitor``; default
    ``<trainer.default_root_dir>/monitor``).  ``every_n_steps``: record every this many optimizer steps (besides
    step 0, checkpoints and the last step).  ``image_every_n_steps``: draw the figures only at records whose step is a
    multiple of this (and the first and last): rendering costs more than the statistics.  ``vectors``: at those same
    image records also write whole per-dim vectors (most of the rows, so their cadence bounds the file size).
    """

    filename = "monitor.csv"
    #: the framework-free tracker (``log_to``, ``figures``) a subclass sets in its ``__init__``
    tracker: Any = None

    def __init__(self, out_dir: str | None = None, every_n_steps: int = 50, image_every_n_steps: int = 100,
                 vectors: bool = True) -> None:
        # the checks of ol.OutlierMonitor: a count is an integer, a switch a bool (not "5", 2.7 or "no")
        out_dir = arguments.path_like("out_dir", out_dir, optional=True)
        self.out_dir = None if out_dir is None else Path(out_dir)
        self.every_n_steps = arguments.count("every_n_steps", every_n_steps, 1)
        self.image_every_n_steps = arguments.count("image_every_n_steps", image_every_n_steps, 1)
        self.vectors = arguments.flag("vectors", vectors)
        self.history: HistoryCSV | None = None
        self._last_step: int | None = None

    # -- subclass API ---------------------------------------------------------------------------------
    def prepare(self, trainer: L.Trainer, pl_module: L.LightningModule, resumed: bool) -> None:
        """Called once at train start on every rank (after checkpoint restore), before the first record."""

    def compute(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, vectors: bool
                ) -> tuple[list, dict]:
        """History rows and a summary for the loggers; ``vectors``: include the per-dim vector rows."""
        raise NotImplementedError

    def log_to(self, writer: Any, step: int, summary: dict, images: bool) -> None:
        """Scalars/histograms to one TensorBoard ``SummaryWriter`` (the tracker's)."""
        self.tracker.log_to(writer, step, summary, images)

    def figures(self, step: int, summary: dict) -> dict[str, Any]:
        """``{tag_suffix: Figure}`` drawn at image steps (also saved as ``<out_dir>/<suffix>.png``)."""
        return self.tracker.figures(step, summary)

    # -- hooks ----------------------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        resumed = not (step == 0 and trainer.ckpt_path is None)
        out = self.out_dir if self.out_dir is not None else Path(trainer.default_root_dir) / "monitor"
        self.history = HistoryCSV(out / self.filename)
        self._last_step = None
        self.prepare(trainer, pl_module, resumed)
        if trainer.is_global_zero:
            self.history.truncate_after(step if resumed else -1)
            if resumed:
                self.after_resume(step)
            if step in self.history.steps():
                self._last_step = step
                # TensorBoard drops the interrupted run's events from this step on (loggers.TensorBoardResumePurge):
                # log the step again there; the history already holds it
                self._record(trainer, pl_module, to_history=False)
        if self._last_step is None:
            self._record(trainer, pl_module, images=True)

    def after_resume(self, step: int) -> None:
        """Called on rank 0 on resume, after the history was cut at ``step`` (e.g. to reload figure data)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        last = _is_final_step(trainer)
        if step != self._last_step and (step % self.every_n_steps == 0 or last):
            self._record(trainer, pl_module, images=last)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        # Any checkpoint written during fit (step-based, validation-based, last.ckpt), once per step.
        if self.history is not None and trainer.state.fn == "fit" and trainer.global_step != self._last_step:
            self._record(trainer, pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        if trainer.global_step != self._last_step:
            self._record(trainer, pl_module, images=True)

    # -- recording ------------------------------------------------------------------------------------
    def _record(self, trainer: L.Trainer, pl_module: L.LightningModule, images: bool = False,
                to_history: bool = True) -> None:
        step = trainer.global_step
        self._last_step = step
        if not trainer.is_global_zero:
            return
        images = is_image_step(step, self.image_every_n_steps, images)
        # Per-dim vectors only with the images: they are most of the rows (2·d per LayerNorm, d per layer).
        rows, summary = self.compute(trainer, pl_module, step, vectors=self.vectors and images)
        writers = [lg.experiment for lg in trainer.loggers if isinstance(lg, TensorBoardLogger)]
        # self, not the tracker: log_to/figures stay overridable per monitor
        publish(self, step, rows, summary, history=self.history if to_history else None, writers=writers,
                images=images, out_dir=self.history.path.parent)


def _is_final_step(trainer: L.Trainer) -> bool:
    """Is this the last optimizer step of the fit (so its record gets images and vectors)?"""
    if trainer.max_steps is not None and trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
        return True
    max_epochs = trainer.max_epochs
    return bool(trainer.is_last_batch and max_epochs is not None and max_epochs > 0
                and trainer.current_epoch + 1 >= max_epochs)

