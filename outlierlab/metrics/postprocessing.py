r"""The affine post-processing maps fitted from a mean and covariance: ``\hat x = (x-\mu)\,W``.

One W per method, from the float64 Σ that ``outlierlab.metrics.whitening.Whitener`` streams:

* ``whiten`` — ``W = U\,\mathrm{diag}(1/\sqrt S)`` (Su et al. 2021), optionally its first k columns;
* ``standardize`` — ``W = \mathrm{diag}(1/\sigma)``, ``\sigma_i = \sqrt{\Sigma_{ii}}`` (Timkey & van Schijndel 2021
  §5, "standardization");
* ``abtt`` — all-but-the-top (Mu & Viswanath 2018, "All-but-the-Top: Simple and Effective Postprocessing for
  Word Representations", Alg. 1): remove the mean and the top D principal directions of Σ,
  ``W = I - \sum_{j\le D} u_j u_j^\top``; D ≈ d/100 (their rule of thumb);
* ``center`` — ``W = I`` (mean removal; ``abtt`` with D = 0).

``fit_size`` (the guard of ``Whitener.check``): a fit estimates ``p`` directions — whiten its k kept dims, abtt p = D +
1 (with N ≤ D + 1 points every fitted vector becomes 0), standardize p = 2 (two points standardize to ±1, every cosine
−1), center p = 1.  N_distinct ≤ p is exactly degenerate; below ``min_ratio``·p it is refused.
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
    """W of ``method`` for every layer: [L, d, k] (whiten) or [L, d, d], float64.

    ``cov``: Σ [L, d, d]; ``eigvals, eigvecs``: its eigenvalues (descending) and eigenvector columns.  ``k``: whiten's
    kept dims (None = d); ``abtt_d``: D (None = ``default_abtt_d``; 0 is mean removal).  ``eps``: a variance below
    ``eps`` × the largest (whiten: eigenvalues, standardize: per-dim variances) is raised to it before 1/√.
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
