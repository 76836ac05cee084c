"""Outlier dimensions in hidden-state activations (Luo, Kulmizev & Mao 2021, §2).

Luo et al. (2021), "Positional Artefacts Propagate Through Masked Language Model Embeddings", average
every layer's token vectors (non-special, non-pad tokens) and find a few dimensions whose mean value is
huge; per token, those dims also hold the vector's maximum or minimum.  The paper's figure is an
*argmin* share pooled over layers: in BERT-base dim 557 holds the minimum of 96.60% of all token vectors
of all non-input layers (:func:`pooled_share`).  :class:`OutlierAccumulator` collects exactly those
statistics in one pass, with memory independent of the number of tokens, and :func:`detect_outlier_dims`
is the single rule that turns them into a list of outlier dims (used by clip's auto-detection, the
monitors, evaluate.py).  :func:`position_row_stats` reads the same argmax/argmin shares off the rows of a
learned position table (Luo et al. §3, Figs. 3–4).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from analysis.layernorm import sigma_outlier_mask

__all__ = [
    "valid_token_mask",
    "OutlierAccumulator",
    "outlier_dims_by_share",
    "outlier_dims_by_sigma",
    "detect_outlier_dims",
    "random_dims",
    "pooled_share",
    "position_row_stats",
    "DEFAULT_SHARE_THRESHOLD",
]

#: Default share threshold for :func:`outlier_dims_by_share` (see its docstring for the reason).
DEFAULT_SHARE_THRESHOLD = 0.25


def valid_token_mask(attention_mask: Tensor, special_tokens_mask: Tensor | None = None) -> Tensor:
    """Bool mask of tokens that count for outlier statistics: not padding and not special.

    Parameters
    ----------
    attention_mask : Tensor[B, T]
        1 (or True) for real tokens, 0 for padding (HF convention).
    special_tokens_mask : Tensor[B, T] or None
        1 for special tokens (``<s>``, ``</s>``, ``[CLS]``...; HF tokenizers return it with
        ``return_special_tokens_mask=True``).  None: only padding is excluded.

    Returns
    -------
    Tensor[B, T] (bool)
    """
    valid = attention_mask.bool()
    if special_tokens_mask is not None:
        if special_tokens_mask.shape != attention_mask.shape:
            raise ValueError(f"special_tokens_mask {tuple(special_tokens_mask.shape)} and attention_mask "
                             f"{tuple(attention_mask.shape)} must have the same shape.")
        valid = valid & ~special_tokens_mask.bool()
    return valid


class OutlierAccumulator:
    r"""Streaming per-layer mean vector and argmax/argmin share per dimension (Luo et al. 2021 §2).

    For layer ``l`` over the ``n`` tokens seen so far:

    .. math:: \mu_l = \tfrac1n \sum_t h_{l,t},\qquad
              \text{argmax\_share}_{l,i} = \tfrac1n\,\#\{t : \arg\max_j h_{l,t,j} = i\}

    and likewise ``argmin_share``.  Running sums are float64, counts int64; memory is O(L·d).

    Parameters
    ----------
    num_layers, dim : int
        L and d of the hidden states that :meth:`update` will receive.
    device : torch.device or str, optional
        Where the running tensors live (default CPU).  Reductions run on the input's device, only the
        [L, d] results are moved.

    Notes
    -----
    For DDP, all-reduce (SUM) every tensor of :meth:`tensors` in place, e.g.
    ``for t in acc.tensors(): torch.distributed.all_reduce(t)`` (move the accumulator to the GPU
    first with :meth:`to` under NCCL); or :meth:`merge` accumulators by hand.
    """

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
        """Add tokens.

        Parameters
        ----------
        hidden : Tensor[L, N, d]
            Token vectors of the valid tokens only (the caller selects them, e.g.
            ``hs[:, valid_token_mask(...)]`` on a stacked ``[L, B, T, d]`` tensor), or ``[L, B, T, d]``
            together with ``mask``.
        mask : Tensor[B, T] (bool), optional
            If given, ``hidden`` is ``[L, B, T, d]`` and only ``hidden[:, mask]`` is used.
        """
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
        self.sum += h.to(torch.float64).sum(1).to(dev)
        ones = torch.ones(h.shape[:2], dtype=torch.int64, device=h.device)
        amax = torch.zeros(self.num_layers, self.dim, dtype=torch.int64, device=h.device)
        amin = torch.zeros_like(amax)
        self.argmax_counts += amax.scatter_add_(1, h.argmax(-1), ones).to(dev)
        self.argmin_counts += amin.scatter_add_(1, h.argmin(-1), ones).to(dev)
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
        """``{"mean", "argmax_share", "argmin_share"}``: the mapping :func:`detect_outlier_dims` accepts."""
        return {"mean": self.mean(), "argmax_share": self.argmax_share(), "argmin_share": self.argmin_share()}

    def pooled_share(self, which: str = "argmin", layers: slice | None = None) -> tuple[int, float]:
        """:func:`pooled_share` of this accumulator's counts (default: all non-input layers, 1..L-1)."""
        self._check_nonempty()
        counts = self.argmin_counts if which == "argmin" else self.argmax_counts if which == "argmax" else None
        if counts is None:
            raise ValueError(f"which must be 'argmin' or 'argmax', got {which!r}")
        return pooled_share(counts, self.count, layers)

    def summary(self, top_k: int = 5) -> list[dict]:
        """One flat record per layer.

        Keys: ``layer``, ``n_tokens``, ``top_dims`` (list of the ``top_k`` dims with largest |mean|),
        ``top_values`` (their mean values), ``argmax_dim`` / ``argmax_share`` (the dim most often
        holding the token's maximum and its share), ``argmin_dim`` / ``argmin_share``.
        """
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


def outlier_dims_by_share(argmax_share: Tensor, argmin_share: Tensor,
                          threshold: float = DEFAULT_SHARE_THRESHOLD) -> list[list[int]]:
    r"""Luo et al.'s criterion: dims holding the argmax or argmin of at least ``threshold`` of tokens.

    .. math:: \text{outlier}_l = \{ i : \max(\text{argmax\_share}_{l,i},\ \text{argmin\_share}_{l,i})
              \ge \text{threshold} \}

    Why 0.25 by default: with no outlier structure each dim holds ~1/d of the argmaxes (0.13% at
    d = 768), while the dim Luo et al. report (557 in BERT-base) holds the minimum of 96.60% of token
    vectors.  A quarter of all tokens is ~190× the
    uniform rate at d = 768 (~64× at d = 256), and at most 4 dims per direction can reach it, so the
    rule never returns a long list.  Caveat: a non-zero token-type embedding row can make one dim the
    argmax of 20-40% of tokens at random init (DESIGN.md pitfalls), which this threshold would flag;
    zero that row and record step-0 statistics.

    Parameters
    ----------
    argmax_share, argmin_share : Tensor[L, d] (or [d])
    threshold : float in (0, 1]

    Returns
    -------
    list[list[int]]
        Per layer, the outlier dims sorted by their (larger) share, descending.
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"share threshold must be in (0, 1], got {threshold}.")
    smax, smin = torch.atleast_2d(argmax_share), torch.atleast_2d(argmin_share)
    if smax.shape != smin.shape:
        raise ValueError(f"argmax_share {tuple(smax.shape)} and argmin_share {tuple(smin.shape)} differ.")
    share = torch.maximum(smax, smin).to(torch.float64)
    return [_sorted_dims(share[i] >= threshold, share[i]) for i in range(share.shape[0])]


def outlier_dims_by_sigma(mean: Tensor, k: float = 3.0) -> list[list[int]]:
    r"""Dims whose mean activation lies outside mean ± kσ of that layer's mean vector.

    .. math:: \text{outlier}_l = \{ i : |\mu_{l,i} - \bar\mu_l| > k\,\sigma(\mu_l) \}

    The same 3σ rule as for LayerNorm weights (:func:`analysis.layernorm.sigma_outlier_mask`,
    Kovaleva et al. 2021), applied to Luo et al.'s per-layer mean vector.

    Parameters
    ----------
    mean : Tensor[L, d] (or [d])
    k : float

    Returns
    -------
    list[list[int]]
        Per layer, flagged dims sorted by |μ_i − mean(μ)| descending.
    """
    m = torch.atleast_2d(mean).to(torch.float64)
    mask = sigma_outlier_mask(m, k)
    dev = (m - m.mean(-1, keepdim=True)).abs()
    return [_sorted_dims(mask[i], dev[i]) for i in range(m.shape[0])]


def _sorted_dims(mask: Tensor, score: Tensor) -> list[int]:
    idx = mask.nonzero().flatten()
    return idx[score[idx].argsort(descending=True, stable=True)].tolist()


def detect_outlier_dims(acc_or_stats: "OutlierAccumulator | Mapping[str, Tensor]", method: str = "share",
                        threshold: float = DEFAULT_SHARE_THRESHOLD, k: float = 3.0) -> list[list[int]]:
    """THE outlier-dimension rule of the project (clip auto-detection, monitors, evaluate.py).

    Parameters
    ----------
    acc_or_stats : OutlierAccumulator or Mapping
        An accumulator, or a mapping with ``argmax_share`` and ``argmin_share`` (method "share") or
        ``mean`` (method "sigma"), each Tensor[L, d] — e.g. :meth:`OutlierAccumulator.stats`.
    method : {"share", "sigma"}
        ``"share"`` (default): :func:`outlier_dims_by_share` with ``threshold``.  ``"sigma"``:
        :func:`outlier_dims_by_sigma` with ``k``.
    threshold, k : float

    Returns
    -------
    list[list[int]]
        Outlier dims per layer, strongest first.

    Notes
    -----
    Default "share" because it is Luo et al.'s own definition and it is scale-free and robust: it asks
    whether a dim *dominates* token vectors.  The 3σ rule on the mean vector flags by chance ~0.3% of
    dims of any Gaussian-looking vector (≈ 2 dims at d = 768) and flags dims in every layer even when
    no dim dominates any token, so it over-detects in young or healthy models.
    """
    if isinstance(acc_or_stats, OutlierAccumulator):
        acc_or_stats = acc_or_stats.stats()
    if method == "share":
        missing = {"argmax_share", "argmin_share"} - set(acc_or_stats)
        if missing:
            raise ValueError(f"method='share' needs keys argmax_share and argmin_share; missing {sorted(missing)}.")
        return outlier_dims_by_share(acc_or_stats["argmax_share"], acc_or_stats["argmin_share"], threshold)
    if method == "sigma":
        if "mean" not in acc_or_stats:
            raise ValueError("method='sigma' needs the key 'mean' (Tensor[L, d]).")
        return outlier_dims_by_sigma(acc_or_stats["mean"], k)
    raise ValueError(f"unknown outlier detection method {method!r}; use 'share' or 'sigma'.")


def random_dims(dim: int, n: int, exclude: Iterable[int] = (),
                generator: torch.Generator | int | None = None) -> list[int]:
    """``n`` distinct random dims in ``[0, dim)`` that avoid ``exclude`` — the ablation control draw.

    The control of Kovaleva et al. (2021): disabling as many random dims as outlier dims shows that the
    effect of disabling the outliers is not that of removing *any* few dims.

    Parameters
    ----------
    dim : int
    n : int
    exclude : Iterable[int]
        Dims never returned (the outlier dims).
    generator : torch.Generator or int seed or None
        An int seeds a fresh generator, so the same seed gives the same dims.

    Returns
    -------
    list[int], sorted ascending.
    """
    excl = {int(e) for e in exclude}
    bad = [e for e in excl if not 0 <= e < dim]
    if bad:
        raise ValueError(f"exclude holds dims outside [0, {dim}): {sorted(bad)}.")
    pool = torch.tensor([i for i in range(dim) if i not in excl], dtype=torch.long)
    if not 0 <= n <= len(pool):
        raise ValueError(f"cannot draw {n} dims from {len(pool)} available (dim={dim}, {len(excl)} excluded).")
    if isinstance(generator, int):
        generator = torch.Generator().manual_seed(generator)
    pick = torch.randperm(len(pool), generator=generator)[:n]
    return sorted(pool[pick].tolist())


def pooled_share(counts: Tensor, n_tokens: int, layers: slice | None = None) -> tuple[int, float]:
    r"""Luo et al. (2021) §2's pooled share: the dim holding the argmin (argmax) of the largest share of
    all token vectors of all non-input layers.

    .. math:: \text{pooled}_i = \frac{\sum_{l \in \mathcal L} \#\{t : \arg\min_j h_{l,t,j} = i\}}
              {|\mathcal L|\cdot n}

    Luo et al.'s "dim 557 holds the minimum of 96.60% of all token vectors of BERT-base" is this number
    for argmin counts over layers 1..12 (the embedding output, layer 0, left out).  Each layer sees the
    same n tokens, so this equals the mean over those layers of the per-layer shares of one dim — but of
    the *same* dim in every layer, which is why it can be lower than every per-layer maximum.

    Parameters
    ----------
    counts : Tensor[L+1, d]
        argmin (or argmax) counts per layer, layer 0 = embedding output (:class:`OutlierAccumulator`).
    n_tokens : int
        Tokens counted per layer.
    layers : slice, optional
        Layers pooled; default ``slice(1, None)`` (all non-input layers).  A single-layer model pools
        layer 0 only if asked.

    Returns
    -------
    (dim, share) : the dim with the largest pooled count, and its share in [0, 1].
    """
    sel = counts[slice(1, None) if layers is None else layers]
    if sel.ndim != 2 or sel.shape[0] == 0:
        raise ValueError(f"no layer to pool: counts {tuple(counts.shape)}, layers {layers}")
    if n_tokens <= 0:
        raise ValueError("pooled_share needs n_tokens > 0")
    total = sel.to(torch.float64).sum(0)
    dim = int(total.argmax())
    return dim, float(total[dim] / (sel.shape[0] * n_tokens))


def position_row_stats(table: Tensor, k: float = 3.0) -> dict:
    r"""Row-by-row outlier statistics of a position-embedding table (Luo et al. 2021 §3, Figs. 3–4).

    Averaging the rows (one mean position vector) hides an artefact carried by single rows; Luo et al.
    look at every row: in RoBERTa-base dim 588 is the argmax of 99.8% of the position embeddings.  For
    each row p of ``table`` this takes its argmax and argmin dim and its dims outside mean ± kσ *of that
    row* (:func:`analysis.layernorm.sigma_outlier_mask` on the row), then counts rows per dim.

    Parameters
    ----------
    table : Tensor[P, d]
        The rows actually used (e.g. without RoBERTa's padding rows).
    k : float

    Returns
    -------
    dict with
        ``rows`` (P); ``argmax`` / ``argmin`` LongTensor[P] (per-row dim); ``argmax_dim``,
        ``argmax_share`` (the dim most rows have as argmax, and that share of rows), ``argmin_dim``,
        ``argmin_share``; ``sigma_mask`` Bool[P, d] (per-row kσ dims); ``sigma_row_share`` Tensor[d]
        (share of rows flagging each dim); ``sigma_dims`` (dims flagged in at least half the rows, most
        rows first).
    """
    t = table.detach().to(torch.float64)
    if t.ndim != 2 or t.shape[0] == 0:
        raise ValueError(f"position table must be [P >= 1, d], got {tuple(t.shape)}")
    p, d = t.shape
    out: dict = {"rows": p}
    for what, idx in (("argmax", t.argmax(-1)), ("argmin", t.argmin(-1))):
        counts = torch.bincount(idx, minlength=d)
        out[what] = idx
        out[f"{what}_dim"] = int(counts.argmax())
        out[f"{what}_share"] = float(counts.max()) / p
    mask = sigma_outlier_mask(t, k)
    row_share = mask.to(torch.float64).mean(0)
    out["sigma_mask"], out["sigma_row_share"] = mask, row_share
    out["sigma_dims"] = _sorted_dims(row_share >= 0.5, row_share)
    return out
