"""Queries and keys where a model rotates them, hooked while it runs (Jonasson 2025, "Rotary Offset Features in Large
Language Models"): ``qk_projections`` finds them, ``rotary_specs`` reads each layer's rotary frequencies, and
``QKRecorder`` streams per layer × head × dim the real tokens' q/k magnitudes into a ``QKAccumulator``."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from outlierlab.metrics.qk_magnitudes import QKAccumulator, RotarySpec
from outlierlab.models.families import family_of
from outlierlab.models.family_spec import QKProjection, split_qk
from outlierlab.models.rotary_layers import rotary_layers

__all__ = ["qk_projections", "rotary_specs", "QKRecorder"]


def qk_projections(model: nn.Module) -> list[QKProjection]:
    """Each block's queries and keys where the model rotates them: the family's (``Family.qk_projections``: the
    projections, or Qwen3's ``q_norm``/``k_norm``), or for our encoder its OP block's ``query_norm``/``key_norm`` where
    present, else its ``query``/``key`` Linears."""
    if not hasattr(model, "named_layernorms"):
        return family_of(model).qk_projections(model)
    cfg, fam = model.config, family_of(model)
    out = []
    for b in fam.block_list(model):
        attn = b.get_submodule(fam.attention)
        qn, kn = getattr(attn, "query_norm", None), getattr(attn, "key_norm", None)
        if qn is not None and kn is not None:
            out.append(QKProjection(qn, kn, "head_major", cfg.num_heads, cfg.num_heads, cfg.head_dim))
        else:
            out.append(QKProjection(b.get_submodule(fam.q), b.get_submodule(fam.k), "separate", cfg.num_heads,
                                    cfg.num_heads, cfg.head_dim))
    return out


def rotary_specs(model: nn.Module, num_layers: int, head_dim: int, max_cycles: float) -> list[RotarySpec | None]:
    """The rotary scheme of every layer (None where it does not rotate): θ_i from the model's own rotary module
    (``rotary_layers.rotary_layers``: scaled and partial rotary included) and the layer's reach (a sliding window)."""
    try:
        layers = rotary_layers(model)
    except ValueError:  # an unregistered family: magnitudes alone
        return [None] * num_layers
    if len(layers) != num_layers:
        raise ValueError(f"{len(layers)} rotary entries for {num_layers} layers")
    return [None if r is None else RotarySpec(head_dim, tuple(r.inv_freq.tolist()), r.context, "half", max_cycles,
                                              r.source) for r in layers]


class QKRecorder:
    """Hooks every layer's q/k projections; ``observe`` after each forward adds the real tokens' q/k (``attention_mask``
    ``[B, T]``) to ``acc``.  With the mask given first (``expect``) each layer is reduced in its hook, so at most one
    layer's projections are held."""

    def __init__(self, model: nn.Module):
        self.projs = qk_projections(model)
        p0 = self.projs[0]
        self.acc = QKAccumulator(len(self.projs), p0.num_heads, p0.head_dim, p0.num_kv_heads)
        self._out: dict[tuple[int, str], torch.Tensor] = {}
        self._handles: list = []
        self._mask: torch.Tensor | None = None

    @contextmanager
    def hooked(self):
        def keep(key):
            def hook(_m, _args, out):
                self._out[key] = out.detach()
                if self._mask is not None:
                    self._reduce(key[0], self._mask)
            return hook

        for i, p in enumerate(self.projs):
            self._handles.append(p.q.register_forward_hook(keep((i, "q"))))
            if p.k is not p.q:
                self._handles.append(p.k.register_forward_hook(keep((i, "k"))))
        try:
            yield self
        finally:
            for h in self._handles:
                h.remove()
            self._handles.clear()

    def expect(self, attention_mask: torch.Tensor) -> None:
        """The mask of the batch about to run: its layers are reduced as the model produces them."""
        self._mask = attention_mask

    def _reduce(self, i: int, attention_mask: torch.Tensor) -> None:
        p = self.projs[i]
        if (i, "q") not in self._out or (p.k is not p.q and (i, "k") not in self._out):
            return  # the layer's other projection is still to come
        q, k = split_qk(p, self._out.pop((i, "q")), self._out.pop((i, "k"), None))  # [B, T, H, hd]
        real = attention_mask.to(q.device).bool()
        self.acc.update(i, q[real], k[real])

    def observe(self, attention_mask: torch.Tensor) -> None:
        """Reduce what the last forward left (every layer, unless ``expect`` was called before it)."""
        for i in range(len(self.projs)):
            self._reduce(i, attention_mask)
        self._mask = None
