"""Plain training-progress lines when stdout is not a terminal (``nohup``, a scheduler, CI).

``ProgressLines`` prints one line every ``every_n_steps`` optimizer steps, and one after each validation::

    [train] step 120/300 (40%) | loss 5.432 | 3,100 tok/s | elapsed 0:01:12 | ETA 0:01:48
    [train] step 100/300 validation | val/loss 5.310 | val/ppl 202.3 | val/order_use 0.001 | val/acc 0.12 | ...

On a terminal where the progress bar (``StepRichProgressBar``) draws it stays silent (``when: auto``).
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, TextIO

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, RichProgressBar

from outlierlab.monitoring import arguments
from outlierlab.utils.progress import eta_seconds, format_duration, is_terminal


def default_tokens(batch: Any) -> int:
    """Real tokens of a batch (``train/items_per_sec`` counts these): the attention mask's sum, else the ids' size."""
    if isinstance(batch, dict):
        if "attention_mask" in batch:
            return int(batch["attention_mask"].sum())
        if "input_ids" in batch:
            return int(batch["input_ids"].numel())
    return 0


class ProgressLines(Callback):
    """Print step/max, mean loss, tokens/s, elapsed time and ETA every ``every_n_steps`` steps (and the last).
    ``when``: ``auto`` (only without a terminal or progress bar), ``always`` or ``never``; ``length_fn``: ``batch ->
    tokens`` (rank 0's times the world size); ``stream``: default stdout, read at print time.  Rates count only this
    process's steps, so a resumed run's are not instantaneous."""

    def __init__(self, every_n_steps: int = 50, when: str = "auto", length_fn: Callable[[Any], int] | None = None,
                 stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic):
        if when not in ("auto", "always", "never"):
            raise ValueError(f"progress when must be auto, always or never, got {when!r}")
        self.every_n_steps, self.when = arguments.count("every_n_steps", every_n_steps, 1), when
        self.length_fn = length_fn or default_tokens
        self.stream, self.clock = stream, clock
        self.lines: list[str] = []
        self._active = False

    # -- state since this process started ----------------------------------------------------------------------------
    def _reset(self, trainer: L.Trainer) -> None:
        self.start_time = self.clock()
        self.start_step = trainer.global_step
        self.tokens = 0
        self.loss_sum, self.loss_n = 0.0, 0
        self.last_printed_step = -1

    def _wanted(self, trainer: L.Trainer) -> bool:
        if self.when == "never" or not trainer.is_global_zero:
            return False
        if self.when == "always":
            return True
        return not is_terminal(sys.stdout) or trainer.progress_bar_callback is None

    def _emit(self, line: str) -> None:
        self.lines.append(line)
        print(line, file=self.stream or sys.stdout, flush=True)

    # -- hooks --------------------------------------------------------------------------------------------
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._active = self._wanted(trainer)
        self._reset(trainer)
        if self._active:
            devices = trainer.num_devices * trainer.num_nodes
            self._emit(f"[train] starting at step {trainer.global_step}/{trainer.max_steps} on {devices} "
                       f"{trainer.accelerator.__class__.__name__.replace('Accelerator', '')} device(s), "
                       f"precision {trainer.precision}")

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self._active:
            return
        self.tokens += self.length_fn(batch) * trainer.world_size
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            self.loss_sum += float(loss.detach())
            self.loss_n += 1
        step = trainer.global_step
        last = trainer.max_steps > 0 and step >= trainer.max_steps
        if step != self.last_printed_step and step > self.start_step and (step % self.every_n_steps == 0 or last):
            self._emit(self.line(trainer))
            self.last_printed_step = step
            self.loss_sum, self.loss_n = 0.0, 0

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._active or trainer.sanity_checking:
            return
        vals = {k: float(v) for k, v in trainer.callback_metrics.items()
                if k.startswith("val") and isinstance(v, torch.Tensor) and v.numel() == 1}
        if vals:
            # the loss, perplexity and order use first (what a reader looks for), then the rest alphabetically
            first = [k for k in ("val/loss", "val/ppl", "val/order_use") if k in vals]
            keys = first + sorted(k for k in vals if k not in first)
            body = " | ".join(f"{k} {vals[k]:.4g}" for k in keys)
            self._emit(f"[train] step {trainer.global_step}/{trainer.max_steps} validation | {body}")

    # -- the line -----------------------------------------------------------------------------------------
    def line(self, trainer: L.Trainer) -> str:
        step, total = trainer.global_step, trainer.max_steps
        elapsed = self.clock() - self.start_time
        done = step - self.start_step
        pct = f" ({100 * step / total:.0f}%)" if total > 0 else ""
        loss = f"loss {self.loss_sum / self.loss_n:.4f}" if self.loss_n else "loss ?"
        rate = f"{self.tokens / elapsed:,.0f} tok/s" if elapsed > 0 else "? tok/s"
        eta = eta_seconds(done, total - self.start_step, elapsed) if total > 0 else None
        return (f"[train] step {step}/{total if total > 0 else '?'}{pct} | {loss} | {rate} | "
                f"elapsed {format_duration(elapsed)} | ETA {format_duration(eta)}")


class StepRichProgressBar(RichProgressBar):
    """Lightning's Rich progress bar without a negative epoch total.

    With ``max_epochs=-1`` Lightning 2.6's bar reads "Epoch 0/-2" (issue #21925, fixed by PR #21924 after 2.6.6);
    this one reads "Epoch 0".  Drop it once the lower bound of ``lightning`` has the fix.
    """

    def _get_train_description(self, current_epoch: int) -> str:
        max_epochs = self.trainer.max_epochs
        if max_epochs is None or max_epochs >= 0:
            return super()._get_train_description(current_epoch)
        text = f"Epoch {current_epoch}"  # padded to the validation bar's label, as Lightning pads it (no flicker)
        return f"{text:{len(self.validation_description)}}"
