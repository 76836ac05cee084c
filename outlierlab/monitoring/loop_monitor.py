"""The outlier monitors for any training loop: one object, ``monitor.step(model, step)``.

Watches LayerNorm outlier dims emerge (Kovaleva et al. 2021; Puccetti et al. 2022) and activation outlier dims on a
fixed held-out batch (Luo et al. 2021), on our ``RobertaMaskedLM`` or any registered Hugging Face family
(``outlierlab.models.families``), trained by a hand-written loop::

    monitor = OutlierMonitor(model, tokenizer=tok, out_dir="run/monitor", every_n_steps=50)
    monitor.step(model, 0)                      # before the first update: the init snapshot and step 0
    for step in range(1, max_steps + 1):
        loss = model(**next(batches)).loss; loss.backward(); opt.step(); opt.zero_grad()
        monitor.step(model, step)               # records at step multiples of every_n_steps
    monitor.close()

The same trackers and ``publish`` as the Lightning callbacks, so the same files (``<out_dir>/layernorm.csv``,
``hidden_states.csv``, the PNG figures) and TensorBoard tags (own ``SummaryWriter`` in ``<out_dir>/tensorboard``
unless the caller passes one).  Records at the first call, every ``every_n_steps`` steps, at ``max_steps`` and on
``OutlierMonitor.record``, at most once per step; only global rank 0 writes (DDP and ``torch.compile`` wrappers are
looked through).  Resume: a first call at step S > 0 drops the history's rows at steps ≥ S and records S again; the
init LayerNorm snapshot is kept in ``<out_dir>/layernorm_initial.pt``; a fresh session (S = 0) removes an earlier
run's event files and histories from a reused folder.  docs/loop_monitors.md says it at length.
"""

from __future__ import annotations

import io
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from outlierlab.metrics.layernorm_rule import LayerNormRule
from outlierlab.metrics.word_order import order_use_message
from outlierlab.monitoring.history import HistoryCSV
from outlierlab.utils.atomic import write_atomic
from outlierlab.utils.dir_lock import DirLock, lock_dir

from . import arguments
from .hidden_state_tracker import HiddenStateTracker
from .layernorm_tracker import LayerNormTracker
from .recording import is_image_step, publish

__all__ = ["OutlierMonitor", "INITIAL_SNAPSHOT", "unwrap_model", "is_global_zero"]

#: The init snapshot of the LayerNorms, beside the history (read back on resume and by the post-hoc analysis).
INITIAL_SNAPSHOT = "layernorm_initial.pt"
#: The folder's writer lock: two monitors on one folder (two loops, two Trainers with one output_dir) would truncate
#: each other's history and write every later step twice.
LOCK_FILE = "monitor.lock"


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside DDP / ``DataParallel`` / ``torch.compile`` wrappers, a ``SentenceTransformer`` or a PEFT
    ``PeftModel``, whose own module names the family registry finds the norms and blocks by."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        elif callable(getattr(model, "get_base_model", None)) and model.get_base_model() is not model:
            # a PeftModel: the transformers model with the adapters in its linear layers (duck-typed: peft optional)
            model = model.get_base_model()
        elif isinstance(model, nn.Sequential) and len(model) and isinstance(getattr(model[0], "auto_model", None),
                                                                            nn.Module):
            # a SentenceTransformer's first module holds the Hugging Face model as ``auto_model`` (pooling after it
            # has no weights the monitors read); duck-typed, so sentence-transformers stays optional
            model = model[0].auto_model
        else:
            return model


def is_global_zero() -> bool:
    """Global rank 0, or no process group at all."""
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


class OutlierMonitor:
    """LayerNorm and hidden-state outlier monitors for a plain training loop (module docstring).

    Parameters
    ----------
    model : nn.Module, optional
        Given here, the held-out batch is tokenised at once (a bad tokenizer fails before training).
    tokenizer : a Hugging Face tokenizer
        The model's own; tokenises the held-out sentences.
    out_dir : str or Path
        Folder of the history CSVs, figures, init snapshot and (by default) TensorBoard events.
    every_n_steps : int
        Record every this many steps (besides the first call, ``max_steps`` and ``record``).
    sentences : sequence of str, optional
        Held-out texts (the first ``n_sequences``); default the shipped sentences the Lightning monitors and
        ``python -m outlierlab.jobs.posthoc`` use, so live and post-hoc numbers agree.
    image_every_n_steps : int
        Figures and per-dim vector rows at step multiples of this (and at the first and last record).
    vectors, figures : bool
        Write per-dim vector rows / render figures at image records.
    max_steps : int, optional
        The last step: recorded (with figures) even off the cadence.
    layernorm, hidden_states : bool
        Run the LayerNorm gain/bias monitor / the hidden-state monitor.
    rule : LayerNormRule or mapping, optional
        The LayerNorm-outlier rule (None: Kovaleva et al.'s default).
    ln_top_k, histograms, max_heatmap_rows
        ``LayerNormTracker``'s ``top_k``, ``histograms`` and ``max_heatmap_rows``.
    n_sequences, sentences_path, max_length, top_k, n_pairs, seed, sink_threshold
        ``HiddenStateTracker``'s settings (at least 2 sequences).
    order_use : bool
        Measure order use (nats) and attention locality at every record (docs/order_use.md); ``close`` says in one
        line when the last record is below ``ORDER_USE_THRESHOLD`` (a bag-of-words model).  Needs the LM head.
    writer : a SummaryWriter-like writer, None or False
        A writer of the caller's; None (default) a ``SummaryWriter`` in ``<out_dir>/tensorboard``; False none.
    global_zero : bool, optional
        Whether this process writes (default: global rank 0, or no process group).
    warn : callable
        How notices are shown (default ``warnings.warn``).
    """

    def __init__(self, model: nn.Module | None = None, tokenizer: Any = None, out_dir: str | Path = "monitor",
                 every_n_steps: int = 50, sentences: Sequence[str] | None = None, *, image_every_n_steps: int = 100,
                 vectors: bool = True, figures: bool = True, max_steps: int | None = None, layernorm: bool = True,
                 hidden_states: bool = True, rule: LayerNormRule | Mapping | None = None, ln_top_k: int = 3,
                 histograms: bool = True, max_heatmap_rows: int = 200, n_sequences: int = 32,
                 sentences_path: str | None = None, max_length: int | None = None, top_k: int = 5,
                 n_pairs: int = 1000, seed: int = 0, sink_threshold: float = 0.3, order_use: bool = True,
                 writer: Any = None,
                 global_zero: bool | None = None, warn: Callable[[str], Any] = warnings.warn) -> None:
        self.out_dir = Path(arguments.directory("out_dir", out_dir))
        self.every_n_steps = arguments.count("every_n_steps", every_n_steps, 1)
        self.image_every_n_steps = arguments.count("image_every_n_steps", image_every_n_steps, 1)
        self.vectors, self.figures = arguments.flag("vectors", vectors), arguments.flag("figures", figures)
        # <= 0 is "no last step" (Lightning's and the Trainer's max_steps=-1)
        max_steps = arguments.count("max_steps", max_steps, None, optional=True)
        self.max_steps = None if max_steps is None or max_steps <= 0 else max_steps
        self.tokenizer, self.sentences = arguments.tokenizer(tokenizer), arguments.texts("sentences", sentences)
        if writer is not None and writer is not False and not callable(getattr(writer, "add_scalar", None)):
            raise TypeError(f"writer must be a SummaryWriter-like object (add_scalar), None (own writer) or False "
                            f"(none), got {writer!r} ({type(writer).__name__})")
        if global_zero is not None:
            arguments.flag("global_zero", global_zero)
        if not callable(warn):
            raise TypeError(f"warn must be callable (e.g. warnings.warn or print), got {warn!r}")
        ln_settings = (rule, arguments.count("ln_top_k", ln_top_k, 1), histograms, max_heatmap_rows)
        hidden_settings = (n_sequences, sentences_path, max_length, top_k, n_pairs, seed, sink_threshold, order_use)
        # the settings of a monitor turned off are checked too: a typo stays a typo when it is switched on
        ln_tracker, hidden_tracker = LayerNormTracker(*ln_settings), HiddenStateTracker(*hidden_settings)
        self.layernorm = ln_tracker if arguments.flag("layernorm", layernorm) else None
        self.hidden = hidden_tracker if arguments.flag("hidden_states", hidden_states) else None
        self._writer_arg = writer
        self.writer: Any = None
        self._own_writer = False
        self._global_zero = global_zero
        self._warn = warn
        self.histories: dict[str, HistoryCSV] = {}
        self._lock: DirLock | None = None
        self.started = False
        self.last_step: int | None = None
        if model is not None and self.is_global_zero:
            self.check_model(model)
            if self.hidden is not None:
                self.hidden.tokenize(self.tokenizer, unwrap_model(model), self.sentences)

    def check_model(self, model: nn.Module) -> None:
        """That ``model`` has what the monitors that are on read -- its LayerNorms (a registered family, or ours),
        its blocks -- or one line naming what is missing, before anything is written to ``out_dir``."""
        from outlierlab.models.layernorms import model_layernorms
        from outlierlab.models.hook_points import site_table

        model = unwrap_model(model)
        if self.layernorm is not None:
            model_layernorms(model)
        if self.hidden is not None:
            site_table(getattr(model, "roberta", model))  # the sites of the body monitored_forward runs

    @property
    def is_global_zero(self) -> bool:
        return is_global_zero() if self._global_zero is None else bool(self._global_zero)

    @property
    def trackers(self) -> list:
        return [t for t in (self.layernorm, self.hidden) if t is not None]

    # -- state (for the caller's own checkpoints; the file beside the history does the same) -------------
    def state_dict(self) -> dict[str, Any]:
        return {"layernorm": self.layernorm.state_dict()} if self.layernorm is not None else {}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        if self.layernorm is not None and state_dict.get("layernorm"):
            self.layernorm.load_state_dict(state_dict["layernorm"])

    # -- session ---------------------------------------------------------------------------------------
    def start(self, model: nn.Module, step: int = 0) -> None:
        """Start the session at ``step`` (0: fresh, before any update; S > 0: resumed) and record it, after dropping
        rows at steps ≥ ``step``.  Called by the first ``step``; call it yourself to start before the loop."""
        step = arguments.step(step)
        if not self.is_global_zero:
            self.started = True
            return
        self.check_model(model)  # before the folder is locked or written: a model without the monitors' layers
        if self._lock is None:  # before anything in the folder is read or truncated
            self._lock = lock_dir(self.out_dir, LOCK_FILE, "monitor folder",
                                  "another monitor writes its history there: close() it (one monitor per run), "
                                  "or give this one another out_dir")
        self.started = True
        model = unwrap_model(model)
        resumed = step > 0
        snapshot = self.out_dir / INITIAL_SNAPSHOT
        if self.layernorm is not None:
            if resumed and not self.layernorm.initial_restored and snapshot.is_file():
                self.layernorm.load_state_dict(torch.load(snapshot, map_location="cpu", weights_only=True))
            for notice in self.layernorm.begin(model, resumed):
                self._warn(notice)
            if not resumed:
                self.out_dir.mkdir(parents=True, exist_ok=True)
                buf = io.BytesIO()
                torch.save(self.layernorm.state_dict(), buf)
                write_atomic(snapshot, buf.getvalue())
        if self.hidden is not None and self.hidden.batch is None:
            self.hidden.tokenize(self.tokenizer, model, self.sentences)
        if not resumed:
            # a fresh run in an earlier run's folder: a monitor that is off now must not leave files as if this run's
            for off, filename in ((self.layernorm is None, LayerNormTracker.filename),
                                  (self.hidden is None, HiddenStateTracker.filename)):
                if off:
                    (self.out_dir / filename).unlink(missing_ok=True)
            if self.layernorm is None:
                snapshot.unlink(missing_ok=True)
        for tracker in self.trackers:
            history = self.histories[tracker.filename] = HistoryCSV(self.out_dir / tracker.filename)
            history.truncate_after(step - 1)  # the abandoned timeline: every row at or after this step
            if resumed and tracker is self.layernorm and self.vectors:
                tracker.reload(history.path)
            elif resumed and tracker is self.hidden:
                tracker.reload(history.rows())
        # purge_step: TensorBoard drops a prior run's events at steps >= this one (after a fresh start: all of them)
        self._open_writer(step)
        self.last_step = None  # a new session records its start even where an earlier one stopped
        self.record(model, step, images=True)

    def _open_writer(self, purge_step: int) -> None:
        if self.writer is not None or self._writer_arg is False:
            return
        if self._writer_arg is not None:
            self.writer = self._writer_arg
            return
        from torch.utils.tensorboard import SummaryWriter  # lazy: tensorboard is only needed when a run writes

        folder = self.out_dir / "tensorboard"
        if purge_step == 0 and folder.is_dir():
            # a fresh session replaces the folder's events as it empties its histories: the restart marker alone
            # fails when both sessions open in the same second and the new file's name sorts first (its writer
            # counter compares as text, "10" before "9"), and TensorBoard then shows the old run after it
            for old in folder.glob("events.out.tfevents.*"):
                old.unlink()
        self.writer = SummaryWriter(log_dir=str(folder), purge_step=purge_step)
        self._own_writer = True

    def step(self, model: nn.Module, step: int) -> bool:
        """Record at the configured cadence; the first call starts the session.  Returns whether it recorded."""
        step = arguments.step(step)
        if not self.started:
            self.start(model, step)
            return self.is_global_zero
        if not self.is_global_zero or step == self.last_step:
            return False
        last = self.max_steps is not None and step >= self.max_steps
        if step % self.every_n_steps == 0 or last:
            self.record(model, step, images=last)
            return True
        return False

    def record(self, model: nn.Module, step: int, images: bool = False) -> None:
        """Record now, off the cadence (e.g. when a checkpoint is saved); ``images`` forces figures and vectors.
        A step already recorded is not recorded twice (a checkpoint on the cadence)."""
        step = arguments.step(step)
        if not self.is_global_zero:
            return
        if not self.started:
            self.start(model, step)
            return
        model = unwrap_model(model)
        if step == self.last_step:
            return
        self.last_step = step
        images = is_image_step(step, self.image_every_n_steps, images)
        writers = [self.writer] if self.writer is not None else []
        for tracker in self.trackers:
            # per-dim vectors only with the images: they are most of the rows
            rows, summary = tracker.compute(model, step, vectors=self.vectors and images)
            publish(tracker, step, rows, summary, history=self.histories[tracker.filename], writers=writers,
                    images=images, figures=self.figures, out_dir=self.out_dir)
        for w in writers:
            if callable(getattr(w, "flush", None)):
                w.flush()

    def close(self) -> None:
        """Say in one line when the last record's order use is below the threshold; close the TensorBoard writer
        this monitor opened (a caller's writer is left open)."""
        last = self.hidden.last_order_use if self.hidden is not None else None
        line = order_use_message(last) if last is not None and self.is_global_zero else None
        if line is not None:
            # tqdm.write: below a training loop's progress bar that is still drawn (the Trainer's), not on its line
            tqdm.write(f"[outlier monitor] step {self.last_step}: {line}", file=sys.stdout)
        if self._own_writer and self.writer is not None:
            self.writer.close()
        self.writer, self._own_writer = None, False
        if self._lock is not None:
            self._lock.release()
            self._lock = None
