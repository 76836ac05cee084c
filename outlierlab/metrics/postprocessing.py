r"""The affine post-processing maps fitted from a mean and covariance: ``\hat x = (x-\mu)\,W``.

One matrix W per method, from the float64 covariance Σ that ``outlierlab.metrics.whitening.Whitener``
streams (so every method is fitted on the same data, with the same guard):

* ``whiten`` — ``W = U\,\mathrm{diag}(1/\sqrt S)`` (Su et al. 2021), optionally its first k columns;
* ``standardize`` — ``W = \mathrm{diag}(1/\sigma)``, ``\sigma_i = \sqrt{\Sigma_{ii}}``: every dim mean 0,
  std 1 (Timkey & van Schijndel 2021 §5, "standardization");
* ``abtt`` — all-but-the-top (Mu & Viswanath 2018, "All-but-the-Top: Simple and Effective Postprocessing for
  Word Representations", Alg. 1): remove the mean, then the projections on the top D principal directions
  ``u_1..u_D`` of Σ, ``W = I - \sum_{j\le D} u_j u_j^\top``; D ≈ d/100 (their rule of thumb);
* ``center`` — ``W = I`` (mean removal; ``abtt`` with D = 0).

How many distinct fit vectors each fit needs (``fit_size``, the guard of
``outlierlab.metrics.whitening.Whitener.check``): a fit estimates ``p`` directions — whiten its k kept dims,
abtt the mean and D directions (p = D + 1: with N ≤ D + 1 distinct points the centred points span ≤ D
dims, all of them removed, and every fitted vector becomes 0), standardize the mean and one scale per dim
(p = 2: two distinct points standardize to ±1 in every coordinate — antipodal, every cosine −1), center the
mean (p = 1: one distinct vector centres to 0).  N_distinct ≤ p is exactly degenerate; below
``min_ratio``·p the estimate is dominated by sampling noise, and is refused as whitening is.

Pure tensor code; no library offers these maps on a streamed covariance (scikit-learn's StandardScaler and PCA
need the points), and each is one line of linear algebra.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["FITTED", "CITATION", "default_abtt_d", "fit_size", "affine_matrix"]

#: The transforms fitted on data (mean + covariance); ``none`` and ``clip`` need no fit of this kind.
FITTED = ("whiten", "standardize", "abtt", "center")

#: Source of each fitted transform (report lines).
CITATION = {"whiten": "Su et al. 2021", "standardize": "Timkey & van Schijndel 2021",
            "abtt": "Mu & Viswanath 2018", "center": "mean removal"}


def default_abtt_d(dim: int) -> int:
    """Mu & Viswanath 2018's rule of thumb, D ≈ d/100, rounded, at least 1 (768 → 8, 384 → 4, 128 → 1)."""
    return max(1, round(dim / 100))


def fit_size(method: str, dim: int, k: int | None = None, abtt_d: int | None = None) -> int:
    """Directions ``p`` a fit of ``method`` estimates (module docstring): it needs ``min_ratio``·p distinct
    vectors."""
    if method == "whiten":
        return dim if k is None else int(k)
    if method == "abtt":
        return (default_abtt_d(dim) if abtt_d is None else int(abtt_d)) + 1
    if method == "standardize":
        return 2
    if method == "center":
        return 1
    raise ValueError(f"unknown fitted transform {method!r}; valid: {', '.join(FITTED)}")


def affine_matrix(method: str, cov: Tensor, eigvals: Tensor, eigvecs: Tensor, *, k: int | None, abtt_d: int | None,
                  eps: float) -> Tensor:
    """W of ``method`` for every layer.

    Parameters
    ----------
    cov : Tensor[L, d, d] float64, the covariance Σ
    eigvals, eigvecs : Σ's eigenvalues ``[L, d]`` (descending, ≥ 0) and eigenvectors ``[L, d, d]`` (columns)
    k : whiten's kept dims (None = d)
    abtt_d : all-but-the-top's D (None = ``default_abtt_d``); 0 is mean removal
    eps : relative floor: a variance below ``eps`` × the largest is raised to it before 1/√ (whiten: the
        eigenvalues, standardize: the per-dim variances), so a direction without variance is scaled by at
        most 1/√(eps·max) instead of inf/NaN

    Returns
    -------
    Tensor[L, d, k] (whiten) or [L, d, d] float64
    """
    num_layers, dim = cov.shape[0], cov.shape[-1]
    tiny = torch.finfo(torch.float64).tiny
    if method == "whiten":
        floor = (eps * eigvals[:, :1]).clamp_min(tiny)
        w = eigvecs / eigvals.clamp_min(floor).sqrt().unsqueeze(1)
        return w if k is None else w[:, :, :k].contiguous()
    eye = torch.eye(dim, dtype=torch.float64, device=cov.device).expand(num_layers, dim, dim)
    if method == "standardize":
        var = torch.diagonal(cov, dim1=-2, dim2=-1).clamp_min(0.0)
        floor = (eps * var.amax(-1, keepdim=True)).clamp_min(tiny)
        return torch.diag_embed(1.0 / var.clamp_min(floor).sqrt())
    if method == "abtt":
        d_top = default_abtt_d(dim) if abtt_d is None else int(abtt_d)
        if not 0 <= d_top < dim:
            raise ValueError(f"transform.abtt_d must be in [0, {dim - 1}] for hidden size {dim}, got {d_top}")
        top = eigvecs[:, :, :d_top]
        return eye - top @ top.transpose(-1, -2)
    if method == "center":
        return eye.clone()
    raise ValueError(f"unknown fitted transform {method!r}; valid: {', '.join(FITTED)}")
