"""The hidden-state half of every outlier monitor: activation outlier dims on a fixed held-out batch, any model.

At every record the model runs in eval mode under ``torch.inference_mode()`` on the *same* held-out sequences (one
forward, ``models.sites.monitored_forward``, eager attention), ``monitor_records.hidden_state_records`` computes the
per-layer statistics (Luo et al. 2021 §2 and the later ones listed there), and train mode is restored module by module.

``HiddenStateTracker`` is framework-free: the Lightning, plain-loop and HF monitors drive it, so ``hidden_states.csv``
has the same rows whichever loop trained.  The held-out text is the shipped sentences (Austen's *Persuasion*, not in the
training corpus) unless given, tokenised by the model's own tokenizer (``monitor_records.tokenize_heldout``), the batch
``outlierlab.jobs.posthoc`` uses too.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from outlierlab.metrics.monitor_records import hidden_state_records, tokenize_heldout
from outlierlab.metrics.word_order import (attention_locality, heldout_order_use, heldout_special_ids,
                                           pooled_order_change)
from outlierlab.datamodules.eval_data import load_sentences
from outlierlab.models.family_spec import usable_positions
from outlierlab.models.sites import monitored_forward
from outlierlab.models.w8a8 import w8a8_cost
from outlierlab.monitoring import monitor_plots as plots
from . import arguments

__all__ = ["HiddenStateTracker", "heldout_max_length", "model_device", "is_causal_lm", "order_use_records",
           "locality_records", "vector_order_records"]

#: what a tokenizer without a real limit reports as ``model_max_length`` (transformers' VERY_LARGE_INTEGER)
_NO_LIMIT = 10**6


def heldout_max_length(model: nn.Module, tokenizer: Any = None, max_length: int | None = None) -> int:
    """Truncation length of the held-out batch: ``max_length``, else our model's ``max_len``, else the smaller of the
    position table (RoBERTa-style tables lose ``pad_token_id + 1`` rows) and ``model_max_length``; 512 when neither
    says.  The monitors and the post-hoc analysis both call it."""
    if max_length:
        limit = position_limit(model)
        if limit is not None and max_length > limit:  # a longer batch failed in the model's embedding at record 1
            raise ValueError(f"max_length={max_length} exceeds the {limit} positions {type(model).__name__} has: "
                             f"pass max_length <= {limit}, or None (the model's own)")
        return int(max_length)
    config = getattr(model, "config", None)
    if getattr(config, "max_len", None):
        return int(config.max_len)
    limits = []
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if positions:
        limits.append(int(usable_positions(config, positions)))
    tok_max = getattr(tokenizer, "model_max_length", None)
    if tok_max and tok_max < _NO_LIMIT:
        limits.append(int(tok_max))
    return min(limits) if limits else 512


def position_limit(model: nn.Module) -> int | None:
    """The most tokens ``model`` takes where a table fixes it: our ``max_len``, a learned position table
    (``position_embeddings``, GPT-2's ``wpe``; RoBERTa-style tables lose ``pad_token_id + 1`` rows); None otherwise."""
    config = getattr(model, "config", None)
    if getattr(config, "max_len", None):
        return int(config.max_len)
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding) and name.rsplit(".", 1)[-1] in ("position_embeddings", "wpe"):
            return usable_positions(config, module.num_embeddings)
    return None


def is_causal_lm(model: nn.Module) -> bool:
    """Whether the model's own LM head predicts the next token: our config's ``causal``, else the family's
    objective (``outlierlab.models.families.causal_or_masked``)."""
    config = getattr(model, "config", None)
    if isinstance(getattr(config, "causal", None), bool):
        return config.causal
    from outlierlab.models.families import causal_or_masked  # lazy: the registry imports transformers

    return causal_or_masked(config) == "next_token"


def order_use_records(step: int, value: dict, local: dict | None) -> list[tuple]:
    """History rows of ``heldout_order_use``'s result: ``model/order_use`` (nats),
    ``layer_i/attn_local`` per block and ``model/attn_local_uniform`` (the uniform baseline)."""
    return [(step, "model", "order_use", None, float(value["order_use"])), *locality_records(step, local)]


def locality_records(step: int, local: dict | None) -> list[tuple]:
    """``layer_i/attn_local`` per block and ``model/attn_local_uniform`` of
    ``attention_locality``'s result (none for None)."""
    if local is None:
        return []
    return [*((step, f"layer_{i + 1}", "attn_local", None, float(m)) for i, m in enumerate(local["mass"])),
            (step, "model", "attn_local_uniform", None, float(local["uniform"]))]


def vector_order_records(step: int, model: nn.Module, batch: dict, special: set[int], causal: bool, attentions,
                         seed: int = 0) -> tuple[list[tuple], list[float], dict | None]:
    """For a model without an LM head: each layer's sentence-vector order change on the held-out batch
    (``pooled_order_change``, rows ``layer_i/pooled_order_change``) and the locality of ``attentions`` (None: not
    measured).  Returns ``(rows, the per-layer changes, the locality or None)``."""
    device = model_device(model)

    def hidden_states(ids, mask):
        return monitored_forward(model, ids.to(device), mask.to(device), attentions=False)[0]

    with torch.inference_mode():
        values = pooled_order_change(hidden_states, [(batch["input_ids"], batch["attention_mask"])], special,
                                     seed=seed)["change"].tolist()
    local = None if attentions is None else attention_locality(attentions, batch["attention_mask"].to(device), causal)
    return ([*((step, f"layer_{i}", "pooled_order_change", None, v) for i, v in enumerate(values)),
             *locality_records(step, local)], values, local)


def model_device(model: nn.Module) -> torch.device:
    """Where the model's parameters are (CPU for a model without any)."""
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


class HiddenStateTracker:
    """Per-layer activation outlier statistics of one model on a fixed held-out batch (Luo et al. 2021).

    ``n_sequences`` ≥ 2 held-out sequences (anisotropy pairs different sequences); ``sentences_path``: another gzip
    sentences file; ``max_length`` (default ``heldout_max_length``); ``top_k`` dims with the largest |mean| per layer;
    ``n_pairs, seed``: the anisotropy's pairs; ``sink_threshold``: Gu et al. (2025)'s ε.

    ``order_use``: also order use and attention locality (``word_order.heldout_order_use``, two more forwards; rows
    ``model/order_use``, ``layer_i/attn_local``), the loop monitors' default (``train.py`` logs ``val/order_use``
    instead).  A model without an LM head gets one notice and ``pooled_order_change`` rows instead.

    ``w8a8``: also what 8 bits cost (``models.w8a8.w8a8_cost``: loss change and KL from full precision with the blocks'
    linears in W8A8, and with 4 outlier dims kept; Bondarenko et al. 2023, LLM.int8()): rows ``model/w8a8_loss_delta``,
    ``model/w8a8_kl`` and ``w8a8_keep_`` twins (nats), or ``..._rel_error`` without an LM head.
    """

    filename = "hidden_states.csv"

    def __init__(self, n_sequences: int = 32, sentences_path: str | None = None, max_length: int | None = None,
                 top_k: int = 5, n_pairs: int = 1000, seed: int = 0, sink_threshold: float = 0.3,
                 order_use: bool = False, w8a8: bool = False) -> None:
        # >= 2: anisotropy pairs tokens of different sequences
        self.n_sequences = arguments.count("n_sequences", n_sequences, 2)
        self.sentences_path = arguments.path_like("sentences_path", sentences_path, optional=True)
        self.max_length = arguments.count("max_length", max_length, 2, optional=True)  # <s> and one token
        self.top_k, self.n_pairs = arguments.count("top_k", top_k, 1), arguments.count("n_pairs", n_pairs, 1)
        self.seed = arguments.count("seed", seed, 0)
        # a mean attention share: above 1 no head is a sink, at 0 every head is
        self.sink_threshold = arguments.number("sink_threshold", sink_threshold, 0.0, 1.0)
        self.order_use = arguments.flag("order_use", order_use)
        self.w8a8 = arguments.flag("w8a8", w8a8)
        self.order_ids: tuple[set[int], int | None] | None = None  # special ids kept in place, the mask id
        self.last_order_use: float | None = None
        self.headless = False  # the model gave no LM loss: its vectors' order change is recorded instead
        self.batch: dict[str, Tensor] | None = None
        self.curves: list[dict] = []  # per record {"step", "rows"} for the metric curves figure

    # -- the held-out batch ----------------------------------------------------------------------------
    def texts(self, sentences: Sequence[str] | None = None) -> list[str]:
        """The held-out texts: ``sentences`` (first ``n_sequences``) or the shipped held-out sentences."""
        texts = list(sentences) if sentences is not None else load_sentences(self.sentences_path)
        texts = texts[: self.n_sequences]
        if len(texts) < 2:
            raise ValueError(f"the held-out batch needs at least 2 sentences (anisotropy pairs tokens of different "
                             f"sentences), got {len(texts)}")
        return texts

    def tokenize(self, tokenizer: Any, model: nn.Module, sentences: Sequence[str] | None = None) -> None:
        """Build the fixed batch from texts with the model's own tokenizer (kept for every later record)."""
        if tokenizer is None:
            raise ValueError("the hidden-state monitor needs the model's tokenizer to build its held-out batch "
                             "(pass tokenizer=...)")
        self.batch = tokenize_heldout(tokenizer, self.texts(sentences),
                                      heldout_max_length(model, tokenizer, self.max_length))
        self.order_ids = (heldout_special_ids(getattr(model, "config", None), tokenizer),
                          getattr(tokenizer, "mask_token_id", None))

    def reload(self, history_rows: Sequence[dict]) -> None:
        """After a resume: the curves figure draws the whole history, including the part before the resume."""
        self.curves = [{"step": r["step"], "rows": [(r["step"], r["name"], r["statistic"], r["dim"], r["value"])]}
                       for r in history_rows if r["statistic"] in plots.CURVE_STATISTICS]

    # -- one record ------------------------------------------------------------------------------------
    def compute(self, model: nn.Module, step: int, vectors: bool = True,
                device: torch.device | str | None = None) -> tuple[list, dict]:
        """History rows and a summary of one forward pass of the held-out batch (eval mode, no grad)."""
        if self.batch is None:
            raise ValueError("HiddenStateTracker has no held-out batch: call tokenize() (or set .batch) first")
        device = model_device(model) if device is None else device
        modes = [(m, m.training) for m in model.modules()]
        model.eval()  # no dropout: the same batch gives the same vectors for the same weights
        try:
            with torch.inference_mode():
                b = self.batch
                config = getattr(model, "config", None)
                hidden, attn, inf = monitored_forward(model, b["input_ids"].to(device),
                                                      b["attention_mask"].to(device))
                rows, summary = hidden_state_records(
                    step, hidden, b["attention_mask"], b["special_tokens_mask"], top_k=self.top_k,
                    n_pairs=self.n_pairs, seed=self.seed, vectors=vectors, attentions=attn,
                    input_ids=b["input_ids"], bos_token_id=getattr(config, "bos_token_id", None),
                    eos_token_id=getattr(config, "eos_token_id", None), inf_norms=inf,
                    sink_threshold=self.sink_threshold)
                if self.order_use:
                    rows += self._order_use_rows(model, step, attn, summary)
                if self.w8a8:
                    summary["w8a8"] = w8a8_cost(model, self.batch, is_causal_lm(model), (self.order_ids or
                                                                                         (set(), None))[1])
                    rows += [(step, "model", f"w8a8_{k}", None, float(v)) for k, v in summary["w8a8"].items()]
                self.curves.append({"step": step, "rows": [r for r in rows if r[2] in plots.CURVE_STATISTICS]})
                return rows, summary
        finally:
            for m, mode in modes:  # module by module: a submodule the caller keeps in eval mode stays so
                m.training = mode

    def _order_use_rows(self, model: nn.Module, step: int, attentions, summary: dict) -> list[tuple]:
        """Order use and attention locality on the held-out batch (``heldout_order_use``, ``order_use_records``, as the
        post-hoc job writes them); ``summary`` gets them for TensorBoard."""
        special, mask_id = self.order_ids or (set(), None)
        causal = is_causal_lm(model)
        if self.headless:
            return self._vector_order_rows(model, step, attentions, summary, special, causal)
        try:
            value, local = heldout_order_use(model, self.batch, causal, special, mask_id, attentions)
        except (TypeError, AttributeError, ValueError) as err:  # a body without an LM head: no loss to permute
            self.headless = True
            warnings.warn(f"order use in nats is not measured: {type(model).__name__} gave no language-model loss "
                          f"({str(err).splitlines()[0][:200]}); recording how far shuffling each held-out "
                          "sentence moves its mean-pooled vectors instead (give the monitor the model with its LM "
                          "head for order use in nats)")
            return self._vector_order_rows(model, step, attentions, summary, special, causal)
        self.last_order_use = summary["order_use"] = value["order_use"]
        summary["order_use_detail"] = value  # loss, loss_permuted, tokens: the post-hoc order_use.csv
        if local is not None:
            summary["attn_local"] = [float(m) for m in local["mass"]]
        return order_use_records(step, value, local)

    def _vector_order_rows(self, model: nn.Module, step: int, attentions, summary: dict, special: set[int],
                           causal: bool) -> list[tuple]:
        """A model without an LM head: ``vector_order_records``; ``summary`` gets its values for TensorBoard."""
        rows, values, local = vector_order_records(step, model, self.batch, special, causal, attentions, self.seed)
        summary["pooled_order_change"] = values
        if local is not None:
            summary["attn_local"] = [float(m) for m in local["mass"]]
        return rows

    def log_to(self, writer: Any, step: int, summary: dict, images: bool) -> None:
        """Scalars to one TensorBoard ``SummaryWriter``-like writer (tags: module docstring of the callback)."""
        for i, s in enumerate(summary["layers"]):
            base = f"monitor/hidden/layer_{i}"
            writer.add_scalar(f"{base}/argmax_share", s["argmax_share"], step)
            writer.add_scalar(f"{base}/argmin_share", s["argmin_share"], step)
            writer.add_scalar(f"{base}/argmax_dim", s["argmax_dim"], step)
            writer.add_scalar(f"{base}/argmin_dim", s["argmin_dim"], step)
            # the dimension of abs_argmax_share: a flat curve is the layer's outlier dimension settling
            # (outlierlab.studies.dim_identity reads the same from hidden_states.csv)
            writer.add_scalar(f"{base}/abs_argmax_dim", s["abs_argmax_dim"], step)
            writer.add_scalar(f"{base}/anisotropy", float(summary["anisotropy"][i]), step)
            if summary["anisotropy_se"][i] == summary["anisotropy_se"][i]:  # NaN below 3 sentences
                writer.add_scalar(f"{base}/anisotropy_se", float(summary["anisotropy_se"][i]), step)
            writer.add_scalar(f"{base}/max_abs_mean", abs(s["top_values"][0]), step)
            writer.add_scalar(f"{base}/n_outlier_dims", len(summary["outliers"][i]), step)
            for key in ("kurtosis", "max_median", "max_abs", "abs_argmax_share"):
                writer.add_scalar(f"{base}/{key}", s[key], step)
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
        for r in summary.get("position_shares", []):  # the layer's |x|-argmax dim, bucket by bucket
            writer.add_scalar(f"monitor/hidden/layer_{r['layer']}/abs_argmax_share_pos_{r['positions']}",
                              r["layer_dim_share"], step)
        if "order_use" in summary:
            writer.add_scalar("monitor/order_use", summary["order_use"], step)
        for key, value in summary.get("w8a8", {}).items():
            writer.add_scalar(f"monitor/w8a8/{key}", value, step)
        for i, mass in enumerate(summary.get("attn_local", [])):
            writer.add_scalar(f"monitor/attn_local/layer_{i + 1}", mass, step)
        for i, change in enumerate(summary.get("pooled_order_change", [])):
            writer.add_scalar(f"monitor/pooled_order_change/layer_{i}", change, step)
        for which, (dim, share) in summary["pooled"].items():
            writer.add_scalar(f"monitor/hidden/model/pooled_{which}_share", share, step)
            writer.add_scalar(f"monitor/hidden/model/pooled_{which}_dim", dim, step)

    def figures(self, step: int, summary: dict) -> dict[str, Any]:
        """The mean vector of every layer (Luo et al. Figs. 1–2) and the metric curves so far."""
        rows = [row for rec in self.curves for row in rec["rows"]]
        mean = summary["mean"]
        mean = mean.detach().cpu().numpy() if hasattr(mean, "detach") else mean
        return {"hidden/mean_vectors": plots.mean_vector_figure(mean, summary["outliers"], step),
                "hidden/metrics": plots.metric_curves_figure(plots.curves_from_rows(rows))}
