"""The outlier monitors as a Hugging Face ``TrainerCallback``: one line added to any ``transformers.Trainer``.

::

    from outlierlab import OutlierMonitorCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=collator,
                      callbacks=[OutlierMonitorCallback(tokenizer=tok, every_n_steps=50)])

LayerNorm outlier dims (Kovaleva et al. 2021; Puccetti et al. 2022) and activation outlier dims on a fixed held-out
batch (Luo et al. 2021) of the model being trained — our ``RobertaMaskedLM`` or any registered family (also the body of
a sentence-transformers model, or the adapted model of a PEFT ``PeftModel``) — computed by ``OutlierMonitor`` into
``<args.output_dir>/monitor/layernorm.csv`` and ``hidden_states.csv``, with order use and attention locality at every
record (``outlierlab.metrics.word_order``; ``order_use=False`` turns it off).

Records at ``on_train_begin`` (step 0, or the resumed checkpoint's), every ``every_n_steps`` optimizer steps, after
every checkpoint save (so ``python -m outlierlab.jobs.posthoc`` reproduces each ``checkpoint-N``'s row) and at the end,
on the world's process zero only.  With ``tensorboard`` in ``args.report_to`` the monitor opens its own
``SummaryWriter`` in the Trainer's folder, sub-folder ``outlier_monitor`` (a callback cannot reach the
``TensorBoardCallback`` writer; pass one writer to both to share a file); Weights & Biases and MLflow runs get the
scalars directly (``TrackerRuns``).  docs/loop_monitors.md says it at length.
"""

from __future__ import annotations

import inspect
import os
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from .loop_monitor import OutlierMonitor

__all__ = ["OutlierMonitorCallback"]


def _reports_to(args: Any, name: str) -> bool:
    report = getattr(args, "report_to", None) or []
    report = [report] if isinstance(report, str) else list(report)
    return name in report or "all" in report


class TrackerRuns:
    """An ``add_scalar`` writer handing the monitor's scalars to the trackers' own runs: ``wandb.run`` (with
    ``train/global_step``, ``WandbCallback``'s step metric) and ``mlflow.active_run()`` (``step=``).  A tracker without
    an active run is left alone; histograms and images stay in TensorBoard and the PNGs."""

    def __init__(self, wandb: bool, mlflow: bool) -> None:
        self.wandb, self.mlflow = wandb, mlflow

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        if self.wandb:
            import wandb

            if wandb.run is not None:
                wandb.log({tag: float(value), "train/global_step": int(step)})
        if self.mlflow:
            import mlflow

            if mlflow.active_run() is not None:
                mlflow.log_metric(tag, float(value), step=int(step))

    def _nothing(self, *args: Any, **kwargs: Any) -> None:
        """Histograms and images stay in TensorBoard; the trackers' runs need no flush or close."""

    add_histogram = add_image = flush = close = _nothing


class _Tee:
    """Several writers as one (the monitor takes one)."""

    def __init__(self, writers: list[Any]) -> None:
        self.writers = writers

    def __getattr__(self, name: str):
        def call(*args: Any, **kwargs: Any) -> None:
            for w in self.writers:
                getattr(w, name)(*args, **kwargs)
        return call


class OutlierMonitorCallback(TrainerCallback):
    """LayerNorm and hidden-state outlier monitors for ``transformers.Trainer`` (module docstring).

    Parameters
    ----------
    tokenizer : a Hugging Face tokenizer, optional
        The model's own; default the Trainer's ``processing_class``.
    every_n_steps : int
        Record every this many optimizer steps.
    out_dir : str, optional
        Default ``<args.output_dir>/monitor``.
    sentences : sequence of str, optional
        Held-out texts (default: the shipped held-out sentences).
    writer : a SummaryWriter-like writer, None or False
        None: the Trainer's TensorBoard folder when it reports to TensorBoard, else none; False: none.
    **monitor_kwargs
        Any other ``OutlierMonitor`` setting (``image_every_n_steps``, ``layernorm``, ``rule``, ``n_sequences``, ...).

    Attributes
    ----------
    monitor : OutlierMonitor or None
        The monitor of the current ``train()`` call (None on other processes and before training).
    """

    def __init__(self, tokenizer: Any = None, every_n_steps: int = 50, out_dir: str | os.PathLike | None = None,
                 sentences: list[str] | None = None, writer: Any = None, **monitor_kwargs: Any) -> None:
        bad = {"model", "global_zero", "max_steps", "out_dir", "every_n_steps", "tokenizer"} & set(monitor_kwargs)
        if bad:
            raise TypeError(f"OutlierMonitorCallback sets {sorted(bad)} itself")
        unknown = sorted(set(monitor_kwargs) - set(inspect.signature(OutlierMonitor).parameters))
        if unknown:  # Python's own message named OutlierMonitor.__init__, which the caller never called
            raise TypeError(f"OutlierMonitorCallback got unknown setting(s) {', '.join(unknown)}; the settings are "
                            "OutlierMonitor's (help(ol.OutlierMonitor))")
        # every setting checked now, by the monitor's own checks, not at on_train_begin after the Trainer's setup
        OutlierMonitor(tokenizer=tokenizer, out_dir=out_dir if out_dir is not None else "monitor",
                       every_n_steps=every_n_steps, sentences=sentences, writer=False if writer is None else writer,
                       global_zero=False, **monitor_kwargs)
        self.tokenizer, self.every_n_steps, self.out_dir = tokenizer, int(every_n_steps), out_dir
        self.sentences, self.writer, self.monitor_kwargs = sentences, writer, monitor_kwargs
        self.monitor: OutlierMonitor | None = None
        self._opened: Any = None

    def _tensorboard(self, args: Any, step: int) -> Any:
        if self.writer is not None:
            return self.writer
        if not _reports_to(args, "tensorboard"):
            return False
        from torch.utils.tensorboard import SummaryWriter  # lazy: only when the Trainer reports to TensorBoard

        root = os.path.expanduser(os.getenv("TENSORBOARD_LOGGING_DIR") or os.path.join(args.output_dir, "runs"))
        # every session marks a restart at its first step: TensorBoard then drops the events a prior monitor
        # wrote from that step on -- a resumed one's redone steps, and a fresh train() in the same output_dir (step 0)
        # every earlier run's, which it showed mixed with this run's
        return SummaryWriter(log_dir=os.path.join(root, "outlier_monitor"), purge_step=step)

    def _writer(self, args: Any, step: int) -> Any:
        """TensorBoard (below) and, when the Trainer reports to them, its W&B / MLflow runs (``TrackerRuns``)."""
        tb = self._tensorboard(args, step)
        trackers = None
        if self.writer is not False and (_reports_to(args, "wandb") or _reports_to(args, "mlflow")):
            trackers = TrackerRuns(_reports_to(args, "wandb"), _reports_to(args, "mlflow"))
        if trackers is None:
            return tb
        return trackers if tb is False else _Tee([tb, trackers])

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        if not state.is_world_process_zero:
            return
        tok = self.tokenizer if self.tokenizer is not None else getattr(processing_class, "tokenizer",
                                                                        processing_class)
        out = Path(self.out_dir) if self.out_dir is not None else Path(args.output_dir) / "monitor"
        writer = self._writer(args, state.global_step)  # the checkpoint's step when resuming
        self.monitor = OutlierMonitor(tokenizer=tok, out_dir=out, every_n_steps=self.every_n_steps,
                                      sentences=self.sentences, writer=writer, max_steps=state.max_steps,
                                      global_zero=True, **self.monitor_kwargs)
        # a TensorBoard writer this callback opened is closed at the end of train(); the caller's is left open
        tb = writer.writers[0] if isinstance(writer, _Tee) else writer
        self._opened = tb if tb is not False and tb is not self.writer and hasattr(tb, "log_dir") else None
        self.monitor.start(model, state.global_step)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.is_world_process_zero and self.monitor is not None:
            self.monitor.step(model, state.global_step)

    def on_save(self, args, state, control, model=None, **kwargs):
        # the weights of checkpoint-N are those at on_step_end of step N: a row for every checkpoint, once per step
        if state.is_world_process_zero and self.monitor is not None and state.global_step != self.monitor.last_step:
            self.monitor.record(model, state.global_step)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if not state.is_world_process_zero or self.monitor is None:
            return
        if state.global_step != self.monitor.last_step:
            self.monitor.record(model, state.global_step, images=True)
        self.monitor.close()
        if self._opened is not None:
            self._opened.close()
            self._opened = None
