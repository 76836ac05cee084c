"""Watch activation outlier dimensions emerge during pretraining, on a fixed held-out batch (Luo et al. 2021 §2).

A thin Lightning adapter over ``outlierlab.monitoring.hidden_state_tracker.HiddenStateTracker``, the object
the plain-loop and Hugging Face Trainer monitors drive too; only the choice of the held-out batch is Lightning's.
At every record (see ``lightning_monitor``) the model runs once in eval mode under ``torch.inference_mode()`` on
the *same* held-out sequences (``outlierlab.models.sites.monitored_forward``), and
``outlierlab.metrics.monitor_records.hidden_state_records`` computes the per-layer statistics (listed there:
Luo et al.'s argmax/argmin shares, anisotropy, rogue dims, IsoScore, kurtosis, max/median, inf-norms, sink heads
and attention entropy).  Special tokens and padding are left out of the activation statistics.  Train mode is
restored afterwards, module by module.

Outputs: ``<out_dir>/hidden_states.csv`` (``step,name,statistic,dim,value``; names ``layer_{i}``, i = 0 the
embedding output, and ``model``; the per-dim ``mean`` rows only at image records), ``<out_dir>/hidden_metrics.png``
and ``<out_dir>/hidden_mean_vectors.png`` (Luo et al. Figs. 1–2), and TensorBoard scalars
``monitor/hidden/layer_{i}/<statistic>``, ``monitor/inf_norm/<site>/layer_{i}``, ``monitor/hidden/model/...``
and image ``monitor/hidden/mean_vectors``.

Held-out batch (``source``):

- ``"sentences"`` (default): the first ``n_sequences`` shipped held-out sentences
  (``outlierlab.datamodules.eval_data.load_sentences``, Austen's *Persuasion*, not in the training corpus),
  tokenised with ``trainer.datamodule.tokenizer``: the batch ``outlierlab.jobs.posthoc`` uses, so live and
  post-hoc numbers agree.
- ``"val"``: the first ``n_sequences`` validation blocks of ``trainer.datamodule`` (unmasked; ``heldout_from_val``).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import Tensor
from transformers import AutoTokenizer

from outlierlab.monitoring.hidden_state_tracker import HiddenStateTracker

from .lightning_monitor import LightningOutlierMonitor


SOURCES = ("sentences", "val")


def heldout_from_val(datamodule: Any, n_sequences: int, special_ids: set[int]) -> dict[str, Tensor]:
    """The first ``n_sequences`` validation sequences, unmasked.

    Read from ``datamodule.val_dataset`` (items with unmasked ``input_ids``/``attention_mask``, as
    ``outlierlab.datamodules.mlm_datamodule.MLMDataModule`` has) when present; otherwise from the first
    batches of ``val_dataloader()``, undoing the MLM masking (``labels != -100`` hold the original ids).
    """
    ids, masks = [], []
    ds = getattr(datamodule, "val_dataset", None)
    if ds is not None and len(ds) > 0 and isinstance(ds[0], dict) and "input_ids" in ds[0]:
        for i in range(min(n_sequences, len(ds))):
            item = ds[i]
            x = torch.as_tensor(item["input_ids"])
            ids.append(x[None])
            masks.append(torch.as_tensor(item.get("attention_mask", torch.ones_like(x)))[None])
    else:
        for batch in datamodule.val_dataloader():
            x = batch["input_ids"]
            if "labels" in batch:
                x = torch.where(batch["labels"] != -100, batch["labels"], x)
            ids.append(x)
            masks.append(batch.get("attention_mask", torch.ones_like(x)))
            if sum(len(t) for t in ids) >= n_sequences:
                break
    if not ids:
        raise ValueError("HiddenStateMonitor(source='val'): the datamodule has no validation sequences")
    width = max(t.shape[1] for t in ids)
    ids = torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in ids])[:n_sequences]
    masks = torch.cat([torch.nn.functional.pad(t, (0, width - t.shape[1])) for t in masks])[:n_sequences]
    special = torch.isin(ids, torch.tensor(sorted(special_ids), dtype=ids.dtype))
    return {"input_ids": ids, "attention_mask": masks, "special_tokens_mask": special.long()}


class HiddenStateMonitor(LightningOutlierMonitor):
    """Per-layer activation outlier statistics on a fixed held-out batch.

    ``out_dir``, ``every_n_steps``, ``image_every_n_steps``, ``vectors`` (the whole ``mean`` vector of every layer):
    ``LightningOutlierMonitor``.  ``n_sequences`` held-out sequences (small: one forward pass per record) from
    ``source`` (module docstring); ``sentences_path``: another gzip sentences file for ``source="sentences"``;
    ``tokenizer``: a tokenizer directory when the datamodule has none; ``max_length``: truncation in tokens (default:
    the model's ``max_len``); ``top_k``: dims of largest |mean| written per layer.  ``n_pairs`` cross-sentence token
    pairs (with replacement, seeded by ``seed``) give the anisotropy and its jackknife ``anisotropy_se``;
    ``anisotropy_one_per_sentence`` keeps the evaluation protocol (n/2 pairs: 16 on the default batch, too few to
    contrast runs).  ``sink_threshold``: Gu et al. (2025)'s ε for a sink head.  ``w8a8``: also record what 8 bits
    cost on the batch (``monitor/w8a8/loss_delta`` and ``keep_loss_delta``: the LM loss change with the blocks'
    linear layers in W8A8, without and with 4 outlier dims kept in full precision; ``outlierlab.models.w8a8``).
    """

    filename = HiddenStateTracker.filename

    def __init__(self, out_dir: str | None = None, every_n_steps: int = 50, image_every_n_steps: int = 100,
                 n_sequences: int = 32, source: str = "sentences", sentences_path: str | None = None,
                 tokenizer: str | None = None, max_length: int | None = None, top_k: int = 5,
                 n_pairs: int = 1000, seed: int = 0, vectors: bool = True, sink_threshold: float = 0.3,
                 w8a8: bool = True) -> None:
        super().__init__(out_dir, every_n_steps, image_every_n_steps, vectors)
        if source not in SOURCES:
            raise ValueError(f"HiddenStateMonitor source must be one of {', '.join(SOURCES)}, got {source!r}")
        self.tracker = HiddenStateTracker(n_sequences, sentences_path, max_length, top_k, n_pairs, seed,
                                          sink_threshold, w8a8=w8a8)
        self.source, self.tokenizer_path = source, tokenizer

    def _tokenizer(self, trainer: L.Trainer):
        tok = getattr(trainer.datamodule, "tokenizer", None) if trainer.datamodule is not None else None
        if tok is None and self.tokenizer_path:
            tok = AutoTokenizer.from_pretrained(self.tokenizer_path, local_files_only=True)
        return tok

    def prepare(self, trainer: L.Trainer, pl_module: L.LightningModule, resumed: bool) -> None:
        if not trainer.is_global_zero:
            return
        model = getattr(pl_module, "model", pl_module)
        config = getattr(model, "config", None)
        tok = self._tokenizer(trainer)
        if self.source == "sentences":
            if tok is None:
                raise ValueError("HiddenStateMonitor(source='sentences') needs a tokenizer: the datamodule has no "
                                 "`tokenizer` attribute; set callbacks.hidden_state_monitor.tokenizer=<dir> or "
                                 "source=val")
            self.tracker.tokenize(tok, model)
        else:
            if trainer.datamodule is None:
                raise ValueError("HiddenStateMonitor(source='val') needs a datamodule with val_dataloader()")
            special = set(getattr(tok, "all_special_ids", None) or
                          [getattr(config, a) for a in ("bos_token_id", "eos_token_id", "pad_token_id")
                           if getattr(config, a, None) is not None])
            self.tracker.batch = heldout_from_val(trainer.datamodule, self.tracker.n_sequences, special)

    def compute(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, vectors: bool = True
                ) -> tuple[list, dict]:
        return self.tracker.compute(getattr(pl_module, "model", pl_module), step, vectors, device=pl_module.device)

    def after_resume(self, step: int) -> None:
        self.tracker.reload(self.history.rows())
