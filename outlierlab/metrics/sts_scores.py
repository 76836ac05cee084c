"""Semantic Textual Similarity by cosine (Luo et al. 2021 §4.3; SentEval, Conneau & Kiela 2018).

Sentence vector = mean of its token vectors (per layer); score of a pair = cosine of the two sentence
vectors; quality = Spearman's ρ between those cosines and the gold similarity scores.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchmetrics.functional.regression import spearman_corrcoef

__all__ = ["spearman_columns", "sts_spearman"]


def spearman_columns(values: Tensor, target: Tensor) -> Tensor:
    """Spearman's ρ of every column of ``values`` [P, C] with ``target`` [P] → Tensor[C] float64 (torchmetrics, average
    ranks for ties; NaN where a column or the target is constant, where torchmetrics gives 0)."""
    v = (values[:, None] if values.ndim == 1 else values).to(torch.float64)
    t = target.flatten().to(v.device, torch.float64)
    if v.shape[0] != t.numel():
        raise ValueError(f"values has {v.shape[0]} items but target has {t.numel()}.")
    if t.numel() < 2:
        raise ValueError("Spearman correlation needs at least 2 items.")
    rho = spearman_corrcoef(v, t[:, None].expand_as(v).contiguous())
    rho = torch.atleast_1d(rho).to(torch.float64)
    constant = (v == v[:1]).all(0) | bool((t == t[0]).all())
    return torch.where(constant, torch.full_like(rho, math.nan), rho)


def sts_spearman(cosines: Tensor, gold: Tensor) -> Tensor:
    r"""Per-layer Spearman ρ between sentence-pair cosines [L, P] and gold scores [P] (SentEval's STS metric).

    .. math:: \rho_l = \operatorname{spearman}\big(\cos(\bar s^{(1)}_{l,p}, \bar s^{(2)}_{l,p}),\ g_p\big)

    Returns Tensor[L] float64, NaN for a layer whose cosines are all equal.
    """
    return spearman_columns(torch.atleast_2d(cosines).T, gold)

