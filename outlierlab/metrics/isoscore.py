r"""IsoScore (Rudman et al. 2022, "IsoScore: Measuring the Uniformity of Embedding Space Utilization") and IsoScore*
(Rudman & Eickhoff 2023, "Stable Anisotropic Regularization", ICLR 2024), from a covariance.

Matches the authors' code (github.com/bcbi-edu/p_eickhoff_isoscore: ``IsoScore.py`` steps 2–7 and
``I-STAR/regularizers.py`` ``istar.isoscore_star``/``isoscore_cov``):

1. the eigenvalues λ of the sample covariance (ddof = 1), i.e. the variances of the PCA-rotated points; 2. normalised to
norm √n: ``\hat\lambda = \sqrt n\,\lambda/\lVert\lambda\rVert`` (n = dims); 3. isotropy defect ``\delta =
\lVert\hat\lambda - \mathbf 1\rVert / \sqrt{2(n-\sqrt n)}``; 4. ``\text{IsoScore} = \big((n - \delta^2(n-\sqrt n))^2 -
n\big) / \big(n(n-1)\big)``.

Algebraically ``(\mathrm{PR}-1)/(n-1)`` with ``\mathrm{PR} = (\sum\lambda)^2/\sum\lambda^2``: 1 when every direction has
the same variance, 0 when one holds all of it.  IsoScore* uses the shrinkage covariance ``(1-\zeta)\,C + \zeta\,C_0``
(C0 from a larger sample, or the identity; their analysis uses ζ = 0.75), stable with fewer points than dims; ζ = 0 is
IsoScore.  We start from the float64 covariance evaluate.py streams, never from the points.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from outlierlab.metrics.gram import gram

__all__ = ["isoscore_from_eigenvalues", "isoscore_from_covariance", "isoscore", "isoscore_star",
           "covariance", "transformed_covariance"]


def isoscore_from_eigenvalues(lam: Tensor) -> Tensor:
    """IsoScore from a variance vector (eigenvalues of the covariance) ``[..., n]`` → ``[...]`` float64
    (steps 2–4 of the module docstring, as the authors' code; NaN where every variance is 0)."""
    lam = lam.to(torch.float64).clamp_min(0.0)
    n = lam.shape[-1]
    if n < 2:
        raise ValueError(f"IsoScore needs at least 2 dims, got {n}")
    norm = lam.norm(dim=-1, keepdim=True)
    lam_hat = lam * math.sqrt(n) / norm                                          # step 4: normalise to √n
    defect = (lam_hat - 1.0).norm(dim=-1) / math.sqrt(2 * (n - math.sqrt(n)))   # step 5: isotropy defect
    return ((n - defect ** 2 * (n - math.sqrt(n))) ** 2 - n) / (n * (n - 1))    # steps 6–7


def isoscore_from_covariance(cov: Tensor) -> Tensor:
    """IsoScore of covariance matrices ``[..., n, n]`` (symmetric PSD) → ``[...]`` float64."""
    if cov.ndim < 2 or cov.shape[-1] != cov.shape[-2]:
        raise ValueError(f"expected square covariance matrices [..., n, n], got {tuple(cov.shape)}")
    c = cov.to(torch.float64)
    return isoscore_from_eigenvalues(torch.linalg.eigvalsh(0.5 * (c + c.transpose(-1, -2))))


def covariance(points: Tensor) -> Tensor:
    """Sample covariance (ddof = 1, as ``np.cov``) of points ``[..., N, n]`` → ``[..., n, n]`` float64."""
    if points.shape[-2] < 2:
        raise ValueError(f"a covariance needs at least 2 points, got {points.shape[-2]}")
    x = points.to(torch.float64)
    x = x - x.mean(-2, keepdim=True)
    return gram(x) / (x.shape[-2] - 1)


def isoscore(points: Tensor) -> Tensor:
    """IsoScore of point clouds ``[..., N, n]`` (Rudman et al. 2022, ``IsoScore.IsoScore(points.T)``)."""
    return isoscore_from_covariance(covariance(points))


def isoscore_star(cov: Tensor, cov0: Tensor | None, zeta: float) -> Tensor:
    r"""IsoScore* (Rudman & Eickhoff 2023): IsoScore of ``(1-\zeta)\,C + \zeta\,C_0``.

    ``cov``: C [..., n, n] of the points scored; ``cov0``: C0 from a larger sample (None = the identity, as the authors
    advise); ``zeta`` in [0, 1]: 0 = IsoScore, 1 = C0 alone.
    """
    if not 0.0 <= zeta <= 1.0:
        raise ValueError(f"IsoScore* shrinkage zeta must be in [0, 1], got {zeta}")
    c = cov.to(torch.float64)
    c0 = torch.eye(c.shape[-1], dtype=torch.float64, device=c.device) if cov0 is None else cov0.to(c)
    return isoscore_from_covariance((1.0 - zeta) * c + zeta * c0)


def transformed_covariance(cov: Tensor, weight: Tensor) -> Tensor:
    r"""Covariance after an affine map ``\hat x = (x-\mu)W``: ``W^\top\Sigma W`` (``cov`` ``[L, d, d]``,
    ``weight`` ``[L, d, k]``) — the IsoScore of whitened / standardized / all-but-the-top / centred / clipped
    vectors without a second pass over them."""
    w = weight.to(torch.float64)
    return w.transpose(-1, -2) @ cov.to(torch.float64) @ w
