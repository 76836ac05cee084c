"""The one list of a model's LayerNorms, their parameters, and the weight surgery of Kovaleva et al. (2021).

Every LayerNorm-outlier analysis gets the norms from ``model_layernorms``, keyed by canonical names in depth order:
``embeddings``; per layer ``layer.{i}.attention_output``/``layer.{i}.output`` (post-LN) or
``layer.{i}.attention_input``/``layer.{i}.mlp_input`` (pre-LN); ``final`` (pre-LN); ``head`` only when asked. Hugging
Face models are resolved by their family (``outlierlab.models.families``); ours lists its own
(``RobertaMaskedLM.named_layernorms``, renamed to the pre-LN kinds when pre-LN), so both are judged alike by
``layernorm_rule.layernorm_outliers``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from outlierlab.metrics.layernorm_rule import KIND_ROLES, layernorm_kind
from outlierlab.models.families import UnknownFamilyError, family_of
from outlierlab.models.family_spec import PRE_KINDS

__all__ = ["NORM_TYPES", "model_layernorms", "layernorm_kind", "select_layernorms", "layernorms_of_layers",
           "layernorm_tensors",
           "zero_layernorm_dims", "UnknownFamilyError"]

#: Norm modules of our own encoder (LayerNorm with or without affine parameters, RMSNorm).
NORM_TYPES = (nn.LayerNorm, nn.RMSNorm)
_LAYER_RE = re.compile(r"^layer\.(\d+)\.")
_KIND_ORDER = {"attention_output": 0, "attention_input": 0, "output": 1, "mlp_input": 1}
#: Our encoder names its pre-LN norms after RoBERTa's modules; their kinds by where they sit in the block.
_OURS_PRE = {"attention_output": PRE_KINDS[0], "output": PRE_KINDS[1]}


def _order(key: str) -> tuple[int, int]:
    if key == "embeddings":
        return (-1, 0)
    if key in ("final", "head"):
        return (10**9, 0 if key == "final" else 1)
    m = _LAYER_RE.match(key)
    return (int(m.group(1)), _KIND_ORDER.get(layernorm_kind(key), 2)) if m else (10**9 - 1, 0)


def _ours(model: nn.Module, include_head: bool) -> dict[str, nn.Module]:
    found = dict(model.named_layernorms())
    if family_of(model).placement == "pre":
        found = {(f"layer.{m.group(1)}.{_OURS_PRE.get(layernorm_kind(k), layernorm_kind(k))}"
                  if (m := _LAYER_RE.match(k)) else k): v for k, v in found.items()}
    head = getattr(getattr(model, "lm_head", None), "layer_norm", None)
    if include_head and isinstance(head, NORM_TYPES):
        found["head"] = head
    return found


def model_layernorms(model: nn.Module, include_head: bool = False) -> dict[str, nn.Module]:
    """The model's norm modules keyed by canonical name, in depth order.

    ``model``: our ``RobertaMaskedLM`` (anything with ``named_layernorms()``) or a Hugging Face model of a registered
    family, with or without its head.  ``include_head``: also list the LM head's norm as ``head``.  May be empty for our
    model (a block without norms; the rule then says it cannot judge).  Raises ``UnknownFamilyError`` (one line) for an
    unregistered ``model_type``.
    """
    found = _ours(model, include_head) if hasattr(model, "named_layernorms") else \
        family_of(model).layernorms(model, include_head)
    return dict(sorted(found.items(), key=lambda kv: _order(kv[0])))


def select_layernorms(layernorms: Mapping[str, nn.Module], kinds: Iterable[str]) -> dict[str, nn.Module]:
    """The norms of the given kinds or roles, in model order: ``output`` (in a pre-LN model both per-layer norms,
    ``layernorm_rule.KIND_ROLES``), ``attention_output``, ``attention_input``, ``mlp_input``, ``embeddings``, ``final``,
    ``head``; ``all`` = every per-layer norm.  Raises, naming what the model has, on an empty or unknown kind."""
    kinds = [str(k) for k in kinds]
    present = sorted({layernorm_kind(k) for k in layernorms})
    roles = set(present) | {KIND_ROLES[k] for k in present if k in KIND_ROLES} | {"all"}
    optional = {"embeddings", "head", "final"}  # asked for where a model may lack them: selects nothing
    bad = sorted(set(kinds) - roles - optional)
    if bad or not kinds:
        raise ValueError(f"unknown LayerNorm kind(s) {bad or kinds} for this model: it has {present + ['all']}"
                         + (" (pre-LN: output = both per-layer norms)" if "mlp_input" in present else "")
                         + ", e.g. ablation.layernorms=[output]")
    return {k: m for k, m in layernorms.items()
            if layernorm_kind(k) in kinds or KIND_ROLES.get(layernorm_kind(k)) in kinds
            or ("all" in kinds and _LAYER_RE.match(k))}


def norm_layer(name: str) -> int | None:
    """The hidden-state layer a norm writes or reads, numbered as every per-layer table numbers layers (0 = the
    embeddings, ``i + 1`` = block ``i``, whose norms are ``layer.{i}.*``); None for the final and head norms."""
    if name == "embeddings":
        return 0
    m = _LAYER_RE.match(name)
    return int(m.group(1)) + 1 if m else None


def layernorms_of_layers(layernorms: Mapping[str, nn.Module], layers: Iterable[int]) -> dict[str, nn.Module]:
    """The norms of ``layernorms`` that belong to ``layers`` (``norm_layer``; final and head norms belong to none), in
    model order.  Raises, naming the layers there are, for an unknown layer or an empty result."""
    layers = [int(x) for x in layers]
    present = sorted({n for n in map(norm_layer, layernorms) if n is not None})
    missing = sorted(set(layers) - set(present))
    chosen = {k: m for k, m in layernorms.items() if norm_layer(k) in layers}
    if missing or not chosen:
        raise ValueError(f"layers {missing or layers}: the chosen LayerNorms ({', '.join(layernorms) or 'none'}) are "
                         f"in layers {', '.join(map(str, present)) or 'none'} (0 = embeddings, 1 = the first block)")
    return chosen


def layernorm_tensors(layernorms: Mapping[str, nn.Module]) -> dict[str, tuple[Tensor | None, Tensor | None]]:
    """Detached float32 CPU copies of every norm's ``(weight, bias)``; ``None`` where a norm has none
    (no-affine LayerNorm: both; RMSNorm: bias) — the input of ``outlierlab.metrics.layernorm_rule.layernorm_outliers``."""
    out = {}
    for name, ln in layernorms.items():
        w, b = getattr(ln, "weight", None), getattr(ln, "bias", None)
        out[name] = tuple(None if p is None else p.detach().float().cpu().clone() for p in (w, b))
    return out


@contextmanager
def zero_layernorm_dims(layernorms: Mapping[str, nn.Module], dims: Iterable[int] | Mapping[str, Iterable[int]]):
    """Temporarily set gain AND bias of ``dims`` to 0 in exactly the given norms (Kovaleva et al. 2021).

    ``layernorms``: the norms to touch (e.g. ``select_layernorms``); ``dims``: the same in every norm, or per norm name
    (missing names: none).  The entries are restored on exit, also on error, bit for bit.  A norm without gain and bias
    cannot be disabled this way: asking is an error.
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
