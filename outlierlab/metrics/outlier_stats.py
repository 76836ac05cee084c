"""Per-layer statistics of hidden-state token vectors for outlier dimensions (Luo, Kulmizev & Mao 2021, §2).

Luo et al. (2021), "Positional Artefacts Propagate Through Masked Language Model Embeddings", average every layer's
(non-special, non-pad) token vectors and find a few dims with huge mean values that also hold each token's maximum or
minimum.  The paper's figure is an *argmin* share pooled over layers: in BERT-base dim 557 holds the minimum of 96.60%
of all token vectors of all non-input layers (``pooled_share``).  ``OutlierAccumulator`` collects these in one pass,
memory independent of the token count; ``outlierlab.metrics.outlier_dims`` decides which dims are outliers.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["valid_token_mask", "OutlierAccumulator", "pooled_share"]


def valid_token_mask(attention_mask: Tensor, special_tokens_mask: Tensor | None = None) -> Tensor:
    """Bool[B, T] of tokens that count for outlier statistics: not padding (``attention_mask`` 0) and not special
    (``special_tokens_mask`` 1, as HF tokenizers return it; None: only padding is excluded)."""
    valid = attention_mask.bool()
    if special_tokens_mask is not None:
        if special_tokens_mask.shape != attention_mask.shape:
            raise ValueError(f"special_tokens_mask {tuple(special_tokens_mask.shape)} and attention_mask "
                             f"{tuple(attention_mask.shape)} must have the same shape.")
        valid = valid & ~special_tokens_mask.bool()
    return valid


def _argmax_argmin_counts(h: Tensor) -> tuple[Tensor, Tensor]:
    """Per layer, how many of the ``N`` vectors of ``h [L, N, d]`` have their largest (smallest) component on each dim:
    two int64 ``[L, d]`` on ``h``'s device.

    On the CPU numpy's ``argmax``/``bincount`` are ~8x faster than torch's with the same indices (first of tied
    extremes, first NaN, ``-0.0 == 0.0``; tests/test_analysis_outliers.py compares them).  Other devices keep torch.
    """
    n_layers, _, d = h.shape
    if h.device.type == "cpu" and h.dtype in (torch.float32, torch.float64):
        a = h.numpy()
        base = (np.arange(n_layers) * d)[:, None]  # layer l counts into bins l*d .. l*d + d - 1
        return tuple(torch.from_numpy(np.bincount((arg(a, axis=-1) + base).ravel(), minlength=n_layers * d)
                                      .astype(np.int64, copy=False).reshape(n_layers, d))
                     for arg in (np.argmax, np.argmin))
    ones = torch.ones(h.shape[:2], dtype=torch.int64, device=h.device)
    amax = torch.zeros(n_layers, d, dtype=torch.int64, device=h.device).scatter_add_(1, h.argmax(-1), ones)
    amin = torch.zeros(n_layers, d, dtype=torch.int64, device=h.device).scatter_add_(1, h.argmin(-1), ones)
    return amax, amin


class OutlierAccumulator:
    r"""Streaming per-layer mean vector and argmax/argmin share per dimension (Luo et al. 2021 §2).

    For layer ``l`` over the ``n`` tokens seen so far:

    .. math:: \mu_l = \tfrac1n \sum_t h_{l,t},\qquad
              \text{argmax\_share}_{l,i} = \tfrac1n\,\#\{t : \arg\max_j h_{l,t,j} = i\}

    and likewise ``argmin_share``.  Sums float64, counts int64, memory O(L·d) on ``device`` (reductions run on the
    input's device).  For DDP, all-reduce (SUM) every tensor of ``tensors()`` in place (on the GPU under NCCL), or
    ``merge`` accumulators.
    """

    #: Running tensors with one row per layer (:func:`outlierlab.metrics.layer_accumulators.stack_layers` joins
    #: single-layer accumulators by them); every other attribute is shared by the layers.
    LAYER_STATE = ("sum", "argmax_counts", "argmin_counts")

    def __init__(self, num_layers: int, dim: int, device: torch.device | str | None = None):
        if num_layers < 1 or dim < 1:
            raise ValueError(f"num_layers and dim must be positive, got {num_layers}, {dim}.")
        self.num_layers, self.dim = int(num_layers), int(dim)
        dev = torch.device("cpu") if device is None else torch.device(device)
        self.sum = torch.zeros(num_layers, dim, dtype=torch.float64, device=dev)
        self.argmax_counts = torch.zeros(num_layers, dim, dtype=torch.int64, device=dev)
        self.argmin_counts = torch.zeros(num_layers, dim, dtype=torch.int64, device=dev)
        self.n_tokens = torch.zeros((), dtype=torch.int64, device=dev)

    # -- accumulation -------------------------------------------------------------------------
    def update(self, hidden: Tensor, mask: Tensor | None = None) -> None:
        """Add tokens: ``hidden`` [L, N, d] of valid tokens only (e.g. ``hs[:, valid_token_mask(...)]``), or [L, B, T,
        d] with a Bool[B, T] ``mask`` selecting ``hidden[:, mask]``."""
        if mask is not None:
            if hidden.ndim != 4 or tuple(hidden.shape[1:3]) != tuple(mask.shape):
                raise ValueError(f"with a mask, hidden must be [L, B, T, d] matching mask [B, T]; got "
                                 f"{tuple(hidden.shape)} and {tuple(mask.shape)}.")
            hidden = hidden[:, mask.to(hidden.device).bool()]
        if hidden.ndim != 3 or hidden.shape[0] != self.num_layers or hidden.shape[2] != self.dim:
            raise ValueError(f"hidden must be [L={self.num_layers}, N, d={self.dim}], got {tuple(hidden.shape)}.")
        h = hidden.detach()
        if h.shape[1] == 0:
            return
        dev = self.sum.device
        self.sum += h.sum(1, dtype=torch.float64).to(dev)  # float64 accumulation without a float64 copy
        amax, amin = _argmax_argmin_counts(h)
        self.argmax_counts += amax.to(dev)
        self.argmin_counts += amin.to(dev)
        self.n_tokens += h.shape[1]

    def merge(self, other: "OutlierAccumulator") -> "OutlierAccumulator":
        """Add another accumulator's counts into this one (in place); returns self."""
        if (other.num_layers, other.dim) != (self.num_layers, self.dim):
            raise ValueError(f"cannot merge accumulators of shape {(other.num_layers, other.dim)} "
                             f"into {(self.num_layers, self.dim)}.")
        for mine, theirs in zip(self.tensors(), other.tensors()):
            mine += theirs.to(mine.device)
        return self

    def tensors(self) -> list[Tensor]:
        """The raw running tensors ``[sum, argmax_counts, argmin_counts, n_tokens]`` (all SUM-reducible)."""
        return [self.sum, self.argmax_counts, self.argmin_counts, self.n_tokens]

    def to(self, device: torch.device | str) -> "OutlierAccumulator":
        """Move the running tensors (e.g. to the GPU before an NCCL all-reduce); returns self."""
        self.sum, self.argmax_counts, self.argmin_counts, self.n_tokens = (t.to(device) for t in self.tensors())
        return self

    def reset(self) -> None:
        for t in self.tensors():
            t.zero_()

    # -- results ------------------------------------------------------------------------------
    @property
    def count(self) -> int:
        """Number of tokens accumulated."""
        return int(self.n_tokens)

    def _check_nonempty(self) -> None:
        if self.count == 0:
            raise ValueError("OutlierAccumulator is empty: call update() with at least one valid token first.")

    def mean(self) -> Tensor:
        """Per-layer mean token vector, Tensor[L, d] float64."""
        self._check_nonempty()
        return self.sum / self.count

    def argmax_share(self) -> Tensor:
        """Share of tokens whose largest component is dim i, Tensor[L, d] float64 (rows sum to 1)."""
        self._check_nonempty()
        return self.argmax_counts.to(torch.float64) / self.count

    def argmin_share(self) -> Tensor:
        """Share of tokens whose smallest component is dim i, Tensor[L, d] float64 (rows sum to 1)."""
        self._check_nonempty()
        return self.argmin_counts.to(torch.float64) / self.count

    def stats(self) -> dict[str, Tensor]:
        """``{"mean", "argmax_share", "argmin_share"}``: the mapping
        ``outlierlab.metrics.outlier_dims.detect_outlier_dims`` accepts."""
        return {"mean": self.mean(), "argmax_share": self.argmax_share(), "argmin_share": self.argmin_share()}

    def pooled_share(self, which: str = "argmin", layers: slice | None = None) -> tuple[int, float]:
        """``pooled_share`` of this accumulator's counts (default: all non-input layers, 1..L-1)."""
        self._check_nonempty()
        counts = self.argmin_counts if which == "argmin" else self.argmax_counts if which == "argmax" else None
        if counts is None:
            raise ValueError(f"which must be 'argmin' or 'argmax', got {which!r}")
        return pooled_share(counts, self.count, layers)

    def summary(self, top_k: int = 5) -> list[dict]:
        """One flat record per layer: ``layer``, ``n_tokens``, ``top_dims``/``top_values`` (the ``top_k`` dims with
        largest |mean|), ``argmax_dim``/``argmax_share`` and ``argmin_dim``/``argmin_share``."""
        mean, smax, smin = self.mean(), self.argmax_share(), self.argmin_share()
        k = min(top_k, self.dim)
        top = mean.abs().topk(k, dim=-1).indices
        amax_share, amax_dim = smax.max(-1)
        amin_share, amin_dim = smin.max(-1)
        return [{
            "layer": layer, "n_tokens": self.count,
            "top_dims": top[layer].tolist(), "top_values": mean[layer, top[layer]].tolist(),
            "argmax_dim": int(amax_dim[layer]), "argmax_share": float(amax_share[layer]),
            "argmin_dim": int(amin_dim[layer]), "argmin_share": float(amin_share[layer]),
        } for layer in range(self.num_layers)]


def pooled_share(counts: Tensor, n_tokens: int, layers: slice | None = None) -> tuple[int, float]:
    r"""Luo et al. (2021) §2's pooled share: the dim holding the argmin (argmax) of the largest share of all token
    vectors of all non-input layers, as ``(dim, share)``.

    .. math:: \text{pooled}_i = \frac{\sum_{l \in \mathcal L} \#\{t : \arg\min_j h_{l,t,j} = i\}}
              {|\mathcal L|\cdot n}

    "dim 557 holds the minimum of 96.60% of all token vectors of BERT-base" is this for argmin over layers 1..12.  It is
    the mean of one *same* dim's per-layer shares, so it can be below every per-layer maximum.  ``counts`` [L+1, d]
    (layer 0 = embedding output), ``n_tokens`` per layer, ``layers`` default ``slice(1, None)``.
    """
    sel = counts[slice(1, None) if layers is None else layers]
    if sel.ndim != 2 or sel.shape[0] == 0:
        raise ValueError(f"no layer to pool: counts {tuple(counts.shape)}, layers {layers}")
    if n_tokens <= 0:
        raise ValueError("pooled_share needs n_tokens > 0")
    total = sel.to(torch.float64).sum(0)
    dim = int(total.argmax())
    return dim, float(total[dim] / (sel.shape[0] * n_tokens))
