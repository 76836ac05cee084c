"""One record of a tracker, written the same way by every monitor: history rows, TensorBoard, figures.

A *tracker* (``LayerNormTracker``, ``HiddenStateTracker``) computes rows and a summary; this module decides what a
record writes, so the Lightning callbacks, the loop monitor and the HF callback cannot drift apart: rows to the history
file (``HistoryCSV``, fsynced per record), scalars to every TensorBoard writer, and at image records only the figures
(``<out_dir>/<tag>.png``, rendered once) and the per-dim vector rows (most of the rows).
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
    """Write one computed record of ``tracker`` (``rows, summary`` from ``tracker.compute`` at ``step``) to ``history``
    (None: e.g. re-logging a step it holds) and ``writers``; ``images``: an image record; ``out_dir``: the PNGs' folder
    (default: the history's)."""
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
