"""Which dimensions are outliers: the project's single rule and the ablation control draw.

``detect_outlier_dims`` turns the statistics of ``outlierlab.metrics.outlier_stats.OutlierAccumulator``
into a list of outlier dims per layer (used by clip's auto-detection, the monitors, evaluate.py): by
default Luo, Kulmizev & Mao (2021) §2's argmax/argmin share, or a 3σ rule on the mean vector.
``random_dims`` draws the random-dims control of Kovaleva et al. (2021), and
``position_row_stats`` reads the same argmax/argmin shares off the rows of a learned position
table (Luo et al. §3, Figs. 3–4).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from outlierlab.metrics.layernorm import sigma_outlier_mask
from outlierlab.metrics.outlier_stats import OutlierAccumulator

__all__ = [
    "outlier_dims_by_share",
    "outlier_dims_by_sigma",
    "detect_outlier_dims",
    "random_dims",
    "position_row_stats",
    "DEFAULT_SHARE_THRESHOLD",
]

#: Default share threshold for :func:`outlier_dims_by_share` (see its docstring for the reason).
DEFAULT_SHARE_THRESHOLD = 0.25


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
    argmax of 20-40% of tokens at random init (docs/design.md pitfalls), which this threshold would flag;
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

    The same 3σ rule as for LayerNorm weights (``outlierlab.metrics.layernorm.sigma_outlier_mask``,
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
        ``mean`` (method "sigma"), each Tensor[L, d] — e.g. ``OutlierAccumulator.stats``.
    method : {"share", "sigma"}
        ``"share"`` (default): ``outlier_dims_by_share`` with ``threshold``.  ``"sigma"``:
        ``outlier_dims_by_sigma`` with ``k``.
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


def position_row_stats(table: Tensor, k: float = 3.0) -> dict:
    r"""Row-by-row outlier statistics of a position-embedding table (Luo et al. 2021 §3, Figs. 3–4).

    Averaging the rows (one mean position vector) hides an artefact carried by single rows; Luo et al.
    look at every row: in RoBERTa-base dim 588 is the argmax of 99.8% of the position embeddings.  For
    each row p of ``table`` this takes its argmax and argmin dim and its dims outside mean ± kσ *of that
    row* (``outlierlab.metrics.layernorm.sigma_outlier_mask`` on the row), then counts rows per dim.

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
