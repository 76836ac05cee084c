"""Whose largest |value| a token has, by the token's position: is an outlier dimension positional?

Luo, Kulmizev & Mao (2021) trace the outlier dimensions of BERT and RoBERTa to the position embeddings (§3).  A
dimension's |x|-argmax share over all tokens (He et al. 2024) mixes positions: one holding every token of the first 15
positions and none after 32 reads 0.58 on short sentences, 0.32 on paragraphs.  Counting per position bucket separates
the two.  Buckets double in width: 0, 1, 2–3, 4–7, ... (bucket b holds 2^(b-1) .. 2^b - 1); positions index the
tokenized sequence, 0 = ``<s>`` (special tokens are not counted, so an encoder's bucket 0 is empty).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["token_positions", "position_bucket", "bucket_positions", "bucket_columns", "PositionArgmaxCounts",
           "POSITION_COLUMNS"]

#: The columns of ``outliers_by_position.csv`` (docs/tables.md).
POSITION_COLUMNS = ["layer", "positions", "first_position", "last_position", "n_tokens", "abs_argmax_dim",
                    "abs_argmax_share", "layer_dim", "layer_dim_share"]


def token_positions(attention_mask: Tensor, selected: Tensor) -> Tensor:
    """The position of each ``selected`` token ([B, T] bool; row-major, as ``hidden[:, selected]`` orders them):
    the number of real tokens before it in its row, so left padding counts as it should (the column itself is the
    position only where padding is on the right)."""
    return (attention_mask.to(selected.device, torch.int64).cumsum(1) - 1)[selected]


def position_bucket(positions: Tensor) -> Tensor:
    """The bucket of each position (int64): 0 for position 0, else ``floor(log2(p)) + 1``: 1 → 1, 2–3 → 2,
    4–7 → 3, 8–15 → 4, ... (the bit length of ``p``: frexp's exponent, exact for integers below 2^53)."""
    if (positions < 0).any():
        raise ValueError("positions must be >= 0")
    return torch.frexp(positions.to(torch.float64)).exponent.to(torch.int64)


def bucket_positions(b: int) -> tuple[int, int]:
    """``(first, last)`` position of bucket ``b``."""
    return (0, 0) if b == 0 else (1 << (b - 1), (1 << b) - 1)


def bucket_columns(b: int) -> dict:
    """The columns naming bucket ``b`` in a table: ``positions`` ("1", "2-3", ...), ``first_position``,
    ``last_position``."""
    first, last = bucket_positions(b)
    return {"positions": str(first) if first == last else f"{first}-{last}", "first_position": first,
            "last_position": last}


class PositionArgmaxCounts:
    """Per layer and position bucket, how many tokens have their largest |x| on each dim.

    ``update(layer, vectors [N, d], positions [N])``; ``rows()``: per (layer, non-empty bucket) the bucket's own
    |x|-argmax dim and share, and the share there of the layer's overall dim (``layer_dim``).  Bucket counts add up, so
    ``sum_b n_b · layer_dim_share_b / n`` is the layer's overall share.
    """

    def __init__(self, num_layers: int, dim: int) -> None:
        if num_layers < 1 or dim < 1:
            raise ValueError(f"num_layers and dim must be >= 1, got {num_layers}, {dim}")
        self.dim = dim
        self.counts: list[Tensor] = [torch.zeros(0, dim, dtype=torch.int64) for _ in range(num_layers)]

    def update(self, layer: int, vectors: Tensor, positions: Tensor) -> None:
        if vectors.ndim != 2 or vectors.shape[-1] != self.dim or positions.shape != vectors.shape[:1]:
            raise ValueError(f"expected vectors [N, {self.dim}] and positions [N], got {tuple(vectors.shape)} and "
                             f"{tuple(positions.shape)}")
        if vectors.shape[0] == 0:
            return
        dims = vectors.abs().argmax(-1).cpu()
        buckets = position_bucket(positions.cpu())
        nb = max(int(buckets.max()) + 1, self.counts[layer].shape[0])
        add = torch.bincount(buckets * self.dim + dims, minlength=nb * self.dim).view(nb, self.dim)
        old = self.counts[layer]
        add[: old.shape[0]] += old
        self.counts[layer] = add

    def rows(self) -> list[dict]:
        """The ``outliers_by_position`` rows, layer by layer, buckets in order (empty buckets left out)."""
        out = []
        for layer, c in enumerate(self.counts):
            total = int(c.sum())
            if total == 0:
                continue
            layer_dim = int(c.sum(0).argmax())
            for b in range(c.shape[0]):
                n = int(c[b].sum())
                if n == 0:
                    continue
                out.append({"layer": layer, **bucket_columns(b), "n_tokens": n,
                            "abs_argmax_dim": int(c[b].argmax()), "abs_argmax_share": float(c[b].max()) / n,
                            "layer_dim": layer_dim, "layer_dim_share": float(c[b, layer_dim]) / n})
        return out
