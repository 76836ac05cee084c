"""Save the randomly initialised model as a step-0 checkpoint, so every post-hoc analysis has its baseline.

Zuo et al. (2025) find position readable from a causal model without positions *at initialisation*; telling learned
from present needs the untrained weights.  Writes ``<dirpath>/step0000000.ckpt`` once, when a run starts at step 0.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback


class InitialCheckpoint(Callback):
    """Write the step-0 checkpoint of a fresh run into ``dirpath``, named ``filename``."""

    def __init__(self, dirpath: str, filename: str = "step0000000.ckpt") -> None:
        self.path = Path(dirpath) / filename

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.global_step == 0 and not self.path.exists():
            # trainer.save_checkpoint: all ranks call it, rank 0 writes (through the trainer's CheckpointIO)
            trainer.save_checkpoint(str(self.path))
