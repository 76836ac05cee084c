"""Post-hoc vector transforms: clipping outlier dims (Luo et al. 2021 §4), whitening (Su et al. 2021), standardization
(Timkey & van Schijndel 2021), all-but-the-top (Mu & Viswanath 2018) and mean removal.

All operate on batched layers ``[L, N, d]``.  The ONE definition of clip (``clip``, ``clip_dims_per_layer``) and of a
fitted transform applied by name (``FittedTransform``); the fitted affine maps are one ``Whitener`` each, fitted through
``outlierlab.metrics.transform_fit``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from outlierlab.metrics.postprocessing import FITTED
from outlierlab.metrics.whitening import MIN_FIT_RATIO, DegenerateWhiteningError, Whitener, WhiteningFit

__all__ = ["clip", "clip_mask", "clip_dims_per_layer", "clip_description", "Whitener", "WhiteningFit",
           "DegenerateWhiteningError", "FittedTransform", "TRANSFORMS", "FITTED", "MIN_FIT_RATIO"]

#: The transforms compared side by side (the last four fitted on data: :data:`FITTED`).
TRANSFORMS = ("none", "clip", *FITTED)


def _as_per_layer(dims, num_layers: int) -> list[list[int]]:
    """``dims`` as one list per layer: accepts a list of ints (shared), or a list of lists (per layer)."""
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    dims = list(dims)
    # a per-layer entry is any sized container (list, tuple, range, 1-D tensor/array); ints and 0-d
    # tensors are single dims
    nested = [hasattr(d, "__len__") and getattr(d, "ndim", 1) > 0 for d in dims]
    if dims and all(nested):
        if len(dims) != num_layers:
            raise ValueError(f"per-layer dims has {len(dims)} lists but the input has {num_layers} layers.")
        return [[int(x) for x in d] for d in dims]
    if any(nested):
        raise ValueError("dims must be a list of ints (same dims for every layer) or a list of lists (one per layer).")
    return [[int(x) for x in dims] for _ in range(num_layers)]


def clip_mask(dims, num_layers: int, dim: int, device: torch.device | str | None = None) -> Tensor:
    """Bool Tensor[L, d], True at the dims to clip (``dims`` as in ``clip``)."""
    per_layer = _as_per_layer(dims, num_layers)
    mask = torch.zeros(num_layers, dim, dtype=torch.bool, device=device)
    for layer, ds in enumerate(per_layer):
        bad = [x for x in ds if not -dim <= x < dim]
        if bad:
            raise ValueError(f"clip dims {bad} out of range for hidden size {dim}.")
        mask[layer, ds] = True
    return mask


def clip(x: Tensor, dims: Sequence[int] | Sequence[Sequence[int]]) -> Tensor:
    """Zero the given dimensions (Luo et al. 2021 §4: "clipping" the outlier dims); returns a new tensor.

    ``dims``: one list for every layer (any shape of ``x``), or one list per layer (``detect_outlier_dims``), the first
    axis of ``x`` [L, ..., d] being the layer axis.
    """
    if x.ndim < 2:
        raise ValueError(f"clip expects at least [N, d], got shape {tuple(x.shape)}.")
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    per_layer = _as_per_layer(dims, x.shape[0] if x.ndim >= 3 else 1) if len(dims) else [[]]
    shared = all(p == per_layer[0] for p in per_layer)
    mask = clip_mask([per_layer[0]] if shared else per_layer, 1 if shared else len(per_layer), x.shape[-1], x.device)
    mask = mask.view(mask.shape[0], *([1] * (x.ndim - 2)), x.shape[-1])
    if shared:
        mask = mask.view(*([1] * (x.ndim - 1)), x.shape[-1])
    return torch.where(mask, torch.zeros((), dtype=x.dtype, device=x.device), x)


_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


def clip_dims_per_layer(num_layers: int, dim: int, dims: Sequence[int] | None = None,
                        dims_by_layer: Mapping[str, Sequence[int]] | None = None,
                        detected: Sequence[Sequence[int]] | None = None) -> tuple[list[list[int]], str]:
    """The dims ``clip`` zeroes in each hidden state, and where they came from.

    Luo et al. 2021 (App. D.1) clip *given* dims in *given* layers, the non-input ones.  In order of precedence:

    * ``dims_by_layer={"1-12": [588, 77], "3": [12]}`` — per inclusive layer range (0 = embedding output); overlapping
      ranges unite their dims; unnamed layers are left unclipped.  The paper's form.
    * ``dims=[557]`` — the same dims in every hidden state, layer 0 included.
    * ``detected`` — per-layer dims from ``detect_outlier_dims`` on the fit data.

    Returns ``(per_layer, source)``: ``num_layers`` sorted lists and "given" / "given per layer range" / "detected".
    Raises ValueError for both forms, a malformed range, a layer or dim out of range, or nothing given.
    """
    if dims is not None and dims_by_layer:
        raise ValueError("give transform.dims (every layer) or transform.dims_by_layer (per layer range), not both")
    if dims_by_layer:
        per: list[set[int]] = [set() for _ in range(num_layers)]
        for key, ds in dict(dims_by_layer).items():
            m = _RANGE.match(str(key))
            if m is None:
                raise ValueError(f"transform.dims_by_layer key {key!r} is not a layer or an inclusive range "
                                 f"like \"1-{num_layers - 1}\"")
            lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
            if not 0 <= lo <= hi < num_layers:
                raise ValueError(f"transform.dims_by_layer range {key!r} is outside layers 0-{num_layers - 1} "
                                 "(0 = embedding output)")
            for layer in range(lo, hi + 1):
                per[layer].update(int(i) for i in ds)
        per_layer, source = [sorted(p) for p in per], "given per layer range (transform.dims_by_layer)"
    elif dims is not None:
        per_layer, source = [sorted({int(i) for i in dims}) for _ in range(num_layers)], "given (transform.dims)"
    elif detected is not None:
        per_layer, source = [sorted(int(i) for i in d) for d in detected], "detected"
        if len(per_layer) != num_layers:
            raise ValueError(f"detected dims for {len(per_layer)} layers, the encoder has {num_layers}")
    else:
        raise ValueError("clip needs transform.dims=[...], transform.dims_by_layer={...} or detected outlier dims")
    bad = sorted({i for d in per_layer for i in d if not 0 <= i < dim})
    if bad:
        raise ValueError(f"clip dims {bad} out of range for hidden size {dim}")
    return per_layer, source


def clip_description(dims: Sequence[Sequence[int]], source: str) -> str:
    """One line for reports: ``source (L0: -; L1: 588,77; ...)``."""
    per = "; ".join(f"L{i}: {','.join(map(str, d)) or '-'}" for i, d in enumerate(dims))
    return f"{source} ({per})"


@dataclass
class FittedTransform:
    """One fitted per-layer transform of ``[L, ..., d]`` vectors, applied by name: ``none``, ``clip`` (Luo et al. 2021
    §4) or one of ``FITTED`` (``whiten``, Su et al. 2021; ``standardize``; ``abtt``, Mu & Viswanath 2018; ``center``)
    whose map is ``whitener``.  ``info``: how it was obtained; ``fit``: the map's ``WhiteningFit``."""

    name: str
    dim: int
    clip_dims: list[list[int]] | None = None
    whitener: Whitener | None = None
    info: str = ""
    fit: WhiteningFit | None = None

    def __post_init__(self):
        if self.name not in TRANSFORMS:
            raise ValueError(f"unknown transform {self.name!r}; valid: {', '.join(TRANSFORMS)}")
        if self.name == "clip" and self.clip_dims is None:
            raise ValueError("a clip transform needs its per-layer dims")
        if self.name in FITTED and (self.whitener is None or self.whitener.W is None):
            raise ValueError(f"a {self.name} transform needs a fitted Whitener(method={self.name!r})")
        if self.name in FITTED and self.whitener.method != self.name:
            raise ValueError(f"a {self.name} transform got a Whitener fitted as {self.whitener.method}")

    @property
    def out_dim(self) -> int:
        return self.whitener.out_dim if self.name in FITTED else self.dim

    def __call__(self, x: Tensor) -> Tensor:
        if self.name == "clip":
            return clip(x, self.clip_dims)
        if self.name in FITTED:
            return self.whitener.transform(x)
        return x

    def select(self, layers: Sequence[int] | None) -> "FittedTransform":
        """The same transform restricted to ``layers``."""
        if layers is None:
            return self
        layers = list(layers)
        return FittedTransform(self.name, self.dim,
                               None if self.clip_dims is None else [self.clip_dims[i] for i in layers],
                               None if self.whitener is None else self.whitener.select(layers),
                               self.info, self.fit)

    def columns(self) -> dict:
        """CSV columns stating what a fitted result was fitted on (empty for none/clip)."""
        return self.fit.columns() if self.fit is not None else {}
