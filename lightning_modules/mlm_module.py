"""Masked-language-model pretraining of :class:`RobertaMaskedLM` (Liu et al. 2019; Luo et al. 2021, Table 4)."""

from __future__ import annotations

import math
from typing import Any, Callable

import lightning as L
import torch
from torch import Tensor
from torchmetrics.aggregation import MeanMetric

from models import EncoderConfig, RobertaMaskedLM


def batch_size_of(batch: dict[str, Tensor]) -> int:
    """Sequences in a batch (for Lightning's ThroughputMonitor)."""
    return int(batch["input_ids"].shape[0])


def tokens_in(batch: dict[str, Tensor]) -> int:
    """Real (non-padding) tokens in a batch: what ``train/items_per_sec`` counts."""
    return int(batch["attention_mask"].sum()) if "attention_mask" in batch else int(batch["input_ids"].numel())


def no_decay(name: str) -> bool:
    """RoBERTa/BERT convention: no weight decay on biases and LayerNorm parameters."""
    return name.endswith(".bias") or "LayerNorm" in name or "layer_norm" in name


class NonFiniteLossError(FloatingPointError):
    """Raised when the training loss becomes NaN/inf; the message names the step."""


class MLMLitModule(L.LightningModule):
    """Pretrains a RoBERTa encoder with the masked-LM objective.

    Parameters
    ----------
    model : EncoderConfig or dict
        Architecture and position scheme (``configs/model`` + ``configs/pos``).
    optimizer : callable
        ``params -> Optimizer``, e.g. a Hydra ``_partial_`` of ``torch.optim.AdamW``
        (paper: β = (0.9, 0.98), ε = 1e-6, weight decay 0.01).
    scheduler : callable, optional
        ``optimizer -> LRScheduler`` stepped every optimizer step (paper: linear warm-up then
        polynomial decay, ``transformers.get_polynomial_decay_schedule_with_warmup``).
    seed : int
        Dropout is re-seeded from ``(seed, global_step, rank)`` before every step, so a run
        resumed from a checkpoint draws exactly the dropout masks of an uninterrupted run.
    """

    def __init__(
        self,
        model: EncoderConfig | dict,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., Any] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        config = model if isinstance(model, EncoderConfig) else EncoderConfig(**dict(model))
        # Plain dict in hparams: checkpoints stay readable and comparable across runs.
        self.save_hyperparameters({"model": config.to_dict(), "seed": seed})
        self.model = RobertaMaskedLM(config)
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.seed = seed
        n = sum(p.numel() for p in self.model.parameters())
        # Training FLOPs per token ≈ 6·N (Kaplan et al. 2020) + attention 12·L·T·d; ThroughputMonitor
        # reads ``flops_per_batch`` to report FLOP/s and MFU.
        self.flops_per_token = 6 * n + 12 * config.num_layers * config.max_len * config.hidden_size
        self.flops_per_batch: int | None = None
        self.val_loss = MeanMetric()

    @property
    def config(self) -> EncoderConfig:
        return self.model.config

    def forward(self, **batch: Tensor):
        return self.model(batch["input_ids"], batch.get("attention_mask"), batch.get("labels"))

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Lightning does not checkpoint the global RNG; a step-keyed seed makes resume exact.
        torch.manual_seed((self.seed * 1_000_003 + self.global_step * 7919 + self.global_rank) % 2**63)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self(**batch).loss
        if not torch.isfinite(loss):
            raise NonFiniteLossError(
                f"training loss became {loss.item()} at global step {self.global_step}; "
                "lower the learning rate or raise gradient clipping (trainer.gradient_clip_val)"
            )
        self.flops_per_batch = int(self.flops_per_token * batch["input_ids"].numel())
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        return loss

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        labels = batch["labels"]
        n_masked = (labels != -100).sum()
        if n_masked == 0:
            return
        loss = self(**batch).loss
        # Weighted by masked-token count: val/loss is the per-token mean over the whole split
        # (synchronised across DDP ranks by torchmetrics).
        self.val_loss.update(loss, n_masked)

    def on_validation_epoch_end(self) -> None:
        if self.val_loss.update_count == 0:
            return
        loss = self.val_loss.compute()
        self.val_loss.reset()
        self.log("val/loss", loss, prog_bar=True)
        self.log("val/ppl", torch.exp(loss.clamp(max=50.0)), prog_bar=True)

    def configure_optimizers(self):
        decay, plain = [], []
        for name, p in self.model.named_parameters():
            if p.requires_grad:
                (plain if no_decay(name) else decay).append(p)
        optimizer = self.optimizer_factory([{"params": decay}, {"params": plain, "weight_decay": 0.0}])
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
