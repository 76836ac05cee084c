"""How many times a run loops over its training data ("epochs over data"), known before it starts.

Looping many times over a small corpus is a memorisation regime: Luo et al. (2021) pretrained RoBERTa-base
for 200k steps of 256 x 512 tokens over Wikipedia (~7 passes over their data), and Gu et al. (2025, "When
Attention Sink Emerges in Language Models") saw no attention sinks with <= 100M training tokens.  Every
``train.py`` run therefore logs these figures at start and warns above ``data_epochs_warning``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class DataBudget:
    """Training data seen by one run: ``train_blocks``/``train_tokens`` (blocks and real tokens in one epoch of the
    training split), ``blocks_per_step`` (batch size x devices x accumulation) and ``steps``."""

    train_blocks: int
    train_tokens: int
    blocks_per_step: int
    steps: int

    @property
    def epochs(self) -> float:
        """Passes over the training split (the final partial batch of an epoch is ignored)."""
        return self.steps * self.blocks_per_step / self.train_blocks

    @property
    def total_tokens(self) -> int:
        """Real tokens the run trains on: epochs x tokens per epoch."""
        return int(round(self.epochs * self.train_tokens))

    def summary(self) -> str:
        return (f"training data: {self.train_tokens:,} tokens per epoch ({self.train_blocks:,} blocks); this run: "
                f"{self.steps:,} steps x {self.blocks_per_step:,} blocks = {_human(self.total_tokens)} tokens "
                f"= {self.epochs:.2f} epochs over the data")


def data_budget(train_blocks: int, train_tokens: int, batch_size: int, world_size: int = 1, accumulate: int = 1,
                max_steps: int = -1, max_epochs: int | None = None) -> DataBudget:
    """The ``DataBudget`` of a run with Lightning's ``max_steps``/``max_epochs`` semantics.

    ``max_steps > 0`` bounds the optimizer steps; ``max_epochs`` (when not None/-1) bounds them too, at
    ``ceil(blocks per device / batch_size) / accumulate`` steps per epoch; the run stops at the first bound.
    """
    if train_blocks < 1 or batch_size < 1 or world_size < 1 or accumulate < 1:
        raise ValueError(f"data_budget needs positive counts, got train_blocks={train_blocks}, "
                         f"batch_size={batch_size}, world_size={world_size}, accumulate={accumulate}")
    per_epoch = math.ceil(math.ceil(train_blocks / world_size) / batch_size) // accumulate
    bounds = []
    if max_steps is not None and max_steps > 0:
        bounds.append(int(max_steps))
    if max_epochs is not None and max_epochs > 0:
        bounds.append(int(max_epochs) * max(per_epoch, 1))
    if not bounds:
        raise ValueError("the run has no end: set trainer.max_steps or trainer.max_epochs")
    return DataBudget(train_blocks, train_tokens, batch_size * world_size * accumulate, min(bounds))


def _human(n: float) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(int(n))
