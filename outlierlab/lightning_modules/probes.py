"""Linear probes trained on ALL layers at once (Luo, Kulmizev & Mao 2021, §3 and §4.4).

``BatchedLinear`` applies L independent linear maps ``[L, d, C]`` with one ``torch.bmm``; the loss is the SUM of
per-layer cross-entropies, so (Adam being element-wise) every layer trains as if alone, while the cached features are
read once per batch for all layers.

* ``PositionProbe`` — bias-free ``W ∈ R^{d×M}`` predicting each token's position (Luo §3); at test time it
  also accumulates the neuron contributions ``c_i = |w_{y,i} v_i|`` (``probe_contributions.contribution``).
* ``SentenceClassifier`` — ``W ∈ R^{d×N}`` on mean-pooled sentence vectors (Luo §4.4), with a bias by
  default or bias-free as the paper writes it (``probe.classifier_bias=false``).
"""

from __future__ import annotations

import math
from typing import Sequence

import lightning as L
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy

from outlierlab.metrics.probe_contributions import contribution


class BatchedLinear(nn.Module):
    """``L`` linear maps ``[L, B, d] -> [L, B, C]`` in one bmm; layer ``l`` initialised as alone, seeded."""

    def __init__(self, num_layers: int, in_dim: int, out_dim: int, bias: bool = True,
                 layer_ids: Sequence[int] | None = None, seed: int = 0):
        super().__init__()
        layer_ids = list(range(num_layers)) if layer_ids is None else list(layer_ids)
        if len(layer_ids) != num_layers:
            raise ValueError(f"layer_ids has {len(layer_ids)} entries for {num_layers} layers")
        bound = 1.0 / math.sqrt(in_dim)
        w = torch.empty(num_layers, in_dim, out_dim)
        for j, layer in enumerate(layer_ids):
            w[j].uniform_(-bound, bound, generator=torch.Generator().manual_seed(seed * 100_003 + layer))
        self.weight = nn.Parameter(w)
        self.bias = nn.Parameter(torch.zeros(num_layers, out_dim)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        out = torch.bmm(x, self.weight)
        return out if self.bias is None else out + self.bias[:, None, :]


class LayerwiseProbe(L.LightningModule):
    """Shared training/eval logic of the all-layers linear probes: ``num_classes`` M positions or N labels, Adam at
    ``lr`` (Luo et al.: 1e-3), ``layer_ids`` naming the scalars ``<prefix>/<tag>/layer_<i>/accuracy`` and seeds."""

    def __init__(self, num_layers: int, dim: int, num_classes: int, bias: bool, lr: float = 1e-3,
                 layer_ids: Sequence[int] | None = None, seed: int = 0, tag: str = "none", prefix: str = "probe"):
        super().__init__()
        self.save_hyperparameters()
        self.layer_ids = list(range(num_layers)) if layer_ids is None else list(layer_ids)
        self.probe = BatchedLinear(num_layers, dim, num_classes, bias, self.layer_ids, seed)
        acc = lambda: MulticlassAccuracy(num_classes=num_classes, average="micro")  # noqa: E731
        self.val_acc = nn.ModuleList(acc() for _ in range(num_layers))
        self.test_acc = nn.ModuleList(acc() for _ in range(num_layers))
        self.register_buffer("contrib_sum", torch.zeros(num_layers, dim, dtype=torch.float64), persistent=False)
        # per-class test accuracy: for the position probe, accuracy at each position (edges vs middle)
        self.register_buffer("class_correct", torch.zeros(num_layers, num_classes, dtype=torch.float64),
                             persistent=False)
        self.register_buffer("class_count", torch.zeros(num_classes, dtype=torch.float64), persistent=False)
        # sum of |predicted - true| class index per layer: for ordinal classes (positions) the mean absolute
        # position error, which Haviv et al. (2022) report beside accuracy (an off-by-one guess is not chance)
        self.register_buffer("abs_error_sum", torch.zeros(num_layers, dtype=torch.float64), persistent=False)
        self.n_contrib = 0
        self.results: dict = {}

    def forward(self, x: Tensor) -> Tensor:
        return self.probe(x)

    def _loss(self, logits: Tensor, y: Tensor) -> Tensor:
        n_layers, b, c = logits.shape
        per_token = F.cross_entropy(logits.reshape(-1, c), y.repeat(n_layers), reduction="none")
        return per_token.view(n_layers, b).mean(1).sum()  # sum over layers: independent gradients

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self._loss(self(x), y)
        self.log(f"{self.hparams.prefix}/{self.hparams.tag}/train_loss", loss / x.shape[0],
                 on_step=True, on_epoch=False, batch_size=len(y))
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        pred = self(x).argmax(-1)
        for j, metric in enumerate(self.val_acc):
            metric.update(pred[j], y)

    def on_validation_epoch_end(self):
        for j, metric in enumerate(self.val_acc):
            self.log(f"{self.hparams.prefix}/{self.hparams.tag}/layer_{self.layer_ids[j]}/val_accuracy",
                     metric.compute())
            self.results.setdefault("val_accuracy", {})[self.layer_ids[j]] = float(metric.compute())
            metric.reset()

    def test_step(self, batch, batch_idx):
        x, y = batch
        pred = self(x).argmax(-1)
        for j, metric in enumerate(self.test_acc):
            metric.update(pred[j], y)
        self.contrib_sum += contribution(self.probe.weight.detach(), x, y, reduction="sum").double()
        self.n_contrib += len(y)
        self.class_count += torch.bincount(y, minlength=self.class_count.numel()).double()
        self.class_correct.index_add_(1, y, (pred == y).double())
        self.abs_error_sum += (pred - y).abs().double().sum(1)

    def on_test_epoch_end(self):
        accs = []
        for j, metric in enumerate(self.test_acc):
            a = metric.compute()
            self.log(f"{self.hparams.prefix}/{self.hparams.tag}/layer_{self.layer_ids[j]}/accuracy", a)
            accs.append(float(a))
            metric.reset()
        self.results.update(accuracy=dict(zip(self.layer_ids, accs)),
                            contribution=(self.contrib_sum / max(self.n_contrib, 1)).float().cpu(),
                            per_class_count=self.class_count.cpu().clone(),
                            per_class_accuracy=(self.class_correct / self.class_count.clamp(min=1)).float().cpu(),
                            mean_abs_error=dict(zip(self.layer_ids, (self.abs_error_sum / max(self.n_contrib, 1)).tolist())))
        self.abs_error_sum.zero_()
        self.contrib_sum.zero_()
        self.class_correct.zero_()
        self.class_count.zero_()
        self.n_contrib = 0

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


class PositionProbe(LayerwiseProbe):
    """Luo et al. 2021 §3: bias-free linear map to one of ``num_positions`` (M, paper 300) positions."""

    def __init__(self, num_layers: int, dim: int, num_positions: int = 300, lr: float = 1e-3,
                 layer_ids: Sequence[int] | None = None, seed: int = 0, tag: str = "none", prefix: str = "probe"):
        super().__init__(num_layers, dim, num_positions, False, lr, layer_ids, seed, tag, prefix)


class SentenceClassifier(LayerwiseProbe):
    """Luo et al. 2021 §4.4: linear classifier on mean-pooled sentence vectors, per layer; ``bias=False`` is the
    paper's ``W ∈ R^{d×N}`` (no learned offset to compensate a transform)."""

    def __init__(self, num_layers: int, dim: int, num_classes: int, lr: float = 1e-3,
                 layer_ids: Sequence[int] | None = None, seed: int = 0, tag: str = "none", prefix: str = "probe",
                 bias: bool = True):
        super().__init__(num_layers, dim, num_classes, bool(bias), lr, layer_ids, seed, tag, prefix)


def train_probe(module: LayerwiseProbe, train_loader, val_loader, test_loader, epochs: int = 10,
                logger=None, accelerator: str = "auto", progress: bool = False, validate: bool = True) -> dict:
    """Fit ``module`` for ``epochs`` with a Lightning Trainer, test it, return ``module.results``: ``accuracy`` {layer:
    test acc}, ``val_accuracy`` (if ``validate``) and ``contribution`` [L', d], mean |w_{y,i} v_i|."""
    trainer = L.Trainer(max_epochs=epochs, accelerator=accelerator, devices=1, logger=logger or False,
                        enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=progress,
                        num_sanity_val_steps=0, log_every_n_steps=50,
                        limit_val_batches=None if validate and val_loader is not None else 0)
    trainer.fit(module, train_loader, val_loader if validate else None)
    trainer.test(module, test_loader, verbose=False)
    return module.results
