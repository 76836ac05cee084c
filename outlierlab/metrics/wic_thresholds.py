"""Word-in-Context by cosine threshold (Luo et al. 2021 §4.2; Pilehvar & Camacho-Collados 2019).

Predict "same sense" when the cosine of a word's vectors in two sentences is above a threshold.  Luo et al. sweep 0.1 …
0.9 per layer on the WiC training split and report the best (an upper bound); ``choose_then_report`` is the honest
protocol: thresholds and best layer chosen on one split, accuracy reported on another.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["default_thresholds", "wic_accuracy", "threshold_sweep", "best_threshold", "best_per_layer",
           "all_true_baseline", "choose_then_report"]


def default_thresholds() -> Tensor:
    """The paper's sweep 0.1, 0.2, …, 0.9 as float64 ``i / 10`` (each the double nearest i/10; arange
    would accumulate 0.30000000000000004-style drift)."""
    return torch.arange(1, 10, dtype=torch.float64) / 10


def _check(cosines: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    cos = torch.atleast_2d(cosines)
    lab = labels.flatten().bool().to(cos.device)
    if cos.shape[-1] != lab.numel():
        raise ValueError(f"cosines has {cos.shape[-1]} pairs but labels has {lab.numel()}.")
    if lab.numel() == 0:
        raise ValueError("WiC needs at least one labelled pair.")
    return cos, lab


def wic_accuracy(cosines: Tensor, labels: Tensor, threshold: float | Tensor) -> Tensor:
    r"""Accuracy of predicting "same sense" (``labels`` True) iff cosine > threshold, per layer (float64).

    .. math:: \text{acc}_l = \tfrac1P\sum_p [\,(\cos_{l,p} > \tau_l) = y_p\,]

    ``cosines`` [L, P] (or [P]); ``threshold``: a float or Tensor[L] (e.g. chosen on the training split).
    """
    cos, lab = _check(cosines, labels)
    thr = torch.as_tensor(threshold, dtype=torch.float64, device=cos.device)
    thr = thr.reshape(-1, 1) if thr.ndim else thr
    return ((cos.to(torch.float64) > thr) == lab).to(torch.float64).mean(-1)


def threshold_sweep(cosines: Tensor, labels: Tensor, thresholds: Tensor | None = None) -> Tensor:
    """Accuracy [L, T] float64 for every layer and threshold (strict ``cos > τ``; default 0.1 … 0.9)."""
    cos, lab = _check(cosines, labels)
    thr = (default_thresholds() if thresholds is None else torch.as_tensor(thresholds)).to(cos.device, torch.float64)
    pred = cos.to(torch.float64).unsqueeze(-1) > thr  # [L, P, T]
    return (pred == lab[:, None]).to(torch.float64).mean(1)


def best_threshold(acc: Tensor, thresholds: Tensor | None = None) -> tuple[int, float, float]:
    """Best (layer, threshold, accuracy) of a ``threshold_sweep`` result.

    Ties go to the lowest layer, then the lowest threshold (``torch.argmax`` returns the first maximum).
    """
    thr = default_thresholds() if thresholds is None else torch.as_tensor(thresholds, dtype=torch.float64)
    acc2 = torch.atleast_2d(acc)
    if acc2.shape[-1] != thr.numel():
        raise ValueError(f"accuracy has {acc2.shape[-1]} thresholds, thresholds has {thr.numel()}.")
    i = int(acc2.flatten().argmax())
    layer, t = divmod(i, acc2.shape[-1])
    return layer, float(thr[t]), float(acc2[layer, t])


def best_per_layer(acc: Tensor, thresholds: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per layer: best threshold Tensor[L] and its accuracy Tensor[L] (ties → lowest threshold)."""
    thr = default_thresholds() if thresholds is None else torch.as_tensor(thresholds, dtype=torch.float64)
    best, idx = torch.atleast_2d(acc).max(-1)
    return thr.to(idx.device)[idx], best


def all_true_baseline(labels: Tensor) -> float:
    """Accuracy of always answering "same sense" = share of True labels (WiC's majority-style baseline)."""
    lab = labels.flatten().bool()
    if lab.numel() == 0:
        raise ValueError("WiC needs at least one labelled pair.")
    return float(lab.to(torch.float64).mean())


def choose_then_report(cos_choose: Tensor, labels_choose: Tensor, cos_report: Tensor, labels_report: Tensor,
                       thresholds: Tensor | None = None) -> dict:
    """Threshold chosen on one split, accuracy reported on another (the honest counterpart of the paper's sweep).

    Per layer, the best threshold on the *choose* split (ties → lowest) is applied unchanged to the *report* split; the
    best layer is chosen on the choose split too.  ``labels_report`` only scores, never chooses.  Returns ``threshold``,
    ``choose_accuracy``, ``report_accuracy`` (Tensor[L]), ``best_layer``, ``best_threshold`` and
    ``best_report_accuracy``.
    """
    acc = threshold_sweep(cos_choose, labels_choose, thresholds)
    thr_l, acc_l = best_per_layer(acc, thresholds)
    layer, thr, _ = best_threshold(acc, thresholds)
    report = wic_accuracy(cos_report, labels_report, thr_l)
    return {"threshold": thr_l, "choose_accuracy": acc_l, "report_accuracy": report, "best_layer": layer,
            "best_threshold": thr, "best_report_accuracy": float(report[layer])}
