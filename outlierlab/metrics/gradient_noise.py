"""The gradient noise scale of a parameter group: how large a batch its gradient needs before signal beats noise.

McCandlish, Kaplan, Amodei et al. (2018, "An Empirical Model of Large-Batch Training", eq. 2.8): with G the true
gradient and Σ the per-example gradient covariance, the *simple noise scale* is

    B_simple = tr(Σ) / |G|²,

the batch size at which a batch gradient's noise (tr(Σ)/B) equals its signal (|G|²). From K gradients g_1..g_K of
batches of B examples (Σ_B = Σ/B):

    ḡ = mean g_i,   tr(Σ_B) ≈ Σ|g_i − ḡ|² / (K − 1),   |G|² ≈ |ḡ|² − tr(Σ_B)/K   (unbiased),
    B_simple ≈ B · tr(Σ_B) / |G|²,   signal-to-noise at batch b: |G|² / (tr(Σ_B) · B / b) = b / B_simple.

|G|² ≤ 0 (signal below what K batches resolve) reports B_simple as inf, never a negative batch size.  Used in
docs/order_use.md for a learned position table's gradient during the bag-of-words plateau.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class NoiseScale:
    """Sums over the K batch gradients of one parameter group (float64)."""

    batch_size: int
    k: int = 0
    total: Tensor | None = None   # Σ g_i
    sq_norms: float = 0.0         # Σ |g_i|²

    def update(self, grad: Tensor) -> None:
        g = grad.detach().reshape(-1).to(torch.float64)
        self.total = g.clone() if self.total is None else self.total + g
        self.sq_norms += float(g @ g)
        self.k += 1

    def result(self) -> dict[str, float]:
        """``trace_cov_batch`` (tr Σ_B), ``grad_sq`` (|G|², unbiased), ``b_simple`` (inf when |G|² ≤ 0),
        ``mean_grad_sq`` (|ḡ|², biased upwards by tr Σ_B / K), ``k``."""
        if self.k < 2:
            raise ValueError(f"the noise scale needs at least 2 batch gradients, got {self.k}")
        mean = self.total / self.k
        mean_sq = float(mean @ mean)
        trace = (self.sq_norms - self.k * mean_sq) / (self.k - 1)
        signal = mean_sq - trace / self.k
        b_simple = self.batch_size * trace / signal if signal > 0 else math.inf
        return {"k": self.k, "batch_size": self.batch_size, "mean_grad_sq": mean_sq, "trace_cov_batch": trace,
                "grad_sq": signal, "b_simple": b_simple}
