"""Masked-language-model pretraining of :class:`RobertaMaskedLM` (Liu et al. 2019; Luo et al. 2021, Table 4)."""

from __future__ import annotations

import math
from typing import Any, Callable

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics.aggregation import MeanMetric

from outlierlab.models import EncoderConfig, RobertaMaskedLM


def batch_size_of(batch: dict[str, Tensor]) -> int:
    """Sequences in a batch (for Lightning's ThroughputMonitor)."""
    return int(batch["input_ids"].shape[0])


def tokens_in(batch: dict[str, Tensor]) -> int:
    """Real (non-padding) tokens in a batch: what ``train/items_per_sec`` counts."""
    return int(batch["attention_mask"].sum()) if "attention_mask" in batch else int(batch["input_ids"].numel())


WEIGHT_DECAY_SCOPES = ("all", "no_norm_bias")


def _is_norm(module: nn.Module) -> bool:
    """LayerNorm/RMSNorm-like modules, ours included (their class names end in ``Norm``)."""
    return isinstance(module, (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)) or type(module).__name__.endswith("Norm")


def weight_decay_groups(model: nn.Module, scope: str = "no_norm_bias") -> list[dict[str, Any]]:
    """Optimizer parameter groups that say which parameters get weight decay.

    Parameters
    ----------
    model : nn.Module
        The module whose trainable parameters are optimised.
    scope : {"all", "no_norm_bias"}
        ``"all"``: one group, decay on every parameter -- what fairseq does, and so what RoBERTa
        (Liu et al. 2019) and Luo et al. (2021), who pretrained with fairseq, used: fairseq's
        ``Trainer._build_optimizer`` hands the optimizer every ``requires_grad`` parameter in one list and
        ``FairseqAdam`` applies the decoupled decay ``p -= lr * wd * p`` to each, LayerNorm gains and
        biases included.  ``"no_norm_bias"``: no decay on biases and on normalisation gains/biases
        (the BERT / Hugging Face ``Trainer`` convention), nor on the OP block's trainable β.  Decay pulls LayerNorm gains towards 0, so the
        choice may change how the gain outliers of Kovaleva et al. (2021) emerge.

    Returns
    -------
    list of dict
        ``[{"params": decayed}, {"params": exempt, "weight_decay": 0.0}]``; the second group is absent
        for ``"all"``.  The decayed group takes the optimizer's own ``weight_decay``.
    """
    if scope not in WEIGHT_DECAY_SCOPES:
        raise ValueError(f"unknown module.weight_decay_scope {scope!r}; choose one of {', '.join(WEIGHT_DECAY_SCOPES)}")
    if scope == "all":
        return [{"params": [p for p in model.parameters() if p.requires_grad]}]
    decay, exempt = [], []
    for module in model.modules():
        norm = _is_norm(module)
        for name, p in module.named_parameters(recurse=False):
            if p.requires_grad:
                # *_beta: the OP block's branch scales (when trainable), gains like a norm's (He et al. exempt them)
                (exempt if norm or name == "bias" or name.endswith("_beta") else decay).append(p)
    return [{"params": decay}, {"params": exempt, "weight_decay": 0.0}]


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
        polynomial decay, ``outlierlab.models.schedules.warmup_polynomial_decay``).
    seed : int
        Dropout is re-seeded from ``(seed, global_step, rank)`` before every step, so a run
        resumed from a checkpoint draws exactly the dropout masks of an uninterrupted run.
    weight_decay_scope : {"no_norm_bias", "all"}
        Which parameters the optimizer's weight decay applies to (:func:`weight_decay_groups`);
        ``experiment=paper_roberta_base`` uses ``"all"`` as fairseq did.
    compile : bool or dict
        Run the training forward through ``torch.compile`` (a dict: its keyword arguments, e.g.
        ``{mode: max-autotune-no-cudagraphs}``).  Only the training step is compiled: validation and
        the monitors call the eager model, so their hooks and ``eval()`` never trigger a recompilation,
        and checkpoints keep the eager parameter names.  ``benchmarks/train_throughput.py --compare``
        measures the gain.
    """

    def __init__(
        self,
        model: EncoderConfig | dict,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., Any] | None = None,
        seed: int = 0,
        weight_decay_scope: str = "no_norm_bias",
        compile: bool | dict = False,
    ) -> None:
        super().__init__()
        config = model if isinstance(model, EncoderConfig) else EncoderConfig(**dict(model))
        # Plain dict in hparams: checkpoints stay readable and comparable across runs.
        if weight_decay_scope not in WEIGHT_DECAY_SCOPES:
            raise ValueError(f"unknown module.weight_decay_scope {weight_decay_scope!r}; "
                             f"choose one of {', '.join(WEIGHT_DECAY_SCOPES)}")
        self.save_hyperparameters({"model": config.to_dict(), "seed": seed})
        self.model = RobertaMaskedLM(config)
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.seed = seed
        self.weight_decay_scope = weight_decay_scope
        if not isinstance(compile, bool):  # Hydra hands a DictConfig
            compile = dict(compile)
        self.compile_options: dict | None = (compile if isinstance(compile, dict) else {}) if compile else None
        # A compiled *function* (not a module attribute): it shares the eager parameters, and the
        # state_dict gains no ``_orig_mod.`` copies.  Built lazily on the first training step.
        self._train_forward: Callable[..., Any] | None = None
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

    def _training_forward(self) -> Callable[..., Any]:
        if self.compile_options is None:
            return self.model
        if self._train_forward is None:
            self._train_forward = torch.compile(self.model.forward, **self.compile_options)
        return self._train_forward

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        loss = self._training_forward()(batch["input_ids"], batch.get("attention_mask"), batch.get("labels")).loss
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
        optimizer = self.optimizer_factory(weight_decay_groups(self.model, self.weight_decay_scope))
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
