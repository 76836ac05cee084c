r"""The frequent-token heuristic of last-layer outlier dims (Macocco et al. 2025, "Outlier dimensions favor
frequent tokens in language models").

The LM head's logits are linear in the vector h that enters its output layer (a decoder's final-normed residual;
an MLM head's transformed vector): :math:`\ell = hW^\top + b`, so they split over any set of dims S,

.. math:: \ell = \underbrace{h_S W_S^\top}_{\text{the dims } S \text{ alone}} + \underbrace{h_{\bar S}
          W_{\bar S}^\top + b}_{\text{everything but } S},

Macocco et al.'s ``h[:, S] @ W[S, :]``.  Their claim: with S the last layer's outlier dims, the logits of S alone
rank tokens by corpus frequency — the heuristic "predict a frequent token" — and removing S moves the prediction
away from frequent tokens.  This module holds the pieces, pure tensor code:

* :func:`macocco_outlier_dims` — their rule: dims whose median |h_d| over inputs exceeds the 99th percentile of
  all |h| values;
* :func:`split_logits` — the two parts above (the bias stays with "everything but S": it is the rest of the
  model; S alone is the bias-free term of the equation);
* :class:`ConditionStats` — per condition, streamed over positions: KL(full ‖ condition), entropy, top-1
  accuracy, the count of each token as top-1 prediction and each token's mean log-probability; their Spearman
  correlations with the tokens' corpus frequency (:func:`frequency_spearman`) say whether the condition
  predicts frequent tokens (the top-1 count: Macocco et al.'s measure, tied at 0 for most tokens) and whether
  it *ranks* tokens by frequency (the mean log-probability: a dim whose decoder weights are log-frequency
  gives ρ = 1).

Written by hand: the decomposition is one matrix product; no library computes these statistics for a head.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from outlierlab.analysis.sts import spearman_columns

__all__ = ["macocco_outlier_dims", "split_logits", "ConditionStats", "frequency_spearman"]


def macocco_outlier_dims(h: Tensor, percentile: float = 99.0) -> list[int]:
    """Macocco et al. 2025's last-layer outlier dims: d such that :math:`\\mathrm{median}_n |h_{n,d}|` exceeds the
    ``percentile``-th percentile of every :math:`|h_{n,d'}|` of the inputs ``h`` ``[N, d]``; sorted by that
    median, largest first (NumPy's percentile: linear interpolation)."""
    if h.ndim != 2 or h.shape[0] == 0:
        raise ValueError(f"expected vectors [N, d] with N >= 1, got {tuple(h.shape)}")
    a = h.detach().abs().to(torch.float64).cpu()
    threshold = float(np.percentile(a.numpy(), percentile))
    med = a.median(0).values
    dims = (med > threshold).nonzero().flatten()
    return dims[med[dims].argsort(descending=True)].tolist()


def split_logits(h: Tensor, weight: Tensor, dims: Sequence[int], bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    r"""``(only, rest)``: :math:`h_S W_S^\top` and :math:`h_{\bar S} W_{\bar S}^\top + b` for ``h`` ``[N, d]``, the
    output layer's ``weight`` ``[V, d]`` and ``bias`` ``[V]``; ``only + rest`` is the model's logits."""
    mask = torch.zeros(h.shape[-1], dtype=torch.bool, device=h.device)
    mask[list(dims)] = True
    w = weight.to(h)
    only = (h * mask) @ w.T
    rest = (h * ~mask) @ w.T
    if bias is not None:
        rest = rest + bias.to(rest)
    return only, rest


class ConditionStats:
    """Streaming statistics of one condition's distribution against the full one, over N positions.

    :meth:`update` with ``logits [n, V]`` of the condition, ``full [n, V]`` (the model's logits) and ``labels
    [n]`` (the masked / next token; -100 = none); :meth:`result` returns mean KL(p_full ‖ p_cond) (nats), mean
    entropy of p_cond (nats), top-1 accuracy, ``top1_counts`` ``[V]`` (how often each token is the argmax) and
    ``mean_logprob`` ``[V]`` (each token's log-probability averaged over the positions).
    """

    def __init__(self, vocab_size: int):
        self.kl = self.entropy = 0.0
        self.correct = self.n = self.n_labelled = 0
        self.top1_counts = torch.zeros(vocab_size, dtype=torch.int64)
        self.logprob_sum = torch.zeros(vocab_size, dtype=torch.float64)

    def update(self, logits: Tensor, full: Tensor, labels: Tensor) -> None:
        lp = torch.log_softmax(logits.to(torch.float64), -1)
        lq = torch.log_softmax(full.to(torch.float64), -1)
        self.kl += float((lq.exp() * (lq - lp)).sum())
        self.entropy += float(-(lp.exp() * lp).sum())
        self.logprob_sum += lp.sum(0).cpu()
        top = logits.argmax(-1)
        self.top1_counts += torch.bincount(top.cpu(), minlength=self.top1_counts.numel())[: self.top1_counts.numel()]
        has = labels != -100
        self.correct += int((top[has] == labels[has].to(top.device)).sum())
        self.n += logits.shape[0]
        self.n_labelled += int(has.sum())

    def result(self) -> dict:
        if self.n == 0:
            raise ValueError("no position was scored")
        return {"kl": self.kl / self.n, "entropy": self.entropy / self.n,
                "top1": self.correct / self.n_labelled if self.n_labelled else float("nan"),
                "top1_counts": self.top1_counts, "mean_logprob": self.logprob_sum / self.n, "n_positions": self.n}


def frequency_spearman(freqs: Tensor, values: Tensor, min_count: int = 1) -> float:
    """Spearman ρ between tokens' corpus frequency and a per-token value (how often each is the top-1
    prediction, or its mean log-probability), over the tokens counted at least ``min_count`` times in the
    corpus (torchmetrics, average ranks for ties; NaN when either side is constant)."""
    keep = freqs.flatten() >= min_count
    if int(keep.sum()) < 3:
        return float("nan")
    return float(spearman_columns(values.flatten()[keep].to(torch.float64),
                                  freqs.flatten()[keep].to(torch.float64))[0])
