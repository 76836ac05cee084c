"""Similarity of two tokens' vectors as a function of their distance within a sentence (Zuo et al. 2025).

Zuo, Guerzhoy & Guerzhoy (COLING 2025) observe that in causal transformers *without* position encodings nearby tokens'
vectors are more similar than distant ones' -- already at random initialisation -- so position can be read from that
similarity; Haviv et al. (2022): under the causal mask a token can count its predecessors.  A bidirectional model
without positions is permutation-equivariant, so its curve is flat.

    sim_l(δ) = mean over sentences s and positions i of cos(h_l[s, i], h_l[s, i + δ]),   δ = 1 … D

over pairs of valid tokens (``mask``; special tokens passed as invalid are left out), streamed as sums and counts.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["distance_cosine_sums", "DistanceSimilarity"]


def distance_cosine_sums(hidden: Tensor, mask: Tensor, max_distance: int) -> tuple[Tensor, Tensor]:
    """Sums of ``cos(h[i], h[i + δ])`` over the valid pairs at each distance, per layer.

    ``hidden``: ``[L, B, T, d]`` (cosines in float64); ``mask``: ``[B, T]`` tokens to use; ``max_distance``: D
    (distances beyond ``T - 1`` get zero counts).  Returns ``sums`` ``[L, D]`` and ``counts`` ``[D]`` (the same for
    every layer), float64.
    """
    L, B, T, _ = hidden.shape
    h = hidden.double()
    h = h / h.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    valid = mask.bool()
    sums = torch.zeros(L, max_distance, dtype=torch.float64, device=hidden.device)
    counts = torch.zeros(max_distance, dtype=torch.float64, device=hidden.device)
    for d in range(1, min(max_distance, T - 1) + 1):
        pair = (valid[:, :-d] & valid[:, d:]).double()  # [B, T-d]
        cos = (h[:, :, :-d] * h[:, :, d:]).sum(-1)  # [L, B, T-d]
        sums[:, d - 1] = (cos * pair).sum(dim=(1, 2))
        counts[d - 1] = pair.sum()
    return sums, counts


class DistanceSimilarity:
    """Streaming ``distance_cosine_sums`` over ``num_layers`` layers up to ``max_distance``: ``update`` per batch,
    ``compute`` the mean cosine per distance."""

    def __init__(self, num_layers: int, max_distance: int) -> None:
        if max_distance < 1:
            raise ValueError(f"max_distance must be >= 1, got {max_distance}")
        self.sums = torch.zeros(num_layers, max_distance, dtype=torch.float64)
        self.counts = torch.zeros(max_distance, dtype=torch.float64)

    def update(self, hidden: Tensor, mask: Tensor) -> None:
        s, c = distance_cosine_sums(hidden, mask, self.sums.shape[1])
        self.sums += s.cpu()
        self.counts += c.cpu()

    def compute(self) -> tuple[Tensor, Tensor]:
        """``([L, D] mean cosine, NaN where no pair was seen; [D] pair counts)``."""
        mean = self.sums / self.counts.clamp_min(1)
        mean[:, self.counts == 0] = float("nan")
        return mean, self.counts.clone()

    def rows(self, layers: list[int] | None = None) -> list[dict]:
        """One row per layer and distance: ``layer, distance, cosine, n_pairs``."""
        mean, counts = self.compute()
        layers = list(range(mean.shape[0])) if layers is None else layers
        return [{"layer": layer, "distance": d + 1, "cosine": float(mean[i, d]), "n_pairs": int(counts[d])}
                for i, layer in enumerate(layers) for d in range(mean.shape[1]) if counts[d] > 0]
