"""Symmetric absmax fake quantization, the W8A8 scheme of Bondarenko et al. (2023, "Quantizable Transformers") and
Dettmers et al. (2022, "LLM.int8()"), and LLM.int8()'s decomposition that keeps a few outlier input dimensions in full
precision.

``q = clamp(round(x / s), -(2^(b-1) - 1), 2^(b-1) - 1)``, ``x_hat = q * s``, ``s = absmax / (2^(b-1) - 1)``: one dynamic
scale per tensor for activations, one per output channel for weights.  Rounding and clamping are torch's
fake-quantization kernels (zero point 0, ±127 at 8 bits); the symmetric absmax scale and the unquantized dims are added
here.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["qmax", "absmax_scale", "fake_quantize", "fake_quantize_weight", "largest_dims"]


def qmax(bits: int) -> int:
    """The largest integer of a symmetric ``bits``-bit grid: 127 at 8 bits (-128 is not used, so the grid is
    symmetric around 0)."""
    if not 2 <= int(bits) <= 16:
        raise ValueError(f"bits must be between 2 and 16, got {bits}")
    return 2 ** (int(bits) - 1) - 1


def absmax_scale(x: Tensor, bits: int = 8, dim: int | None = None) -> Tensor:
    """``absmax / qmax``: per tensor (``dim=None``, a scalar) or one per slice along ``dim``. A tensor of zeros gets
    scale 1 (any scale quantizes it exactly; 0 would divide by zero)."""
    a = x.detach().abs()
    m = a.amax() if dim is None else a.amax(dim=[d for d in range(x.ndim) if d != dim % x.ndim])
    m = m.float()
    return torch.where(m > 0, m / qmax(bits), torch.ones_like(m))


def fake_quantize(x: Tensor, bits: int = 8, keep: Tensor | None = None) -> Tensor:
    """``x`` rounded to a symmetric ``bits``-bit grid with one absmax scale for the whole tensor (dynamic, per
    tensor: the activations' scheme of W8A8). ``keep``: indices of the last dimension left in full precision and out
    of the scale (LLM.int8()'s decomposition), so a few outlier dimensions no longer set the step for all others."""
    if keep is not None and keep.numel():
        mask = torch.zeros(x.shape[-1], dtype=torch.bool, device=x.device)
        mask[keep] = True
        q = fake_quantize(x.masked_fill(mask, 0.0), bits)
        return torch.where(mask, x, q)
    n = qmax(bits)
    scale = absmax_scale(x, bits)
    out = torch.fake_quantize_per_tensor_affine(x.float(), scale, torch.zeros((), dtype=torch.int32, device=x.device),
                                                -n, n)
    return out.to(x.dtype)


def fake_quantize_weight(w: Tensor, bits: int = 8) -> Tensor:
    """A linear layer's weight ``(out, in)`` rounded per output channel: one absmax scale per row."""
    n = qmax(bits)
    scale = absmax_scale(w, bits, dim=0)
    zero = torch.zeros(w.shape[0], dtype=torch.int32, device=w.device)
    return torch.fake_quantize_per_channel_affine(w.float(), scale, zero, 0, -n, n).to(w.dtype)


def largest_dims(x: Tensor, k: int) -> Tensor:
    """The ``k`` dimensions (last axis) with the largest |x| anywhere in ``x``: the outlier dimensions LLM.int8()
    keeps in 16 bits (it selects them by a threshold of 6; a fixed count compares models of one width fairly)."""
    if k <= 0:
        return torch.zeros(0, dtype=torch.long, device=x.device)
    per_dim = x.detach().abs().reshape(-1, x.shape[-1]).amax(dim=0)
    return per_dim.topk(min(int(k), x.shape[-1])).indices
