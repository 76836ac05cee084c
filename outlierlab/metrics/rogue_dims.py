r"""Rogue dimensions: each dimension's share of the anisotropy (Timkey & van Schijndel 2021, "All Bark and No Bite:
Rogue Dimensions in Transformer Language Models Obscure Representational Quality", §3).

The cosine of a pair splits exactly into one term per dimension,

.. math:: \cos(x, y) = \sum_i \frac{x_i\,y_i}{\lVert x\rVert\,\lVert y\rVert}, \qquad
          CC_i = \mathbb E_{(x,y)}\Big[\frac{x_i\,y_i}{\lVert x\rVert\,\lVert y\rVert}\Big], \qquad
          \sum_i CC_i = \mathbb E[\cos(x, y)] = \text{anisotropy},

over the anisotropy pairs (``similarity.paired_sentence_tokens``).  The top k dims' share ``\sum_{i\in\text{top}_k} CC_i
/ \sum_i CC_i`` says how much of the anisotropy they cause (Luo et al. 2021's "the outliers are the major cause of
anisotropy"); ``ranking_without_top`` measures how much the similarity *ranking* changes without them (r², Spearman).
Batched over layers ``[L, P, d]``, normalised as ``similarity.pairwise_cosine``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics.functional.regression import pearson_corrcoef

from outlierlab.metrics.sts_scores import spearman_columns

__all__ = ["cosine_contributions", "top_share", "share_defined", "ranking_without_top", "RogueSummary",
           "rogue_summary", "MIN_Z"]

#: A share of the anisotropy is reported only where the anisotropy differs from 0 by at least this many standard
#: errors (:func:`share_defined`): a share of a mean cosine indistinguishable from 0 (after centering,
#: standardizing, whitening) is a ratio of noise, not a fraction.
MIN_Z = 2.0

_EPS = 1e-8  # the eps of torch.nn.functional.cosine_similarity (and of pairwise_cosine)


def cosine_contributions(a: Tensor, b: Tensor, eps: float = _EPS) -> Tensor:
    r"""Per-dimension contribution to the mean pair cosine, ``CC_i = \tfrac1P\sum_p a_{p,i}b_{p,i}/(\lVert
    a_p\rVert\lVert b_p\rVert)`` (Timkey & van Schijndel 2021, Eq. 2).

    ``a, b``: paired Tensor[L, P, d] (or [P, d]), e.g. ``AnisotropyAccumulator.pair_vectors()``; norms are clamped at
    ``eps`` (a zero vector contributes 0).  Returns Tensor[L, d] float64 summing over d to the anisotropy.
    """
    if a.shape != b.shape:
        raise ValueError(f"paired vectors differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    if a.shape[-2] == 0:
        raise ValueError("cosine contributions need at least one pair")
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    na = a64.norm(dim=-1, keepdim=True).clamp_min(eps)
    nb = b64.norm(dim=-1, keepdim=True).clamp_min(eps)
    return (a64 * b64 / (na * nb)).mean(-2)


def top_share(cc: Tensor, k: int) -> Tensor:
    r"""Share of the anisotropy held by the k dims of largest ``CC_i``: ``\sum_{\text{top}_k} CC_i /
    \sum_i CC_i`` → Tensor[L] (NaN where the anisotropy is 0).  The top dims are ranked by signed
    ``CC_i`` (a dim that *raises* the mean cosine), as Timkey & van Schijndel rank them."""
    if not 1 <= k <= cc.shape[-1]:
        raise ValueError(f"top k must be in [1, {cc.shape[-1]}], got {k}")
    total = cc.sum(-1)
    top = cc.topk(k, dim=-1).values.sum(-1)
    return torch.where(total != 0, top / total, torch.full_like(total, float("nan")))


def share_defined(a: Tensor, b: Tensor, min_z: float = MIN_Z) -> Tensor:
    """Bool ``[L]``: the mean pair cosine of ``a``, ``b`` ``[L, P, d]`` is at least ``min_z`` standard errors
    (std of the P cosines / √P) away from 0, so a share of it means something."""
    cos = torch.nn.functional.cosine_similarity(a.to(torch.float64), b.to(torch.float64), dim=-1, eps=_EPS)
    if cos.shape[-1] < 2:
        return torch.zeros(cos.shape[:-1], dtype=torch.bool)
    se = cos.std(-1) / cos.shape[-1] ** 0.5
    return (cos.mean(-1).abs() >= min_z * se).cpu()


def ranking_without_top(a: Tensor, b: Tensor, dims: Tensor) -> tuple[Tensor, Tensor]:
    """How much the pair-similarity ranking changes without some dims (Timkey & van Schijndel 2021 §4).

    ``a, b``: paired Tensor[L, P, d]; ``dims``: LongTensor[L, k] to remove per layer.  Returns ``(r2, spearman)``,
    Tensor[L] float64 each, between the P pair cosines with every dim and with ``dims`` zeroed (NaN where constant).
    """
    if a.ndim != 3 or dims.ndim != 2 or dims.shape[0] != a.shape[0]:
        raise ValueError(f"expected a, b [L, P, d] and dims [L, k], got {tuple(a.shape)} and {tuple(dims.shape)}")
    if a.shape[1] < 3:
        raise ValueError(f"a ranking needs at least 3 pairs, got {a.shape[1]}")
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    full = torch.nn.functional.cosine_similarity(a64, b64, dim=-1, eps=_EPS)  # [L, P]
    keep = torch.ones(a.shape[0], a.shape[-1], dtype=torch.bool, device=a.device)
    keep.scatter_(1, dims.to(a.device), False)
    keep = keep[:, None, :]
    cut = torch.nn.functional.cosine_similarity(a64 * keep, b64 * keep, dim=-1, eps=_EPS)
    r2, rho = [], []
    for f, c in zip(full, cut):
        const = bool((f == f[0]).all()) or bool((c == c[0]).all())
        r2.append(float("nan") if const else float(pearson_corrcoef(f, c)) ** 2)
        rho.append(float(spearman_columns(c, f)[0]))
    return torch.tensor(r2, dtype=torch.float64), torch.tensor(rho, dtype=torch.float64)


class RogueSummary:
    """Everything the anisotropy table reports about rogue dims, per layer (``rogue_summary``).

    cc : Tensor[L, d] float64 — ``CC_i``; order : LongTensor[L, d] — dims by descending ``CC_i`` share : k -> Tensor[L]
    — share of the top k dims; NaN where the anisotropy is within ``min_z`` standard errors of 0 r2, spearman : k ->
    Tensor[L] — ranking with the top k removed (``ranking_without_top``)
    """

    def __init__(self, cc: Tensor, order: Tensor, share: dict, r2: dict, spearman: dict):
        self.cc, self.order, self.share, self.r2, self.spearman = cc, order, share, r2, spearman

    @property
    def anisotropy(self) -> Tensor:
        return self.cc.sum(-1)

    @classmethod
    def stack(cls, parts: Sequence["RogueSummary"]) -> "RogueSummary":
        """Summaries of single layers (each ``rogue_summary`` of ``[1, P, d]``) as one of ``len(parts)``
        layers — every quantity is per layer, so this equals the summary of ``[L, P, d]`` (what the anisotropy
        analysis does to keep one layer's float64 copies in memory)."""
        cat = torch.cat
        return cls(cat([p.cc for p in parts]), cat([p.order for p in parts]),
                   *({k: cat([getattr(p, f)[k] for p in parts]) for k in getattr(parts[0], f)}
                     for f in ("share", "r2", "spearman")))


def rogue_summary(a: Tensor, b: Tensor, ks: Sequence[int] = (1, 3, 5), min_z: float = MIN_Z) -> RogueSummary:
    """``cosine_contributions``, the top-k shares (where ``share_defined``) and
    ``ranking_without_top`` for each k in ``ks`` (Timkey & van Schijndel report k = 1, 3, 5), on paired
    vectors ``[L, P, d]``."""
    if a.ndim == 2:
        a, b = a[None], b[None]
    d = a.shape[-1]
    # a k outside 1..d has no top-k share: dropping it left its columns out of the tables without a word
    bad = [k for k in ks if not 1 <= int(k) <= d]
    if bad:
        raise ValueError(f"rogue k {bad} outside 1..{d}: the vectors have {d} dims, so a top-k share needs "
                         f"1 <= k <= {d}; lower anisotropy.rogue_k")
    cc = cosine_contributions(a, b)
    defined = share_defined(a, b, min_z)
    ks = [int(k) for k in ks]
    order = cc.argsort(dim=-1, descending=True)
    share, r2, rho = {}, {}, {}
    for k in ks:
        share[k] = torch.where(defined, top_share(cc, k), torch.full((cc.shape[0],), float("nan"), dtype=cc.dtype))
        r2[k], rho[k] = ranking_without_top(a, b, order[:, :k]) if a.shape[1] >= 3 else (
            torch.full((cc.shape[0],), float("nan"), dtype=torch.float64),) * 2
    return RogueSummary(cc, order, share, r2, rho)
