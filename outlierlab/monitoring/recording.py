"""One record of a tracker, written the same way by every monitor: history rows, TensorBoard, figures.

A *tracker* (``LayerNormTracker``,
``HiddenStateTracker``) computes rows and a summary; this
module decides what a record writes so that the Lightning callbacks, the plain-loop monitor and the Hugging Face
Trainer callback cannot drift apart:

* the rows go to the tracker's history file (``<out_dir>/layernorm.csv`` / ``hidden_states.csv``,
  ``outlierlab.monitoring.history.HistoryCSV``: flushed and fsynced per record);
* the scalars go to every TensorBoard writer given;
* at image records the figures are rendered once, logged to every writer and saved as
  ``<out_dir>/<tag>.png`` (rendering costs more than the statistics, hence its own cadence);
* per-dim vector rows are written at image records only: they are most of the rows (2·d per LayerNorm,
  d per layer), so their cadence bounds the file size.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from outlierlab.monitoring import monitor_plots as plots
from outlierlab.monitoring.history import HistoryCSV

__all__ = ["is_image_step", "publish"]


def is_image_step(step: int, image_every_n_steps: int, forced: bool = False) -> bool:
    """Does this record draw figures and write per-dim vectors?  Step multiples of ``image_every_n_steps``
    and the records a monitor forces (its first and its last)."""
    return bool(forced) or step % int(image_every_n_steps) == 0


def publish(tracker: Any, step: int, rows: Sequence, summary: dict, *, history: HistoryCSV | None,
            writers: Sequence[Any] = (), images: bool = False, figures: bool = True,
            out_dir: str | Path | None = None) -> None:
    """Write one computed record of ``tracker``.

    Parameters
    ----------
    tracker : has ``log_to(writer, step, summary, images)`` and ``figures(step, summary)``.
    rows, summary : what ``tracker.compute`` returned for ``step``.
    history : the history file, or None (e.g. TensorBoard re-logging a step the history already holds).
    writers : TensorBoard ``SummaryWriter``-like objects (``add_scalar``, ``add_histogram``, ``add_image``).
    images : an image record (figures drawn when ``figures``).
    out_dir : where the figures' PNGs go (default: the history's folder).
    """
    if history is not None:
        history.append(rows)
    for w in writers:
        tracker.log_to(w, step, summary, images)
    if images and figures:
        folder = Path(out_dir) if out_dir is not None else (history.path.parent if history is not None else None)
        for name, fig in tracker.figures(step, summary).items():
            img = plots.render(fig)
            for w in writers:
                w.add_image(f"monitor/{name}", img, step, dataformats="HWC")
            if folder is not None:
                plots.save_png(img, folder / f"{name.replace('/', '_')}.png")
