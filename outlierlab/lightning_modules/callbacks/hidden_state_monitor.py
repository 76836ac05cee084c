"""Watch activation outlier dimensions emerge during pretraining, on a fixed held-out batch (Luo et al. 2021 §2).

At every record (step 0 before any update, every ``every_n_steps``, at checkpoints and at the end; see
:mod:`.base`) the model runs in eval mode under ``torch.inference_mode()`` on the *same* held-out
sequences (one forward pass, :func:`outlierlab.models.sites.monitored_forward`), and
:func:`outlierlab.analysis.monitoring.hidden_state_records` computes per layer the mean token vector, the share of
tokens whose argmax/argmin falls on the most common dim (Luo et al. 2021 §2; their 96.60% on dim 557 of
BERT-base is a pooled *argmin* share, also written), the dims with the largest |mean|, anisotropy from
1,000 cross-sentence token pairs with its jackknife standard error (Ethayarajh 2019) with the top-1/top-3 dims' share of it (Timkey & van Schijndel 2021)
and IsoScore (Rudman et al. 2022), activation kurtosis and max/median ratio (He et al. 2024; Sun et
al. 2024), the inf-norm at the FFN output and around the output LayerNorm (Bondarenko et al. 2023), and
sink-head shares and attention entropy (Gu et al. 2025).  Special tokens and padding are left out of the
activation statistics (the inf-norm and the attention queries keep special tokens, see
:mod:`outlierlab.models.sites`).  Train mode is restored afterwards, module by module.

Outputs: ``<out_dir>/hidden_states.csv`` (``step,name,statistic,dim,value``; names ``layer_{i}``,
i = 0 the embedding output, and ``model``; statistics listed in
:func:`outlierlab.analysis.monitoring.hidden_state_records`; the per-dim ``mean`` rows only at image records),
``<out_dir>/hidden_metrics.png`` (curves vs step per layer, at image records), and in TensorBoard:

- scalars ``monitor/hidden/layer_{i}/argmax_share``, ``…/argmin_share``, ``…/argmax_dim``,
  ``…/argmin_dim``, ``…/anisotropy``, ``…/max_abs_mean``, ``…/n_outlier_dims``, ``…/kurtosis``,
  ``…/max_median``, ``…/max_abs``, ``…/abs_argmax_share``, ``…/token_pair_cosine``, ``…/rogue_top1_share``,
  ``…/rogue_top3_share``, ``…/isoscore``,
  ``…/sink_share_bos``, ``…/sink_share_eos``, ``…/attn_entropy``, ``…/attn_row_mass``; ``monitor/inf_norm/<site>/layer_{i}``
  (site = ``ffn_output``, ``ln_input``, ``ln_output``); ``monitor/hidden/model/pooled_argmin_share``
  and ``…/pooled_argmax_share``;
- image ``monitor/hidden/mean_vectors`` (average vector of every layer, Luo et al. Figs. 1–2), also
  saved as ``<out_dir>/hidden_mean_vectors.png``.

Held-out batch (``source``):

- ``"sentences"`` (default): the first ``n_sequences`` shipped held-out sentences
  (:func:`outlierlab.datamodules.eval_data.load_sentences`, Austen's *Persuasion*, not in the training corpus),
  tokenised with ``trainer.datamodule.tokenizer``.  Same text for every run and position scheme, and the
  same batch :mod:`outlierlab.jobs.posthoc` uses, so live and post-hoc numbers agree.
- ``"val"``: the first ``n_sequences`` validation blocks of ``trainer.datamodule`` (in-distribution text,
  unmasked; see :func:`heldout_from_val`).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import Tensor
from transformers import AutoTokenizer

from outlierlab.analysis.monitoring import hidden_state_records, tokenize_heldout
from outlierlab.datamodules.eval_data import load_sentences
from outlierlab.models.sites import monitored_forward

from outlierlab.reports import monitor_plots as plots
from .base import OutlierMonitor, as_numpy


SOURCES = ("sentences", "val")


def heldout_from_val(datamodule: Any, n_sequences: int, special_ids: set[int]) -> dict[str, Tensor]:
    """The first ``n_sequences`` validation sequences, unmasked.

    Read from ``datamodule.val_dataset`` (items with unmasked ``input_ids``/``attention_mask``, as
    :class:`outlierlab.datamodules.mlm_datamodule.MLMDataModule` has) when present; otherwise from the first
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


class HiddenStateMonitor(OutlierMonitor):
    """Per-layer activation outlier statistics on a fixed held-out batch.

    Parameters
    ----------
    out_dir, every_n_steps, image_every_n_steps, vectors
        See :class:`.base.OutlierMonitor` (``vectors``: write the whole ``mean`` vector of every layer).
    n_sequences : int
        Held-out sequences (small: one forward pass of this batch per record).
    source : {"sentences", "val"}
        Where the held-out batch comes from (module docstring).
    sentences_path : str, optional
        Other sentences file for ``source="sentences"`` (gzip text, one per line).
    tokenizer : str, optional
        Tokenizer directory to use when the datamodule has no ``tokenizer`` attribute.
    max_length : int, optional
        Truncation length in tokens (default: the model's ``max_len``).
    top_k : int
        Dims with the largest |mean| written per layer.
    n_pairs, seed : int
        Cross-sentence token pairs of the anisotropy (with replacement; default 1,000, issue 37) and their
        seed; its standard error (``anisotropy_se``, a delete-one-sentence jackknife) is written beside it.
        ``anisotropy_one_per_sentence`` keeps the evaluation protocol (one token of each of the
        ``n_sequences`` sentences, n/2 pairs: 16 on the default batch, too few to contrast runs).
    sink_threshold : float
        Gu et al. (2025)'s ε for a sink head (mean attention on the token above it).
    """

    filename = "hidden_states.csv"

    def __init__(self, out_dir: str | None = None, every_n_steps: int = 50, image_every_n_steps: int = 100,
                 n_sequences: int = 32, source: str = "sentences", sentences_path: str | None = None,
                 tokenizer: str | None = None, max_length: int | None = None, top_k: int = 5,
                 n_pairs: int = 1000, seed: int = 0, vectors: bool = True, sink_threshold: float = 0.3) -> None:
        super().__init__(out_dir, every_n_steps, image_every_n_steps, vectors)
        if source not in SOURCES:
            raise ValueError(f"HiddenStateMonitor source must be one of {', '.join(SOURCES)}, got {source!r}")
        if int(n_sequences) < 2:
            raise ValueError(f"n_sequences must be >= 2 (anisotropy pairs tokens of different sequences), "
                             f"got {n_sequences}")
        self.n_sequences, self.source = int(n_sequences), source
        self.sentences_path, self.tokenizer_path, self.max_length = sentences_path, tokenizer, max_length
        self.top_k, self.n_pairs, self.seed = int(top_k), int(n_pairs), int(seed)
        self.sink_threshold = float(sink_threshold)
        self.batch: dict[str, Tensor] | None = None
        self.curves: list[dict] = []  # per record {"step", "layers"} for the metric curves figure

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
            texts = load_sentences(self.sentences_path)[: self.n_sequences]
            max_len = self.max_length or getattr(config, "max_len", None) or tok.model_max_length
            self.batch = tokenize_heldout(tok, texts, max_len)
        else:
            if trainer.datamodule is None:
                raise ValueError("HiddenStateMonitor(source='val') needs a datamodule with val_dataloader()")
            special = set(getattr(tok, "all_special_ids", None) or
                          [getattr(config, a) for a in ("bos_token_id", "eos_token_id", "pad_token_id")
                           if getattr(config, a, None) is not None])
            self.batch = heldout_from_val(trainer.datamodule, self.n_sequences, special)

    def compute(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int, vectors: bool = True
                ) -> tuple[list, dict]:
        model = getattr(pl_module, "model", pl_module)
        modes = [(m, m.training) for m in model.modules()]
        model.eval()  # no dropout: the same batch gives the same vectors for the same weights
        try:
            with torch.inference_mode():
                b = self.batch
                config = getattr(model, "config", None)
                hidden, attn, inf = monitored_forward(model, b["input_ids"].to(pl_module.device),
                                                      b["attention_mask"].to(pl_module.device))
                rows, summary = hidden_state_records(
                    step, hidden, b["attention_mask"], b["special_tokens_mask"], top_k=self.top_k,
                    n_pairs=self.n_pairs, seed=self.seed, vectors=vectors, attentions=attn,
                    input_ids=b["input_ids"], bos_token_id=getattr(config, "bos_token_id", None),
                    eos_token_id=getattr(config, "eos_token_id", None), inf_norms=inf,
                    sink_threshold=self.sink_threshold)
                self.curves.append({"step": step, "rows": [r for r in rows if r[2] in plots.CURVE_STATISTICS]})
                return rows, summary
        finally:
            for m, mode in modes:
                m.training = mode

    def log_to(self, writer: Any, step: int, summary: dict, images: bool) -> None:
        for i, s in enumerate(summary["layers"]):
            base = f"monitor/hidden/layer_{i}"
            writer.add_scalar(f"{base}/argmax_share", s["argmax_share"], step)
            writer.add_scalar(f"{base}/argmin_share", s["argmin_share"], step)
            writer.add_scalar(f"{base}/argmax_dim", s["argmax_dim"], step)
            writer.add_scalar(f"{base}/argmin_dim", s["argmin_dim"], step)
            writer.add_scalar(f"{base}/anisotropy", float(summary["anisotropy"][i]), step)
            if summary["anisotropy_se"][i] == summary["anisotropy_se"][i]:  # NaN below 3 sentences
                writer.add_scalar(f"{base}/anisotropy_se", float(summary["anisotropy_se"][i]), step)
            writer.add_scalar(f"{base}/max_abs_mean", abs(s["top_values"][0]), step)
            writer.add_scalar(f"{base}/n_outlier_dims", len(summary["outliers"][i]), step)
            for key in ("kurtosis", "max_median", "max_abs", "abs_argmax_share"):
                writer.add_scalar(f"{base}/{key}", s[key], step)
            writer.add_scalar(f"{base}/token_pair_cosine", float(summary["token_pair_cosine"][i]), step)
            for key in ("rogue_top1_share", "rogue_top3_share", "isoscore"):  # NaN (one sentence) is skipped
                if summary[key][i] == summary[key][i]:
                    writer.add_scalar(f"{base}/{key}", float(summary[key][i]), step)
            for site, v in summary["inf_norms"].items():
                if i >= 1 and v[i] == v[i]:  # NaN: the block has no such site
                    writer.add_scalar(f"monitor/inf_norm/{site}/layer_{i}", float(v[i]), step)
            sinks = summary["sinks"]
            if sinks is not None and i >= 1:
                for key in ("bos", "eos"):
                    share = float((sinks[key][i - 1] > summary["sink_threshold"]).double().mean())
                    writer.add_scalar(f"{base}/sink_share_{key}", share, step)
                writer.add_scalar(f"{base}/attn_entropy", float(sinks["entropy"][i - 1].mean()), step)
                writer.add_scalar(f"{base}/attn_row_mass", float(sinks["row_mass"][i - 1].mean()), step)
        for which, (dim, share) in summary["pooled"].items():
            writer.add_scalar(f"monitor/hidden/model/pooled_{which}_share", share, step)
            writer.add_scalar(f"monitor/hidden/model/pooled_{which}_dim", dim, step)

    def after_resume(self, step: int) -> None:
        # the curves figure draws the whole history, including the part before the resume
        self.curves = [{"step": r["step"], "rows": [(r["step"], r["name"], r["statistic"], r["dim"], r["value"])]}
                       for r in self.history.rows() if r["statistic"] in plots.CURVE_STATISTICS]

    def figures(self, step: int, summary: dict) -> dict[str, Any]:
        rows = [row for rec in self.curves for row in rec["rows"]]
        return {"hidden/mean_vectors": plots.mean_vector_figure(as_numpy(summary["mean"]), summary["outliers"], step),
                "hidden/metrics": plots.metric_curves_figure(plots.curves_from_rows(rows))}
