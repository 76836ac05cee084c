"""Accumulators of one layer joined into one of many layers, and split back.

The evaluation stream and probe.py's feature extraction feed each layer's hidden states to a single-layer accumulator as
produced (one layer in memory); the analyses read one ``L``-layer accumulator.  Every accumulator keeps its per-layer
state in tensors with one row per layer, named in ``LAYER_STATE`` (``LAYER_LISTS`` for lists), so joining is a
concatenation; a class whose single-layer copies need their own state says so in ``own_layer_view()``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor

__all__ = ["stack_layers", "layer_views"]


def _layout(acc: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    cls = type(acc)
    if not hasattr(cls, "LAYER_STATE"):
        raise TypeError(f"stack_layers: {cls.__name__} declares no LAYER_STATE (its per-layer tensors)")
    return tuple(cls.LAYER_STATE), tuple(getattr(cls, "LAYER_LISTS", ()))


def stack_layers(accs: list, base: Any = None) -> Any:
    """Single-layer accumulators of one class, fed the same tokens layer by layer, as ONE accumulator of ``len(accs)``
    layers, equal to feeding it ``[L, N, d]`` batches (the anisotropy reservoirs share seed and calls). With ``base``
    (``layer_views``' source) rows updated in place are not copied: the float64 sums never exist twice."""
    first = accs[0]
    rows, lists = _layout(first)
    out = copy.copy(first) if base is None else base
    for name in rows:
        vals = [getattr(a, name) for a in accs]
        if vals[0] is None:
            setattr(out, name, None)
        elif base is None or not all(_is_row(v, getattr(base, name), i) for i, v in enumerate(vals)):
            setattr(out, name, torch.cat(vals))
    for name in lists:
        setattr(out, name, [x for a in accs for x in getattr(a, name)])
    for name, value in vars(first).items():  # shared counters (token counts, generator, n) from layer 0
        if name not in rows and name not in lists and name != "num_layers":
            setattr(out, name, value)
    out.num_layers = len(accs)
    return out


def _is_row(v, full, i: int) -> bool:
    return isinstance(full, Tensor) and v.data_ptr() == full[i:i + 1].data_ptr() and v.shape == full[i:i + 1].shape


def layer_views(full: Any) -> list:
    """Single-layer accumulators whose running tensors are rows of ``full`` (an ``L``-layer accumulator that
    declares ``LAYER_STATE``): their in-place updates fill ``full`` directly; ``stack_layers`` with
    ``base=full`` then gathers only what was reassigned (the whitener's shift, the running maxima)."""
    rows, lists = _layout(full)
    views = []
    for i in range(full.num_layers):
        v = copy.copy(full)
        for name in rows:
            t = getattr(full, name)
            if t is not None:
                setattr(v, name, t[i:i + 1])
        for name in lists:
            setattr(v, name, getattr(full, name)[i:i + 1])
        if hasattr(v, "own_layer_view"):
            v.own_layer_view()
        v.num_layers = 1
        views.append(v)
    return views
