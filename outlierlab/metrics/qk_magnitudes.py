r"""Query/key outlier features and the rotary pairs they sit in (Jonasson 2025, "Rotary Offset Features in Large
Language Models", arXiv:2503.01832).

Jonasson (Fig. 1: max |q_d|, |k_d| per layer, head and dim) shows that RoPE models' large query/key values sit in the
pairs rotated by the *lowest* frequencies, less than one cycle over the context, where a large constant component acts
as an offset at every distance ("rotary offset features").

* ``QKAccumulator`` — per layer × head × dim, max and mean |q_d| (and k) over tokens, streamed; q and k taken just
  *before* the rotation (after any QK-norm, else the projections' outputs; the rotation keeps each pair's norm).
* ``magnitude_outliers`` — our rule (Jonasson fixes none): within one (layer, head), a dim whose max |·| is more than
  k standard deviations above the head's mean (one-sided ``layernorm.sigma_outlier_mask``; k = 3 in
  ``configs/qk_outliers/default.yaml``).
* ``RotarySpec`` — which dims a scheme pairs (``half``: i with i + r/2, GPT-NeoX ``rotate_half`` and our
  ``pos=rope``; ``interleaved``: 2i with 2i+1, RoFormer), each pair's frequency θ_i as the model rotates it (its
  ``inv_freq``, scaled RoPE included; ``from_base`` gives ``\theta_i = \text{base}^{-2i/r}``) and its cycles over the
  attended context T, ``c_i = \theta_i T / 2\pi``.  Partial-cycle bound (Jonasson §4, as we state it): pairs with
  ``c_i < 1`` can carry offset features; ``RotarySpec.max_cycles`` holds the bound (1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["QKAccumulator", "magnitude_outliers", "RotarySpec"]


class QKAccumulator:
    """Streaming max and mean |q_d|, |k_d| per layer × head × dim (``num_kv_heads``: fewer key heads under grouped-query
    attention; None = num_heads)."""

    def __init__(self, num_layers: int, num_heads: int, head_dim: int, num_kv_heads: int | None = None):
        kv = num_heads if num_kv_heads is None else int(num_kv_heads)
        self.num_layers, self.num_heads, self.num_kv_heads, self.head_dim = num_layers, num_heads, kv, head_dim
        self.q_max = torch.zeros(num_layers, num_heads, head_dim, dtype=torch.float64)
        self.k_max = torch.zeros(num_layers, kv, head_dim, dtype=torch.float64)
        self.q_sum = torch.zeros_like(self.q_max)
        self.k_sum = torch.zeros_like(self.k_max)
        self.count = torch.zeros(num_layers, dtype=torch.int64)

    def update(self, layer: int, q: Tensor, k: Tensor) -> None:
        """Tokens of one layer: ``q`` ``[N, H, hd]``, ``k`` ``[N, H_kv, hd]`` (only the tokens to count)."""
        if q.ndim != 3 or q.shape[1:] != (self.num_heads, self.head_dim) or k.shape[1:] != (self.num_kv_heads,
                                                                                               self.head_dim):
            raise ValueError(f"expected q [N, {self.num_heads}, {self.head_dim}] and k [N, {self.num_kv_heads}, "
                             f"{self.head_dim}], got {tuple(q.shape)} and {tuple(k.shape)}")
        if q.shape[0] == 0:
            return
        qa, ka = q.detach().abs().to(torch.float64).cpu(), k.detach().abs().to(torch.float64).cpu()
        self.q_max[layer] = torch.maximum(self.q_max[layer], qa.amax(0))
        self.k_max[layer] = torch.maximum(self.k_max[layer], ka.amax(0))
        self.q_sum[layer] += qa.sum(0)
        self.k_sum[layer] += ka.sum(0)
        self.count[layer] += q.shape[0]

    def result(self) -> dict[str, Tensor]:
        """``q_max``, ``q_mean``, ``k_max``, ``k_mean`` (``[L, H(_kv), hd]`` float64) and ``count`` ``[L]``."""
        n = self.count.clamp_min(1).to(torch.float64)[:, None, None]
        return {"q_max": self.q_max, "q_mean": self.q_sum / n, "k_max": self.k_max, "k_mean": self.k_sum / n,
                "count": self.count}


def magnitude_outliers(values: Tensor, k: float) -> tuple[Tensor, Tensor]:
    """``(mask, z)`` over the last axis (a head's dims): z = (v − mean) / σ (population σ), outlier where z > k.

    A head whose dims all have the same magnitude (σ = 0) has no outlier (z = 0)."""
    v = values.to(torch.float64)
    mean, std = v.mean(-1, keepdim=True), v.std(-1, unbiased=False, keepdim=True)
    z = torch.where(std > 0, (v - mean) / std.clamp_min(torch.finfo(torch.float64).tiny), torch.zeros_like(v))
    return z > k, z


@dataclass(frozen=True)
class RotarySpec:
    """A rotary scheme of one layer: ``head_dim``, ``inv_freq`` (θ_i of each pair, radians per position; the
    first r = 2·len(inv_freq) dims of each head rotate, r < head_dim for partial rotary, e.g. Pythia),
    ``context`` (T, the largest distance the layer attends), ``layout`` (``half`` or ``interleaved``), the bound
    ``max_cycles`` and ``source`` (where θ was read)."""

    head_dim: int
    inv_freq: tuple[float, ...]
    context: int
    layout: str = "half"
    max_cycles: float = 1.0
    source: str = ""

    def __post_init__(self) -> None:
        if self.layout not in ("half", "interleaved"):
            raise ValueError(f"rotary layout must be half or interleaved, got {self.layout!r}")
        if not 2 <= self.rotary_dim <= self.head_dim:
            raise ValueError(f"rotary dims 2·len(inv_freq) must be in [2, {self.head_dim}], got {self.rotary_dim}")

    @classmethod
    def from_base(cls, head_dim: int, rotary_dim: int, base: float, context: int, layout: str = "half",
                  max_cycles: float = 1.0) -> "RotarySpec":
        """The textbook frequencies θ_i = base^(−2i/r) (Su et al. 2021), no scaling."""
        if rotary_dim % 2:
            raise ValueError(f"rotary_dim must be even, got {rotary_dim}")
        theta = tuple(float(base) ** (-2.0 * i / rotary_dim) for i in range(rotary_dim // 2))
        return cls(head_dim, theta, context, layout, max_cycles, f"base {base:g}")

    @property
    def rotary_dim(self) -> int:
        return 2 * len(self.inv_freq)

    def pair(self, dim: int) -> tuple[int, int] | None:
        """``(pair index i, partner dim)`` of head dim ``dim``, or None for a dim that is not rotated."""
        r = self.rotary_dim
        if not 0 <= dim < r:
            return None
        if self.layout == "half":
            half = r // 2
            return (dim, dim + half) if dim < half else (dim - half, dim - half)
        return dim // 2, dim ^ 1

    def theta(self, i: int) -> float:
        """Angular frequency of pair i (radians per position), as the model rotates it."""
        return float(self.inv_freq[i])

    def cycles(self, i: int) -> float:
        """Turns pair i makes over the context: θ_i · T / 2π."""
        return self.theta(i) * self.context / (2 * math.pi)

    def within_bound(self, i: int) -> bool:
        """Jonasson's partial-cycle bound: fewer than ``max_cycles`` turns over the context."""
        return self.cycles(i) < self.max_cycles

    def first_partial_pair(self) -> int:
        """Smallest pair index within the bound (pairs i ≥ it all are where θ_i decreases with i, as every
        scaling keeps it); r/2 if none."""
        for i in range(self.rotary_dim // 2):
            if self.within_bound(i):
                return i
        return self.rotary_dim // 2
