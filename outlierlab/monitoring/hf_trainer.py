"""The outlier monitors as a Hugging Face ``TrainerCallback``: one line added to any ``transformers.Trainer``.

::

    from outlierlab import OutlierMonitorCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=collator,
                      callbacks=[OutlierMonitorCallback(tokenizer=tok, every_n_steps=50)])

LayerNorm outlier dims (Kovaleva et al. 2021; Puccetti et al. 2022) and activation outlier dims on a fixed
held-out batch (Luo et al. 2021) of the model being trained — our ``RobertaMaskedLM`` or any model of a
registered family (``BertForMaskedLM``, ``RobertaForMaskedLM``, ModernBERT, ``GPT2LMHeadModel``, Llama-style,
...; the body inside a sentence-transformers ``SentenceTransformer``, whose ``SentenceTransformerTrainer`` is a
``Trainer``; the adapted model inside a PEFT ``PeftModel``) — computed by ``outlierlab.monitoring.loop_monitor.OutlierMonitor``, i.e. by the same trackers and the
same pure functions as the Lightning callbacks, into ``<args.output_dir>/monitor/layernorm.csv`` and
``hidden_states.csv`` (the columns of ``outlierlab.monitoring.history``) -- with order use and attention locality
at every record (does the model use word order yet? ``outlierlab.metrics.word_order``; one line at the end of
training when it does not; ``order_use=False`` turns it off).

When: at ``on_train_begin`` (``state.global_step``: 0, or the step of the checkpoint a resume starts from),
at ``on_step_end`` every ``every_n_steps`` optimizer steps (``state.global_step``), after every checkpoint save
(``on_save``: so every ``checkpoint-N`` has its row, and ``python -m outlierlab.jobs.posthoc`` on the checkpoints
reproduces them), and at the end of training; only on the world's process zero (``state.is_world_process_zero``).

Resume (``trainer.train(resume_from_checkpoint=...)``): the rows at steps ≥ the checkpoint's step are dropped
and the history continues (``OutlierMonitor``); the LayerNorm snapshot
at initialisation is read back from ``<out_dir>/layernorm_initial.pt``.

TensorBoard: a ``TrainerCallback`` gets no handle on the Trainer's own ``TensorBoardCallback``, and by the time
a user callback's ``on_log`` runs, the reporting callbacks (added before it) have already written that step's
logs — so the monitor cannot slip its scalars into them.  Instead, when ``args.report_to`` includes
``tensorboard``, the monitor opens its own ``SummaryWriter`` in the Trainer's TensorBoard folder
(``$TENSORBOARD_LOGGING_DIR`` or ``<output_dir>/runs``), sub-folder ``outlier_monitor``: one more run beside the
Trainer's in the same TensorBoard; after a resume it opens with ``purge_step`` at the checkpoint's step, so the
redone steps show once.  To put the scalars in the Trainer's very event file, give both callbacks one
writer: ``TensorBoardCallback(tb_writer=w)`` and ``OutlierMonitorCallback(..., writer=w)``.

Weights & Biases and MLflow (``report_to`` wandb / mlflow): their callbacks keep the run in the library's global
state, so the scalars go straight into the Trainer's own run (``TrackerRuns``).
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


def _reports_to_tensorboard(args: Any) -> bool:
    return _reports_to(args, "tensorboard")


class TrackerRuns:
    """A writer (the ``add_scalar`` of TensorBoard's) that hands the monitor's scalars to the experiment trackers the
    Trainer reports to, into *their* runs: the Weights & Biases run ``WandbCallback`` started (``wandb.run``; logged
    with ``train/global_step``, the step metric that callback declares) and the MLflow run ``MLFlowCallback`` started
    (``mlflow.active_run()``, ``step=``). A tracker with no active run is left alone; histograms and images stay in
    TensorBoard and the PNGs."""

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

    def add_histogram(self, *args: Any, **kwargs: Any) -> None:
        pass

    def add_image(self, *args: Any, **kwargs: Any) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


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
        TensorBoard writer for the scalars; None: the Trainer's TensorBoard folder when it reports to
        TensorBoard, else none; False: none.
    **monitor_kwargs
        Any other setting of ``OutlierMonitor`` (``image_every_n_steps``,
        ``vectors``, ``figures``, ``layernorm``, ``hidden_states``, ``rule``, ``n_sequences``, ``n_pairs``, ...).

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
        if not _reports_to_tensorboard(args):
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
