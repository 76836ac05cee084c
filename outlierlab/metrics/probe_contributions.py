r"""Probe math: neuron contribution to a linear probe's decision (Luo, Kulmizev & Mao 2021, §3).

Luo et al. train a bias-free linear position probe ``W \in \mathbb{R}^{d\times M}`` per layer and ask
which neurons drive its decisions.  For a token vector ``v`` whose true class (position) is
``y``, the logit of the true class is ``\sum_i w_{y,i} v_i`` (``w_y`` = column ``y`` of ``W``,
the "weight row of the true position" in their row convention), and neuron ``i`` contributes

.. math:: c_i = \lvert w_{y,i}\, v_i \rvert ,

averaged over tokens (their Fig. 5b/c: the outlier neuron's contribution vs. the mean neuron's).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["contribution", "rank_of_dims", "top_dims", "chance_accuracy"]


def contribution(weight: Tensor, features: Tensor, labels: Tensor, reduction: str = "mean") -> Tensor:
    r"""Per-neuron contribution ``c_i = |w_{y,i} v_i|`` to the true-class logit (Luo et al. 2021 §3).

    ``weight``: the probe's [d, M] (logits = ``v @ W``) or [L, d, M]; ``features``: [N, d] or [L, N, d] vectors as the
    probe sees them; ``labels``: [N] true classes.  ``reduction`` "mean" (Luo's definition), "sum" (for streaming) ->
    [d] / [L, d], or "none" -> every ``c_{t,i}``.
    """
    if weight.ndim != features.ndim or weight.ndim not in (2, 3):
        raise ValueError(f"weight {tuple(weight.shape)} and features {tuple(features.shape)} must both be 2-D "
                         "([d, M], [N, d]) or 3-D ([L, d, M], [L, N, d]).")
    if weight.shape[-2] != features.shape[-1] or features.shape[-2] != labels.shape[0]:
        raise ValueError(f"shapes do not match: weight {tuple(weight.shape)}, features {tuple(features.shape)}, "
                         f"labels {tuple(labels.shape)}.")
    w_true = weight[..., labels.long()].transpose(-1, -2)  # [..., N, d]: w_{y_t} for every vector t
    c = (w_true * features).abs()
    if reduction == "none":
        return c
    if reduction == "sum":
        return c.sum(-2)
    if reduction == "mean":
        return c.mean(-2)
    raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}.")


def rank_of_dims(scores: Tensor, dims: Sequence[int]) -> list[int]:
    """1-based rank of each of ``dims`` when ``scores[d]`` is sorted descending (1 = largest).

    Ties share the best rank (rank = 1 + number of strictly larger scores), so a zeroed (clipped) dim
    among other zeros does not get an arbitrary rank.
    """
    s = scores.detach().flatten()
    return [int((s > s[int(d)]).sum()) + 1 for d in dims]


def top_dims(scores: Tensor, k: int) -> list[int]:
    """The ``k`` dims with the largest ``scores`` (Tensor[d]), largest first."""
    k = min(int(k), scores.numel())
    return scores.detach().flatten().topk(k).indices.tolist()


def chance_accuracy(labels: Tensor) -> float:
    """Accuracy of always predicting the most frequent label (the majority-class baseline)."""
    labels = labels.flatten()
    if labels.numel() == 0:
        raise ValueError("chance_accuracy needs at least one label.")
    return float(torch.bincount(labels.long()).max()) / labels.numel()
