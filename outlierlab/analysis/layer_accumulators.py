"""Accumulators of one layer joined into one of many layers, and split back (issue 39).

The one-pass evaluation (:mod:`outlierlab.evaluation.stream`) and probe.py's feature extraction
(:mod:`outlierlab.datamodules.features`) feed each layer's hidden states to a single-layer accumulator as the model
produces them (one layer in memory); the analyses read one ``L``-layer accumulator. Every accumulator class of
:mod:`outlierlab.analysis` keeps its per-layer state in tensors with one row per layer, so joining is a
concatenation of those rows -- listed here per class, since no class says which of its attributes are per layer.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor

from outlierlab.analysis.activations import ActivationAccumulator
from outlierlab.analysis.outlier_stats import OutlierAccumulator
from outlierlab.analysis.similarity import AnisotropyAccumulator, SelfSimilarityAccumulator
from outlierlab.analysis.transforms import Whitener

__all__ = ["stack_layers", "layer_views"]

#: Per class, the running tensors with one row per layer (concatenated by :func:`stack_layers`); every other
#: attribute (token counts, seeds, the whitener's hash multipliers) is the same in each single-layer instance.
_PER_LAYER = {
    OutlierAccumulator: ("sum", "argmax_counts", "argmin_counts"),
    Whitener: ("sum", "sum_outer", "shift"),
    ActivationAccumulator: ("sum_sq", "ratio_sum", "abs_argmax_counts", "max_abs", "max_dim", "max_token"),
    AnisotropyAccumulator: ("vectors",),
    SelfSimilarityAccumulator: ("sum_unit", "sum_sq", "sum_norm_sq"),
}
_PER_LAYER_LISTS = {Whitener: ("_hashes", "_distinct_stopped")}


def stack_layers(accs: list, base: Any = None) -> Any:
    """Single-layer accumulators of one class, fed the same tokens layer by layer, as ONE accumulator of
    ``len(accs)`` layers — equal to feeding that accumulator ``[L, N, d]`` batches (per-layer state is
    independent; the anisotropy reservoirs draw the same tokens because they share the seed and the calls).

    With ``base`` (the accumulator :func:`layer_views` made them from), tensors the accumulators updated in
    place are already ``base``'s rows and are not copied: the large float64 sums never exist twice."""
    first = accs[0]
    cls = _layout_class(first)
    out = copy.copy(first) if base is None else base
    for name in _PER_LAYER[cls]:
        vals = [getattr(a, name) for a in accs]
        if vals[0] is None:
            setattr(out, name, None)
        elif base is None or not all(_is_row(v, getattr(base, name), i) for i, v in enumerate(vals)):
            setattr(out, name, torch.cat(vals))
    for name in _PER_LAYER_LISTS.get(cls, ()):
        setattr(out, name, [x for a in accs for x in getattr(a, name)])
    for name, value in vars(first).items():  # shared counters (token counts, generator, n) from layer 0
        if name not in _PER_LAYER[cls] and name not in _PER_LAYER_LISTS.get(cls, ()):
            if name != "num_layers":
                setattr(out, name, value)
    out.num_layers = len(accs)
    return out


def _layout_class(acc: Any) -> type:
    """The class of :data:`_PER_LAYER` that ``acc`` is (or derives from)."""
    for c in type(acc).__mro__:
        if c in _PER_LAYER:
            return c
    raise TypeError(f"stack_layers: no per-layer layout for {type(acc).__name__}")


def _is_row(v, full, i: int) -> bool:
    return isinstance(full, Tensor) and v.data_ptr() == full[i:i + 1].data_ptr() and v.shape == full[i:i + 1].shape


def layer_views(full: Any) -> list:
    """Single-layer accumulators whose running tensors are rows of ``full`` (an ``L``-layer accumulator of a
    class in :data:`_PER_LAYER`): their in-place updates fill ``full`` directly; :func:`stack_layers` with
    ``base=full`` then gathers only what was reassigned (the whitener's shift, the running maxima)."""
    views, cls = [], _layout_class(full)
    for i in range(full.num_layers):
        v = copy.copy(full)
        for name in _PER_LAYER[cls]:
            t = getattr(full, name)
            if t is not None:
                setattr(v, name, t[i:i + 1])
        for name in _PER_LAYER_LISTS.get(cls, ()):
            setattr(v, name, getattr(full, name)[i:i + 1])
        if isinstance(full, AnisotropyAccumulator):  # each draws the same tokens: same seed, same calls
            v._gen = torch.Generator().manual_seed(full.seed)
        if isinstance(full, SelfSimilarityAccumulator):  # each counts the occurrences once (not L times)
            v.counts = full.counts.clone()
        v.num_layers = 1
        views.append(v)
    return views
