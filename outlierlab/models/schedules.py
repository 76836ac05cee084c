"""Learning-rate schedule of RoBERTa pretraining: linear warm-up, then polynomial decay (plain torch).

Liu et al. (2019) and Luo, Kulmizev & Mao (2021, Table 4) warm up linearly over ``num_warmup_steps`` and decay
polynomially (power 1 = linear, fairseq's recipe) to ``lr_end`` at ``num_training_steps``.
``transformers.get_polynomial_decay_schedule_with_warmup`` gives the same curve but divides by zero when
``trainer.max_steps`` equals the warm-up; here the peak is then **held** after the warm-up.
"""

from __future__ import annotations

import torch
from torch.optim.lr_scheduler import LambdaLR


def warmup_polynomial_factor(step: int, num_warmup_steps: int, num_training_steps: int, lr_init: float,
                             lr_end: float = 0.0, power: float = 1.0) -> float:
    """Multiplier of the peak learning rate ``lr_init`` at optimizer step ``step`` (0-based).

    * ``step < num_warmup_steps``: ``step / num_warmup_steps`` (linear warm-up from 0, as transformers);
    * no decay steps (``num_training_steps <= num_warmup_steps``): 1, the peak is held;
    * ``step >= num_training_steps``: ``lr_end / lr_init``;
    * otherwise ``((lr_init - lr_end) * (1 - (step - W) / (T - W)) ** power + lr_end) / lr_init``.
    """
    if lr_init <= 0:  # lr 0: every factor gives 0; avoid dividing by it below
        return 1.0
    if step < num_warmup_steps:
        return step / max(1, num_warmup_steps)
    decay_steps = num_training_steps - num_warmup_steps
    if decay_steps <= 0:
        return 1.0
    if step >= num_training_steps:
        return lr_end / lr_init
    remaining = 1.0 - (step - num_warmup_steps) / decay_steps
    return ((lr_init - lr_end) * remaining**power + lr_end) / lr_init


def warmup_polynomial_decay(optimizer: torch.optim.Optimizer, num_warmup_steps: int, num_training_steps: int,
                            lr_end: float = 0.0, power: float = 1.0, last_epoch: int = -1) -> LambdaLR:
    """Linear warm-up then polynomial decay to ``lr_end`` (Liu et al. 2019; Luo et al. 2021, Table 4).

    As ``transformers.get_polynomial_decay_schedule_with_warmup``, except that ``num_training_steps <=
    num_warmup_steps`` holds the peak.  The peak is the optimizer's ``lr`` (``initial_lr`` on resume); the decay reaches
    ``lr_end`` (≤ peak) at ``num_training_steps`` (``trainer.max_steps``); ``power`` 1 = linear.  ValueError for a
    negative warm-up, non-positive training steps, or ``lr_end`` above the peak.
    """
    if num_warmup_steps < 0:
        raise ValueError(f"num_warmup_steps must be >= 0, got {num_warmup_steps}")
    if num_training_steps < 1:
        raise ValueError(f"num_training_steps must be >= 1 (trainer.max_steps), got {num_training_steps}")
    group = optimizer.param_groups[0]
    lr_init = float(group.get("initial_lr", group["lr"]))
    if lr_end > lr_init:
        raise ValueError(f"lr_end ({lr_end}) must not exceed the peak learning rate ({lr_init})")

    # A closure, not an object: LambdaLR checkpoints the __dict__ of callable objects, which would pin a
    # resumed run to the old max_steps; with a function the current config decides the curve.
    def factor(step: int) -> float:
        return warmup_polynomial_factor(step, num_warmup_steps, num_training_steps, lr_init, lr_end, power)

    return LambdaLR(optimizer, factor, last_epoch)
