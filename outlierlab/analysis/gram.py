"""The Gram matrix xᵀx of float64 vectors — the arithmetic under every covariance this package fits.

Written here because torch has no symmetric rank-k update: ``x.mT @ x`` runs a general GEMM and computes both
triangles.  numpy's ``matmul`` recognises a matrix times its own transpose and calls BLAS ``syrk``, which
computes one triangle and mirrors it — half the multiply-adds, the same float64 dot products (results agree
with torch's to ~1e-15 relative and are exactly symmetric).  Measured on this project's 2-core CPU, one thread:
2.4 ms against 3.4–4.6 ms for 1,000 × 384, 58 ms against 94 ms for 4,000 × 1,024 (issue 39: the whitener's
float64 sums were the largest cost of ``evaluate.py`` beside the model's forward).
"""

from __future__ import annotations

import torch
from torch import Tensor


def gram(x: Tensor) -> Tensor:
    """``x.mT @ x`` of ``x`` ``[..., N, d]`` → ``[..., d, d]``, same dtype and device.

    CPU float64 (and float32) tensors go through numpy (BLAS ``syrk``, zero-copy views); any other device or
    dtype through torch's product.
    """
    if x.device.type != "cpu" or x.dtype not in (torch.float64, torch.float32) or x.requires_grad:
        return x.mT @ x
    xn = x.contiguous().numpy()  # a strided matrix would leave BLAS for numpy's naive loop
    # the syrk path needs the two operands to be one buffer, one seen transposed (numpy's matmul checks
    # identical data pointers and swapped strides per stacked matrix)
    return torch.from_numpy(xn.swapaxes(-1, -2) @ xn)
