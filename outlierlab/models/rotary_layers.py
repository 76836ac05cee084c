"""Where each layer of a model rotates its queries and keys, read from the model itself (Su et al. 2021; Jonasson
2025): the frequencies θ_i of its rotary module (``inv_freq``, so every scaling transformers applies is in them) and
the layer's reach (a sliding window or the position limit). Used by the query/key outlier analysis
(``outlierlab.evaluation.analyses.qk_outliers``); the blocks come from the family registry."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from .families import family_of

__all__ = ["RotaryLayer", "rotary_layers"]

class RotaryLayer(NamedTuple):
    """How one layer rotates its queries and keys (Su et al. 2021), as the model itself does it.

    inv_freq : ``[r/2]`` float64 θ_i, radians per position (r < head_dim for partial rotary), from the model's rotary
        module, so every transformers scaling (linear, dynamic, YaRN, LongRoPE, llama3) is in it
    context : the farthest distance attended: ``sliding_window`` (ModernBERT's local layers: 64; a causal window's one
        token less is not subtracted), else the position limit
    source : where ``inv_freq`` was read (said in reports)
    """

    inv_freq: Tensor
    context: int
    source: str


def _rotary_module(root: nn.Module) -> tuple[str, nn.Module] | None:
    """The first submodule holding rotary frequencies: an ``inv_freq`` buffer (transformers' ``*RotaryEmbedding``; per
    layer type ``{type}_inv_freq``, ModernBERT) or, duck typing our ``RotaryPositions``, a float ``base`` and an int
    ``dim``."""
    for name, mod in root.named_modules():
        bufs = dict(mod.named_buffers(recurse=False))
        if "inv_freq" in bufs or any(b.endswith("_inv_freq") and not b.endswith("original_inv_freq") for b in bufs):
            return name, mod
        if isinstance(getattr(mod, "base", None), float) and isinstance(getattr(mod, "dim", None), int) \
                and "rotary" in type(mod).__name__.lower():
            return name, mod
    return None


def rotary_layers(model: nn.Module) -> list[RotaryLayer | None]:
    """Per block the ``RotaryLayer`` (frequencies and reach), or None for a model that does not rotate: from each
    attention's rotary module, else the model's (``model.rotary_emb``), per layer type where kept so
    (``config.layer_types``).  Ours (``pos=rope``): θ_i = base^(−2i/dim), as ``positions.rope_cos_sin``."""
    cfg = getattr(model, "config", None)
    blocks = family_of(model).block_list(model)
    shared = _rotary_module(model)
    types = list(getattr(cfg, "layer_types", None) or [])
    limit = int(getattr(cfg, "max_len", 0) or getattr(cfg, "max_position_embeddings", 0) or 0)  # ours: max_len
    window = int(getattr(cfg, "sliding_window", 0) or 0)
    out: list[RotaryLayer | None] = []
    names = {id(m): n for n, m in model.named_modules()}
    for i, block in enumerate(blocks):
        found = _rotary_module(block) or shared
        if found is None:
            out.append(None)
            continue
        _, mod = found
        kind = types[i] if i < len(types) else None
        buf = getattr(mod, f"{kind}_inv_freq", None) if kind else None
        where = f"{names.get(id(mod), '?')}.{kind}_inv_freq"
        if buf is None:
            buf, where = getattr(mod, "inv_freq", None), f"{names.get(id(mod), '?')}.inv_freq"
        if buf is None:  # ours: base and dim
            dim = int(mod.dim)
            buf = float(mod.base) ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
            where = f"{names.get(id(mod), '?')} (base {mod.base:g}, dim {dim})"
        # a sliding-window layer: typed so (ModernBERT local, Qwen2/3 with use_sliding_window), or every layer of
        # a model whose config sets a window without layer types (Mistral)
        slides = kind == "sliding_attention" if types else getattr(cfg, "use_sliding_window", True) is not False
        reach = window if slides else 0
        out.append(RotaryLayer(buf.detach().to(torch.float64).cpu(), reach or limit or 2048, where))
    return out
