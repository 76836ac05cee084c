"""Continuous outlier-feature metrics of the residual stream: activation kurtosis and max/median ratio.

Luo et al. (2021)'s argmax question is a yes/no event that in small models comes late or never; the later literature
measures the phenomenon on a continuous scale that rises long before:

* **activation kurtosis** (He, Noci, Paliotta, Schlag & Hofmann 2024, "Understanding and Minimising
  Outlier Features in Transformer Training", NeurIPS 2024, Eq. 1): how unequal the per-dim RMS is, 1 when every
  dim has the same RMS, d when one dim holds all the energy;
* **max / median ratio** (He et al. 2024; Sun, Chen, Kolter & Liu 2024, "Massive Activations in Large
  Language Models"): per token, the largest |activation| against the median one; "massive" activations are
  ≫ 100 in large models (Pythia-14M peaks near 83).

Each has a one-shot function and a streaming ``ActivationAccumulator`` whose result equals it on all tokens at once.
Token vectors come selected, ``[..., N, d]``, or as ``[..., B, T, d]`` with a ``[B, T]`` bool mask of the tokens that
count (``outlierlab.metrics.outlier_stats.valid_token_mask``).  Leading dims (e.g. layers) are kept.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["select_tokens", "activation_kurtosis", "kurtosis_from_mean_squares", "max_median_ratio",
           "ActivationAccumulator"]


def select_tokens(x: Tensor, mask: Tensor | None = None) -> Tensor:
    """``x[..., N, d]`` as given (mask None) or ``x[..., mask, :]`` for ``x[..., B, T, d]`` and ``mask[B, T]``."""
    if mask is None:
        if x.ndim < 2:
            raise ValueError(f"token vectors must be [..., N, d], got shape {tuple(x.shape)}")
        return x
    if mask.ndim != 2 or x.ndim < 3 or tuple(x.shape[-3:-1]) != tuple(mask.shape):
        raise ValueError(f"with a mask [B, T], x must be [..., B, T, d]; got x {tuple(x.shape)}, "
                         f"mask {tuple(mask.shape)}")
    return x[..., mask.to(x.device).bool(), :]


def kurtosis_from_mean_squares(mean_sq: Tensor) -> Tensor:
    r"""Kurtosis of the per-dim RMS from the per-dim mean squares ``m_i = mean_t x_{t,i}^2`` (``[..., d]``).

    .. math:: \mathrm{Kurt} = \frac{\tfrac1d\sum_i s_i^4}{\big(\tfrac1d\sum_i s_i^2\big)^2},\qquad s_i^2 = m_i

    A zero vector (no energy at all) gives NaN rather than a division error.
    """
    m = mean_sq.to(torch.float64)
    return m.square().mean(-1) / m.mean(-1).square()  # 0/0 -> NaN in torch, no exception


def activation_kurtosis(x: Tensor, mask: Tensor | None = None) -> Tensor:
    r"""Activation kurtosis of the residual stream (He et al. 2024, Eq. 1).

    With ``s_i = \sqrt{\tfrac1N\sum_t x_{t,i}^2}`` the RMS of dim ``i`` over the N tokens,

    .. math:: \mathrm{Kurt}(x) = \frac{\tfrac1d\sum_i s_i^4}{\big(\tfrac1d\sum_i s_i^2\big)^2}

    1 exactly when every dim has the same RMS, d when one dim holds all the energy (Cauchy–Schwarz: [1, d]).  The
    uncentred second moment is He et al.'s (an outlier dim shows through a large mean as much as a large variance).
    ``x``: [..., N, d], or [..., B, T, d] with ``mask``.  Returns Tensor[...] float64 (a scalar for [N, d]).
    """
    t = select_tokens(x, mask)
    if t.shape[-2] == 0:
        raise ValueError("activation_kurtosis: no token selected (the mask is all False)")
    return kurtosis_from_mean_squares(_sum_squares(t.detach()) / t.shape[-2])


def _sum_squares(t: Tensor, in_place: bool = False) -> Tensor:
    """Σ over tokens of x² per dim, float64: squares in float32 (relative rounding 6e-8; bf16/fp16 are
    upcast first), summed in float64 — 7x cheaper than a float64 copy of every token.
    ``in_place``: ``t`` is the caller's scratch (e.g. its own |x|), squared where it is (no second copy)."""
    if t.dtype not in (torch.float32, torch.float64):
        t, in_place = t.float(), True
    return (t.square_() if in_place else t.square()).sum(-2, dtype=torch.float64)


def _token_ratios(t: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per token ``max_i|x| / median_i|x|`` (float64), the per-token max and its dim; median = mean of the two middle
    values.  |x| is exact in any float dtype, so order statistics are taken there, only the ratio in float64."""
    a = t.detach().abs()
    if not a.is_floating_point():
        a = a.to(torch.float64)
    d = a.shape[-1]
    srt = _sorted_last(a)
    median = 0.5 * (srt[..., (d - 1) // 2].to(torch.float64) + srt[..., d // 2].to(torch.float64))
    if a.device.type == "cpu" and a.dtype in (torch.float32, torch.float64):
        # the max is the sort's last value (NaN sorts last, as max propagates it); numpy's SIMD argmax finds
        # its dim (the first of ties, the first NaN, as Tensor.max) in a third of Tensor.max's time
        top = srt[..., -1]
        top_dim = torch.from_numpy(np.argmax(a.numpy(), axis=-1).astype(np.int64, copy=False))
    else:
        top, top_dim = a.max(-1)
    return top.to(torch.float64) / median.clamp_min(eps), a, top, top_dim


def _sorted_last(a: Tensor) -> Tensor:
    """``a`` sorted along its last dim.  On the CPU numpy's SIMD sort (x86-simd-sort) is ~25x faster than
    ``Tensor.sort`` for float32 rows of a few hundred values (0.5 ms against 12 ms for 1,000 x 384 on one
    core): the per-token sort had cost more than a small model's forward."""
    if a.device.type == "cpu" and a.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(np.sort(a.numpy(), axis=-1))
    return a.sort(-1).values


def max_median_ratio(x: Tensor, mask: Tensor | None = None, eps: float = 1e-12) -> dict[str, Tensor]:
    r"""Mean over tokens of the max-to-median |activation| ratio, and the largest |activation| seen.

    .. math:: \mathrm{MMR} = \frac1N\sum_t \frac{\max_i |x_{t,i}|}{\operatorname{median}_i |x_{t,i}|}

    (He et al. 2024 track it in training; Sun et al. 2024 call ratios in the thousands "massive").  An even number of
    dims takes the mean of the two middle values (numpy's convention); a zero median uses ``eps`` (a huge ratio, not
    NaN).

    Returns Tensor[...] ``ratio`` and ``max_abs`` (float64), ``max_dim`` and ``max_token`` (index among the N selected
    tokens; with a mask, into ``mask.nonzero()``, row-major over [B, T]).
    """
    t = select_tokens(x, mask)
    n, d = t.shape[-2], t.shape[-1]
    if n == 0:
        raise ValueError("max_median_ratio: no token selected (the mask is all False)")
    ratio, a, _, _ = _token_ratios(t, eps)
    flat = a.flatten(-2).argmax(-1)
    return {"ratio": ratio.mean(-1), "max_abs": a.flatten(-2).max(-1).values.to(torch.float64),
            "max_dim": flat % d, "max_token": flat // d}


class ActivationAccumulator:
    """Streaming ``activation_kurtosis`` and ``max_median_ratio`` per layer over batches.

    Keeps per layer the float64 sum of squares per dim, the sum of per-token ratios, the running largest |x| with its
    dim and token, and per dim the count of tokens whose largest |x| falls there (the |x| form of Luo et al.'s argmax
    share; docs/design.md notes the two can disagree in small models).  Memory O(L·d); equals the one-shot functions up
    to float64 summation order.
    """

    #: Running tensors with one row per layer (:func:`outlierlab.metrics.layer_accumulators.stack_layers`).
    LAYER_STATE = ("sum_sq", "ratio_sum", "abs_argmax_counts", "max_abs", "max_dim", "max_token")

    def __init__(self, num_layers: int, dim: int) -> None:
        if num_layers < 1 or dim < 1:
            raise ValueError(f"num_layers and dim must be positive, got {num_layers}, {dim}")
        self.num_layers, self.dim = int(num_layers), int(dim)
        self.sum_sq = torch.zeros(num_layers, dim, dtype=torch.float64)
        self.ratio_sum = torch.zeros(num_layers, dtype=torch.float64)
        self.abs_argmax_counts = torch.zeros(num_layers, dim, dtype=torch.int64)
        self.max_abs = torch.full((num_layers,), -1.0, dtype=torch.float64)
        self.max_dim = torch.zeros(num_layers, dtype=torch.int64)
        self.max_token = torch.zeros(num_layers, dtype=torch.int64)
        self.n_tokens = 0

    def update(self, hidden: Tensor, mask: Tensor | None = None, eps: float = 1e-12) -> None:
        """Add tokens: ``hidden`` [L, N, d] (selected tokens) or [L, B, T, d] with ``mask`` [B, T].

        Token indices (``max_token``) continue across calls: the k-th token ever passed has index k-1.
        """
        t = select_tokens(hidden, mask)
        if t.ndim != 3 or t.shape[0] != self.num_layers or t.shape[2] != self.dim:
            raise ValueError(f"hidden must be [L={self.num_layers}, N, d={self.dim}] after masking, "
                             f"got {tuple(t.shape)}")
        n = t.shape[1]
        if n == 0:
            return
        ratio, a, per_token_max, per_token_dim = _token_ratios(t, eps)  # max and its dim: [L, N]
        self.sum_sq += _sum_squares(a, in_place=True).cpu()  # |x| is ours and not read after this
        self.ratio_sum += ratio.sum(1).cpu()
        per_token_max = per_token_max.to(torch.float64)
        if per_token_dim.device.type == "cpu":  # numpy's bincount: no [L, N] ones, no scatter
            flat = (per_token_dim + torch.arange(self.num_layers)[:, None] * self.dim).flatten().numpy()
            self.abs_argmax_counts += torch.from_numpy(np.bincount(flat, minlength=self.num_layers * self.dim)
                                                       .astype(np.int64, copy=False)).view(self.num_layers, self.dim)
        else:
            ones = torch.ones_like(per_token_dim)
            self.abs_argmax_counts += torch.zeros(self.num_layers, self.dim, dtype=torch.int64, device=a.device
                                                  ).scatter_add_(1, per_token_dim, ones).cpu()
        best, tok = per_token_max.max(-1)  # [L]
        better = (best.cpu() > self.max_abs)
        self.max_abs = torch.where(better, best.cpu(), self.max_abs)
        self.max_dim = torch.where(better, per_token_dim.gather(1, tok[:, None])[:, 0].cpu(), self.max_dim)
        self.max_token = torch.where(better, tok.cpu() + self.n_tokens, self.max_token)
        self.n_tokens += n

    def _check(self) -> None:
        if self.n_tokens == 0:
            raise ValueError("ActivationAccumulator is empty: update() it with at least one token first")

    def kurtosis(self) -> Tensor:
        """Tensor[L] float64, ``activation_kurtosis`` of all tokens seen."""
        self._check()
        return kurtosis_from_mean_squares(self.sum_sq / self.n_tokens)

    def max_median(self) -> Tensor:
        """Tensor[L] float64, the ``ratio`` of ``max_median_ratio`` over all tokens seen."""
        self._check()
        return self.ratio_sum / self.n_tokens

    def abs_argmax_share(self) -> Tensor:
        """Tensor[L, d]: share of tokens whose largest |x| is on each dim (rows sum to 1)."""
        self._check()
        return self.abs_argmax_counts.to(torch.float64) / self.n_tokens

    def summary(self) -> list[dict]:
        """One record per layer: ``kurtosis``, ``max_median``, ``max_abs``, ``max_abs_dim``,
        ``max_abs_token`` (index among all tokens seen), ``abs_argmax_dim``, ``abs_argmax_share``."""
        kurt, mmr, share = self.kurtosis(), self.max_median(), self.abs_argmax_share()
        top_share, top_dim = share.max(-1)
        return [{"kurtosis": float(kurt[i]), "max_median": float(mmr[i]), "max_abs": float(self.max_abs[i]),
                 "max_abs_dim": int(self.max_dim[i]), "max_abs_token": int(self.max_token[i]),
                 "abs_argmax_dim": int(top_dim[i]), "abs_argmax_share": float(top_share[i])}
                for i in range(self.num_layers)]
