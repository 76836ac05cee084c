"""The Gram matrix xᵀx — the arithmetic under every covariance this package fits (the whitener's float64 sums,
IsoScore's covariance).

torch has no symmetric rank-k update (BLAS ``syrk``): ``x.mT @ x`` runs a GEMM computing both triangles.  ``gram``
computes the upper triangle by column blocks and mirrors it, (k+1)/2k of the GEMM's multiply-adds (5/8 at k = 4), in
torch's BLAS on any device; entries agree with ``x.mT @ x`` to ~1e-15 relative and the result is exactly symmetric.
numpy's ``syrk`` is faster alone, but its OpenBLAS threads spinning beside torch's made the following torch products 3×
slower on 2 threads, so the product stays in torch.  On a 2-core CPU (benchmarks/whitening_gram_precision.py): 1,000 ×
384, 2.3 ms against 3.1 ms for the GEMM on one thread; 4,000 × 1,024, 71 ms against 99 ms.
"""

from __future__ import annotations

import torch
from torch import Tensor

BLOCKS = 4  # 5/8 of the GEMM's work; more blocks save little more and make each product less efficient


def gram(x: Tensor, blocks: int = BLOCKS) -> Tensor:
    """``x.mT @ x`` of ``x`` ``[..., N, d]`` → ``[..., d, d]``, same dtype and device, exactly symmetric.

    Upper-triangular column blocks, each one torch matrix product, mirrored into the lower triangle; a tensor
    that needs autograd, an empty one, or one with fewer than 2·``blocks`` dims takes the plain product.
    """
    d = x.shape[-1]
    if x.requires_grad or d < 2 * blocks or x.numel() == 0:
        return x.mT @ x
    out = torch.empty(*x.shape[:-2], d, d, dtype=x.dtype, device=x.device)
    flat_x, flat_out = x.reshape(-1, *x.shape[-2:]), out.view(-1, d, d)
    edges = [d * i // blocks for i in range(blocks + 1)]
    # one matrix at a time: a 2-D product reads a column block in place (its leading dimension), where the
    # batched one measured slower on the strided blocks
    for m, o in zip(flat_x, flat_out):
        for i in range(blocks):
            a, b = edges[i], edges[i + 1]
            row = m[:, a:b].mT @ m[:, a:]  # [b-a, d-a]: block i against blocks i..k-1
            o[a:b, a:] = row
            o[b:, a:b] = row[:, b - a:].mT
            diag = o[a:b, a:b]  # the diagonal block's two triangles from one of them: exact symmetry
            diag.copy_(diag.triu() + diag.triu(1).mT)
    return out
