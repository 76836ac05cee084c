"""Which dimensions are outliers: the project's single rule and the ablation control draw.

``detect_outlier_dims`` turns ``outlierlab.metrics.outlier_stats.OutlierAccumulator`` statistics into outlier dims per
layer: Luo, Kulmizev & Mao (2021) §2's argmax/argmin share, or a 3σ rule on the mean vector. ``random_dims`` draws the
random-dims control of Kovaleva et al. (2021); ``position_row_stats`` reads the argmax/argmin shares off the rows of a
learned position table (Luo et al. §3, Figs. 3–4).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from outlierlab.metrics.layernorm import sigma_outlier_mask
from outlierlab.metrics.outlier_stats import OutlierAccumulator

__all__ = ["outlier_dims_by_share", "outlier_dims_by_sigma", "detect_outlier_dims", "random_dims", "position_row_stats",
           "DEFAULT_SHARE_THRESHOLD"]

#: Default share threshold for :func:`outlier_dims_by_share` (see its docstring for the reason).
DEFAULT_SHARE_THRESHOLD = 0.25


def outlier_dims_by_share(argmax_share: Tensor, argmin_share: Tensor,
                          threshold: float = DEFAULT_SHARE_THRESHOLD) -> list[list[int]]:
    r"""Luo et al.'s criterion: dims holding the argmax or argmin of at least ``threshold`` of tokens.

    .. math:: \text{outlier}_l = \{ i : \max(\text{argmax\_share}_{l,i},\ \text{argmin\_share}_{l,i})
              \ge \text{threshold} \}

    Why 0.25: without outlier structure each dim holds ~1/d of the argmaxes (0.13% at d = 768), while Luo et al.'s dim
    557 in BERT-base holds the minimum of 96.60% of tokens; a quarter is ~190× uniform at d = 768 and at most 4 dims per
    direction can reach it.  Caveat: a non-zero token-type embedding row can make one dim the argmax of 20-40% of tokens
    at random init (docs/design.md pitfalls); zero that row and record step-0 statistics.

    ``argmax_share, argmin_share``: Tensor[L, d] (or [d]).  Returns per layer the dims sorted by share, descending.
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

    The 3σ rule for LayerNorm weights (``layernorm.sigma_outlier_mask``, Kovaleva et al. 2021) applied to Luo et al.'s
    per-layer mean vector ``mean`` [L, d] (or [d]).  Returns per layer the dims sorted by |μ_i − mean(μ)|, descending.
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
    """THE outlier-dimension rule of the project (clip auto-detection, monitors, evaluate.py): dims per layer, strongest
    first.

    ``acc_or_stats``: an ``OutlierAccumulator`` or a mapping with ``argmax_share``/``argmin_share`` ("share") or
    ``mean`` ("sigma"), each [L, d].  ``method="share"`` (default) is ``outlier_dims_by_share`` with ``threshold``,
    ``"sigma"`` is ``outlier_dims_by_sigma`` with ``k``.

    "share" is Luo et al.'s own definition, scale-free and robust (does a dim *dominate* token vectors?).  The 3σ rule
    flags ~0.3% of dims of any Gaussian-looking vector (≈ 2 at d = 768) in every layer, so it over-detects in young or
    healthy models.
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
    """``n`` distinct random dims in ``[0, dim)`` avoiding ``exclude``, sorted: the ablation control draw.

    Kovaleva et al. (2021)'s control: disabling as many random dims as outlier dims shows the outliers' effect is not
    that of removing *any* few dims.  An int ``generator`` seeds a fresh generator (same seed, same dims).
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

    Averaging rows hides an artefact carried by single rows; Luo et al. look at every row (RoBERTa-base: dim 588 is the
    argmax of 99.8% of position embeddings).  Per row of ``table`` [P, d] (the rows actually used) this takes its
    argmax/argmin dim and its dims outside mean ± kσ of that row, then counts rows per dim.

    Returns ``rows`` (P); ``argmax``/``argmin`` LongTensor[P]; ``argmax_dim``/``argmax_share`` and
    ``argmin_dim``/``argmin_share`` (the dim most rows pick, and that share); ``sigma_mask`` Bool[P, d];
    ``sigma_row_share`` Tensor[d]; ``sigma_dims`` (dims flagged in at least half the rows, most rows first).
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
