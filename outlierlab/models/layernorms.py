"""The one list of a model's LayerNorms, their parameters, and the weight surgery of Kovaleva et al. (2021).

Every analysis of LayerNorm outlier dims (the training monitor, ``evaluate.py``'s outliers, ablation,
frequency and attention-sink analyses) gets the norms from :func:`model_layernorms`, keyed by canonical
names: ``embeddings``, ``layer.{i}.attention_output``, ``layer.{i}.output`` in depth order, and — only
when asked (``include_head=True``) — ``head`` for the MLM head's LayerNorm.  Our encoder lists its own
(:meth:`outlierlab.models.encoder.RobertaMaskedLM.named_layernorms`, whatever norms a block variant has); Hugging
Face BERT/RoBERTa/ELECTRA-style and DistilBERT models are recognised by their module names.
The rule that judges these norms is :func:`outlierlab.analysis.layernorm_rule.layernorm_outliers`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from outlierlab.analysis.layernorm_rule import layernorm_kind

__all__ = ["NORM_TYPES", "model_layernorms", "layernorm_kind", "select_layernorms", "layernorm_tensors",
           "zero_layernorm_dims"]

#: Norm modules whose weights are judged (LayerNorm with or without affine parameters, RMSNorm).
NORM_TYPES = (nn.LayerNorm, nn.RMSNorm)

#: (regex on the module name, key template). BERT/RoBERTa/ELECTRA/MPNet-style names, then DistilBERT's.
_LN_PATTERNS = (
    (re.compile(r"(?:^|\.)embeddings\.LayerNorm$"), "embeddings"),
    (re.compile(r"(?:^|\.)encoder\.layer\.(\d+)\.attention\.output\.LayerNorm$"), "layer.{}.attention_output"),
    (re.compile(r"(?:^|\.)encoder\.layer\.(\d+)\.output\.LayerNorm$"), "layer.{}.output"),
    (re.compile(r"(?:^|\.)transformer\.layer\.(\d+)\.sa_layer_norm$"), "layer.{}.attention_output"),
    (re.compile(r"(?:^|\.)transformer\.layer\.(\d+)\.output_layer_norm$"), "layer.{}.output"),
)
#: The MLM head's LayerNorm: ours and HF RoBERTa (``lm_head.layer_norm``), BERT
#: (``cls.predictions.transform.LayerNorm``), DistilBERT (``vocab_layer_norm``).
_HEAD_RE = re.compile(r"(?:^|\.)(?:lm_head\.layer_norm|predictions\.transform\.LayerNorm|vocab_layer_norm)$")
_LAYER_RE = re.compile(r"^layer\.(\d+)\.")


def _order(key: str) -> tuple[int, int]:
    if key == "embeddings":
        return (-1, 0)
    if key == "head":
        return (10**9, 0)
    m = _LAYER_RE.match(key)
    return (int(m.group(1)), 0 if key.endswith("attention_output") else 1) if m else (10**9 - 1, 0)


def _head_norm(model: nn.Module) -> nn.Module | None:
    for name, module in model.named_modules():
        if isinstance(module, NORM_TYPES) and _HEAD_RE.search(name):
            return module
    return None


def model_layernorms(model: nn.Module, include_head: bool = False) -> dict[str, nn.Module]:
    """The model's norm modules keyed by canonical name, in depth order.

    Parameters
    ----------
    model : our :class:`~outlierlab.models.encoder.RobertaMaskedLM` (anything with ``named_layernorms()``), or a
        Hugging Face BERT/RoBERTa/ELECTRA/MPNet-style or DistilBERT model (any prefix, with or without head).
    include_head : also list the MLM head's LayerNorm as ``head`` (never counted unless asked: it is not a
        layer of the encoder).

    Returns
    -------
    dict[str, nn.Module]
        May be empty for our own model (e.g. a block without norms); the outlier rule then says it cannot judge.

    Raises
    ------
    ValueError
        A model that is not ours and has no recognised per-layer output LayerNorm (unsupported architecture).
    """
    if hasattr(model, "named_layernorms"):
        found = dict(model.named_layernorms())
    else:
        found = {}
        for name, module in model.named_modules():
            if not isinstance(module, NORM_TYPES):
                continue
            for pattern, template in _LN_PATTERNS:
                m = pattern.search(name)
                if m:
                    found.setdefault(template.format(*m.groups()), module)
                    break
        if not any(k.endswith(".output") for k in found):
            raise ValueError(f"cannot find the per-layer LayerNorms of {type(model).__name__}: only BERT/RoBERTa-"
                             "style (encoder.layer.N.output.LayerNorm) and DistilBERT-style names are supported")
    if include_head:
        head = _head_norm(model)
        if head is not None:
            found["head"] = head
    return dict(sorted(found.items(), key=lambda kv: _order(kv[0])))


def select_layernorms(layernorms: Mapping[str, nn.Module], kinds: Iterable[str]) -> dict[str, nn.Module]:
    """The norms of the given kinds (``output``, ``attention_output``, ``embeddings``, ``head``; ``all`` = every
    per-layer norm), in model order.  Raises on an empty or unknown choice, naming what the model has."""
    kinds = [str(k) for k in kinds]
    present = sorted({layernorm_kind(k) for k in layernorms}) + ["all"]
    bad = sorted(set(kinds) - set(present) - {"embeddings", "head", "output", "attention_output"})
    if bad or not kinds:
        raise ValueError(f"unknown LayerNorm kind(s) {bad or kinds}: this model has {present}, "
                         "e.g. ablation.layernorms=[output,attention_output]")
    return {k: m for k, m in layernorms.items()
            if layernorm_kind(k) in kinds or ("all" in kinds and _LAYER_RE.match(k))}


def layernorm_tensors(layernorms: Mapping[str, nn.Module]) -> dict[str, tuple[Tensor | None, Tensor | None]]:
    """Detached float32 CPU copies of every norm's ``(weight, bias)``; ``None`` where a norm has none
    (no-affine LayerNorm: both; RMSNorm: bias) — the input of :func:`outlierlab.analysis.layernorm_rule.layernorm_outliers`."""
    out = {}
    for name, ln in layernorms.items():
        w, b = getattr(ln, "weight", None), getattr(ln, "bias", None)
        out[name] = tuple(None if p is None else p.detach().float().cpu().clone() for p in (w, b))
    return out


@contextmanager
def zero_layernorm_dims(layernorms: Mapping[str, nn.Module], dims: Iterable[int] | Mapping[str, Iterable[int]]):
    """Temporarily set gain AND bias of ``dims`` to 0 in exactly the given norms (Kovaleva et al. 2021).

    Parameters
    ----------
    layernorms : Mapping[str, nn.Module]
        The norms to touch (e.g. :func:`select_layernorms`); no other parameter is changed.
    dims : Iterable[int] or Mapping[str, Iterable[int]]
        The same dims in every norm, or per norm name (names missing from the mapping: none).

    Notes
    -----
    The original entries are copied before zeroing and written back on exit, also when the body raises,
    so the model is bit-for-bit what it was before.  A norm without gain and bias cannot be disabled this
    way: asking for it is an error rather than a silent no-op.
    """
    per = {}
    for name, ln in layernorms.items():
        ds = dims.get(name, ()) if isinstance(dims, Mapping) else dims
        ds = sorted({int(d) for d in ds})
        params = [p for p in (getattr(ln, "weight", None), getattr(ln, "bias", None)) if p is not None]
        if ds and not params:
            raise ValueError(f"norm {name!r} has no gain or bias to zero (no affine parameters)")
        size = params[0].shape[0] if params else 0
        if ds and (ds[0] < 0 or ds[-1] >= size):
            raise ValueError(f"dims {ds} out of range for LayerNorm {name!r} of size {size}")
        per[name] = (ds, params)
    saved: list[tuple[Tensor, Tensor, Tensor]] = []
    try:
        with torch.no_grad():
            for ds, params in per.values():
                if not ds:
                    continue
                for p in params:
                    idx = torch.tensor(ds, dtype=torch.long, device=p.device)
                    saved.append((p, idx, p[idx].clone()))
                    p[idx] = 0
        yield
    finally:
        with torch.no_grad():
            for p, idx, old in reversed(saved):
                p[idx] = old
