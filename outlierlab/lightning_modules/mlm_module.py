"""Language-model pretraining of ``RobertaMaskedLM``: the masked objective (Liu et al. 2019; Luo et al. 2021,
Table 4) or, with ``model.causal`` (``objective=clm``), next-token prediction under a causal mask (Radford et al.
2019; Haviv et al. 2022) -- one module, so both objectives share optimizer, schedule, guards and monitors."""

from __future__ import annotations

from typing import Any, Callable

import lightning as L
import torch
from torch import Tensor, nn
from torchmetrics.aggregation import MeanMetric

from outlierlab.lightning_modules.loggers import TRAIN_ROW, ResumableCSVLogger
from outlierlab.metrics.word_order import attention_locality, movable_positions, permute_block_tokens
from outlierlab.models import EncoderConfig, RobertaMaskedLM
from outlierlab.models.optimizers import build_optimizer, can_fuse
from outlierlab.utils.flops import flops_per_token
from outlierlab.utils.tables import MODEL_STEP


def batch_size_of(batch: dict[str, Tensor]) -> int:
    """Sequences in a batch (for Lightning's ThroughputMonitor: configs/callbacks/default.yaml names it)."""
    return int(batch["input_ids"].shape[0])


def predicted_tokens(batch: dict[str, Tensor], causal: bool) -> int:
    """Tokens a batch's loss averages over: the masked ones (MLM), or every labelled one after the first."""
    if causal:
        return int((batch["labels"][:, 1:] != -100).sum())
    if "masked_positions" in batch:
        return int(batch["masked_positions"].numel())
    return int((batch["labels"] != -100).sum())


def predicted_accuracy(out, batch: dict[str, Tensor], causal: bool) -> Tensor:
    """Top-1 accuracy over the tokens the loss averages over (masked, or causal next tokens)."""
    labels = batch["labels"]
    if causal:
        targets = labels[:, 1:]
        keep = targets != -100
        return (out.logits.argmax(-1)[keep] == targets[keep]).float().mean()
    if out.masked_positions is not None:
        targets = labels.reshape(-1).index_select(0, out.masked_positions)
        return (out.logits.argmax(-1) == targets).float().mean()
    keep = labels != -100
    return (out.logits.argmax(-1)[keep] == labels[keep]).float().mean()


def prepare_mlm_batch(batch: dict[str, Tensor], causal: bool = False) -> dict[str, Tensor]:
    """Host-side batch preparation before the transfer: an all-ones ``attention_mask`` is dropped (SDPA's flash
    kernel), and ``masked_positions`` (flat indices of the labelled positions) spare the MLM head a device
    ``nonzero``; not for the causal objective."""
    batch = dict(batch)
    mask = batch.get("attention_mask")
    if mask is not None and bool(mask.all()):
        del batch["attention_mask"]
    labels = batch.get("labels")
    if labels is not None and not causal and "masked_positions" not in batch:
        batch["masked_positions"] = (labels.reshape(-1) != -100).nonzero().squeeze(1)
    return batch


WEIGHT_DECAY_SCOPES = ("all", "no_norm_bias")


def weight_decay_groups(model: nn.Module, scope: str = "no_norm_bias") -> list[dict[str, Any]]:
    """``[{"params": decayed}, {"params": exempt, "weight_decay": 0.0}]`` (the second absent for ``scope="all"``).

    ``"all"``: decay on every parameter, as fairseq (RoBERTa, Liu et al. 2019; Luo et al. 2021).  ``"no_norm_bias"``:
    none on biases, norm gains/biases and the OP block's β (the BERT / HF ``Trainer`` convention).  Decay pulls gains
    towards 0, so the choice may change how Kovaleva et al. (2021)'s gain outliers emerge.
    """
    if scope not in WEIGHT_DECAY_SCOPES:
        raise ValueError(f"unknown module.weight_decay_scope {scope!r}; choose one of {', '.join(WEIGHT_DECAY_SCOPES)}")
    if scope == "all":
        return [{"params": [p for p in model.parameters() if p.requires_grad]}]
    decay, exempt = [], []
    for module in model.modules():
        # LayerNorm/RMSNorm-like modules, ours included (their class names end in ``Norm``)
        norm = isinstance(module, (nn.LayerNorm, nn.RMSNorm, nn.GroupNorm)) or type(module).__name__.endswith("Norm")
        for name, p in module.named_parameters(recurse=False):
            if p.requires_grad:
                # *_beta: the OP block's branch scales (when trainable), gains like a norm's (He et al. exempt them)
                (exempt if norm or name == "bias" or name.endswith("_beta") else decay).append(p)
    return [{"params": decay}, {"params": exempt, "weight_decay": 0.0}]


class NonFiniteLossError(FloatingPointError):
    """Raised when the training loss becomes NaN/inf; the message names the step."""


class MLMLitModule(L.LightningModule):
    """Pretrains a RoBERTa encoder with the masked-LM objective, or a decoder of the same blocks with the causal-LM
    objective when ``model.causal`` is true (``objective=clm``).

    ``model``: an ``EncoderConfig`` or dict.  ``optimizer`` and ``scheduler`` are Hydra partials (paper: AdamW β =
    (0.9, 0.98), ε = 1e-6, weight decay 0.01, ``weight_decay_scope`` as ``weight_decay_groups``; linear warm-up then
    polynomial decay).  Dropout is re-seeded from ``(seed, global_step, rank)`` every step, so a resume is exact.
    ``order_use``: also log ``val/order_use`` and ``val/attn_local/*`` at every validation (fixed permutations).
    ``finite_check_every_n_steps``: how often an accelerator's non-finite-loss flag is read (always before a
    checkpoint).  ``compile``: ``torch.compile`` the training forward only.  ``fused_optimizer``: ``auto``, on CUDA
    unless fp16.  ``activation_checkpointing``: less memory for ~one more forward, the same gradients.
    """

    def __init__(
        self,
        model: EncoderConfig | dict,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., Any] | None = None,
        seed: int = 0,
        weight_decay_scope: str = "no_norm_bias",
        compile: bool | str | dict = False,
        finite_check_every_n_steps: int = 10,
        order_use: bool = True,
        fused_optimizer: bool | str = "auto",
        activation_checkpointing: bool = False,
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
        if compile not in (True, False, "auto") and not hasattr(compile, "keys"):
            raise ValueError(f"module.compile must be true, false, auto or a dict of torch.compile options, got {compile!r}")
        if fused_optimizer not in (True, False, "auto"):
            raise ValueError(f"module.fused_optimizer must be true, false or auto, got {fused_optimizer!r}")
        # "auto": decided on the first training step, by the device (CUDA only; no gain on CPU, docs/training_speed.md)
        self.compile_auto = compile == "auto"
        if not isinstance(compile, (bool, str)):  # Hydra hands a DictConfig
            compile = dict(compile)
        self.compile_options: dict | None = (compile if isinstance(compile, dict) else {}) if compile is True or \
            isinstance(compile, dict) else None
        self.fused_optimizer = fused_optimizer
        self.model.roberta.activation_checkpointing = bool(activation_checkpointing)
        # A compiled *function* (not a module attribute): it shares the eager parameters, and the
        # state_dict gains no ``_orig_mod.`` copies.  Built lazily on the first training step.
        self._train_forward: Callable[..., Any] | None = None
        # read by Lightning's ThroughputMonitor (FLOP/s, MFU), set per step: 6·N + 12·L·T·d
        self.flops_per_batch: int | None = None
        self.val_loss = MeanMetric()
        self.order_use = bool(order_use)
        self.val_loss_permuted = MeanMetric()
        self.val_accuracy = MeanMetric()  # top-1 on the predicted tokens (masked, or next)
        self._locality: dict[str, Tensor] | None = None
        if int(finite_check_every_n_steps) < 1:
            raise ValueError(f"module.finite_check_every_n_steps must be >= 1, got {finite_check_every_n_steps}")
        self.finite_check_every_n_steps = int(finite_check_every_n_steps)
        # Global step of the first non-finite training loss, -1 while none; on the device, not a buffer (not saved).
        self._first_nonfinite_step: Tensor | None = None
        self._defer_finite_check: bool | None = None  # None: decided by the device on the first step
        self._last_loss: Tensor | None = None  # this step's training loss, for the checkpoint (on_save_checkpoint)

    @property
    def config(self) -> EncoderConfig:
        return self.model.config

    def forward(self, **batch: Tensor):
        # input_ids alone positional: the model summary's "In sizes" then reads [B, T], not [[B, T], ?, ?]
        rest = {k: batch[k] for k in ("attention_mask", "labels", "masked_positions") if batch.get(k) is not None}
        return self.model(batch["input_ids"], **rest)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Still on the host: reading the mask and the labels here costs no device synchronisation.
        if isinstance(batch, dict) and "input_ids" in batch:
            return prepare_mlm_batch(batch, causal=self.config.causal)
        return batch

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # Lightning does not checkpoint the global RNG; a step-keyed seed makes resume exact.
        torch.manual_seed((self.seed * 1_000_003 + self.global_step * 7919 + self.global_rank) % 2**63)

    def _training_forward(self) -> Callable[..., Any]:
        if self.compile_auto:
            self.compile_auto = False
            self.compile_options = {} if self.device.type == "cuda" else None
        if self.compile_options is None:
            return self.model
        if self._train_forward is None:
            self._train_forward = torch.compile(self.model.forward, **self.compile_options)
        return self._train_forward

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        forward = self._training_forward()
        if forward is not self.model and batch.get("masked_positions") is not None:
            # the masked count changes every batch: a symbolic length from the start, not a recompile
            torch._dynamo.maybe_mark_dynamic(batch["masked_positions"], 0)
        loss = forward(batch["input_ids"], batch.get("attention_mask"), batch.get("labels"),
                       masked_positions=batch.get("masked_positions")).loss
        self._guard_finite(loss)
        ids = batch["input_ids"]
        # masked_positions' length is metadata: no device sync (the causal head projects every token)
        fraction = 1.0 if self.config.causal or batch.get("masked_positions") is None else \
            batch["masked_positions"].numel() / ids.numel()
        self.flops_per_batch = int(flops_per_token(self.config, ids.shape[1], fraction) * ids.numel())
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["input_ids"].shape[0])
        self._last_loss = loss.detach()
        return loss

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None) -> None:
        """Clip under bf16 with a fused optimizer, which Lightning's precision plugin refuses."""
        if gradient_clip_val and getattr(optimizer, "_step_supports_amp_scaling", False) and \
                not str(self.trainer.precision).startswith("16"):
            params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
            if (gradient_clip_algorithm or "norm") == "norm":
                torch.nn.utils.clip_grad_norm_(params, float(gradient_clip_val))
            else:
                torch.nn.utils.clip_grad_value_(params, float(gradient_clip_val))
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    # ------------------------------------------------------------------------------ non-finite loss guard
    def _nonfinite_error(self, step: int, value: str) -> NonFiniteLossError:
        return NonFiniteLossError(f"training loss became {value} at global step {step}; "
                                  "lower the learning rate or raise gradient clipping (trainer.gradient_clip_val)")

    def _guard_finite(self, loss: Tensor) -> None:
        """Stop at a NaN/inf loss: at once on CPU; on an accelerator read every few steps and before checkpoints."""
        if self._defer_finite_check is None:
            self._defer_finite_check = loss.device.type != "cpu"
        if not self._defer_finite_check:
            if not torch.isfinite(loss):
                raise self._nonfinite_error(self.global_step, str(loss.item()))
            return
        if self._first_nonfinite_step is None or self._first_nonfinite_step.device != loss.device:
            self._first_nonfinite_step = torch.full((), -1, dtype=torch.long, device=loss.device)
        first = self._first_nonfinite_step
        bad = ~torch.isfinite(loss.detach()) & (first < 0)
        self._first_nonfinite_step = torch.where(bad, torch.full_like(first, self.global_step), first)

    def _raise_if_nonfinite(self) -> None:
        if self._first_nonfinite_step is not None:
            step = int(self._first_nonfinite_step)  # the one host read
            if step >= 0:
                raise self._nonfinite_error(step, "NaN or inf")

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._defer_finite_check and (self.global_step % self.finite_check_every_n_steps == 0
                                         or self.global_step >= (self.trainer.max_steps or 0) > 0):
            self._raise_if_nonfinite()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._raise_if_nonfinite()  # never save weights updated from a non-finite loss as if they were good
        trainer = self.trainer
        # Lightning saves step S's checkpoint before it logs step S-1's row, which a resume never relogs: keep it here
        if trainer.training and self._last_loss is not None and trainer.log_every_n_steps and \
                self.global_step % trainer.log_every_n_steps == 0:
            checkpoint[TRAIN_ROW] = {"step": self.global_step - 1, "epoch": trainer.current_epoch,
                                     "train/loss": float(self._last_loss)}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if TRAIN_ROW in checkpoint and self._trainer is not None:
            for logger in self.trainer.loggers:
                if isinstance(logger, ResumableCSVLogger):
                    logger.experiment.restored_row = checkpoint[TRAIN_ROW]

    def on_train_end(self) -> None:
        self._raise_if_nonfinite()

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        n_predicted = predicted_tokens(batch, self.config.causal)
        if n_predicted == 0:
            return
        first = batch_idx == 0 and self.order_use
        out = self.model(batch["input_ids"], batch.get("attention_mask"), batch.get("labels"),
                         output_attentions=first, masked_positions=batch.get("masked_positions"))
        # Weighted by predicted-token count: the per-token mean over the split (synchronised across DDP ranks).
        self.val_loss.update(out.loss, n_predicted)
        self.val_accuracy.update(predicted_accuracy(out, batch, self.config.causal), n_predicted)
        if not self.order_use:
            return
        if first:
            self._locality = attention_locality(out.attentions, batch.get("attention_mask"), self.config.causal)
        self.val_loss_permuted.update(self.permuted_loss(batch, batch_idx), n_predicted)

    def permuted_loss(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """The loss with each block's tokens permuted (specials in place): order use's first term."""
        config = self.config
        movable = movable_positions(batch["input_ids"], batch.get("labels"), batch.get("attention_mask"),
                                    {config.bos_token_id, config.eos_token_id, config.pad_token_id})
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + batch_idx) % 2**63)
        shuffled = permute_block_tokens(batch, movable, generator)
        return self.model(shuffled["input_ids"], batch.get("attention_mask"), shuffled.get("labels")).loss

    def on_validation_epoch_end(self) -> None:
        if self.val_loss.update_count == 0:
            return
        loss = self.val_loss.compute()
        self.val_loss.reset()
        values = {"val/loss": loss, "val/ppl": torch.exp(loss.clamp(max=50.0)), "val/acc": self.val_accuracy.compute()}
        self.val_accuracy.reset()
        if self.order_use and self.val_loss_permuted.update_count:
            values["val/order_use"] = self.val_loss_permuted.compute() - loss
            self.val_loss_permuted.reset()
        if self._locality is not None:
            for i, mass in enumerate(self._locality["mass"]):
                values[f"val/attn_local/layer_{i}"] = mass.float()
            values["val/attn_local/uniform"] = self._locality["uniform"].float()
            self._locality = None
        self._log_validation(values)

    def _log_validation(self, values: dict[str, Tensor]) -> None:
        """The validation scalars at ``trainer.global_step`` (``self.log`` alone logs one below)."""
        from lightning.pytorch.loggers import CSVLogger

        for name, value in values.items():
            self.log(name, value, prog_bar=name in ("val/loss", "val/ppl", "val/order_use"), logger=False)
        if self.trainer.sanity_checking:  # as self.log: a sanity check's numbers are not logged
            return
        step = int(self.trainer.global_step)
        scalars = {name: float(value) for name, value in values.items()}  # synchronised across ranks (torchmetrics)
        for logger in self.loggers:  # rank 0 writes (each logger's log_metrics is rank-zero only)
            logger.log_metrics({**scalars, MODEL_STEP: step} if isinstance(logger, CSVLogger) else scalars, step=step)

    def _use_fused(self) -> bool:
        """Fused AdamW/Adam: where asked, else on CUDA unless fp16 (clipping would see scaled gradients)."""
        if not can_fuse(self.optimizer_factory):
            return False
        if self.fused_optimizer != "auto":
            return bool(self.fused_optimizer)
        precision = str(getattr(self.trainer, "precision", "")) if self._trainer is not None else ""
        return self.device.type == "cuda" and not precision.startswith("16")

    def configure_optimizers(self):
        groups = weight_decay_groups(self.model, self.weight_decay_scope)
        optimizer = build_optimizer(self.optimizer_factory, self.model, groups, fused=self._use_fused())
        if self.scheduler_factory is None:
            return optimizer
        scheduler = self.scheduler_factory(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
