r"""The frequent-token heuristic of last-layer outlier dims (Macocco et al. 2025, "Outlier dimensions favor frequent
tokens in language models").

The LM head's logits are linear in the vector h entering its output layer: ``\ell = hW^\top + b``, so they split over
any set of dims S,

.. math:: \ell = \underbrace{h_S W_S^\top}_{\text{the dims } S \text{ alone}} + \underbrace{h_{\bar S}
          W_{\bar S}^\top + b}_{\text{everything but } S},

Macocco et al.'s ``h[:, S] @ W[S, :]``.  Their claim: with S the last layer's outlier dims, S alone ranks tokens by
corpus frequency ("predict a frequent token"), and removing S moves predictions away from frequent tokens.

``macocco_outlier_dims`` is their rule (``outlier_dims_quantile``, ``src/evaluate.py``), on the last layer's vectors
*and* on the unembedding rows (their ``only_out``/``ablate_out`` conditions); ``split_logits`` the two parts above (the
bias stays with "everything but S"); ``ConditionStats`` streams each condition's KL from the full model, entropy,
accuracy and per-token counts; ``lin_coeff`` is their measure (``src/analysis.py``; NaN and a status where their code
writes 0); ``score_conditions`` scores every condition, one row of ``COLUMNS`` each; ``frequency_spearman`` is ours,
over *every* counted token (does the condition *rank* the vocabulary by frequency).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from dataclasses import dataclass

import numpy as np
import torch
from scipy import stats
from torch import Tensor

from outlierlab.metrics.outlier_dims import random_dims
from outlierlab.metrics.sts_scores import spearman_columns

__all__ = ["macocco_outlier_dims", "split_logits", "ConditionStats", "frequency_spearman", "lin_coeff", "LinCoeff",
           "score_conditions", "COLUMNS", "METRICS"]

#: Per-condition metrics of :func:`score_conditions` (random controls: mean and ``*_std`` over the draws) and the
#: columns of ``frequent_tokens.csv``.
METRICS = ("kl", "entropy", "surprisal", "top1", "spearman", "slope", "n_tokens", "n_correlated",
           "logprob_spearman")
COLUMNS = (["rule", "condition", "n_dims", "dims", *METRICS, "lin_status"] + [f"{m}_std" for m in METRICS]
           + ["n_draws", "n_positions", "n_tokens_counted", "positions", "objective"])


def macocco_outlier_dims(h: Tensor, percentile: float = 99.0, local_quantile: float = 0.5) -> list[int]:
    """Macocco et al. 2025's outlier dims of ``h`` [N, d] (last-layer vectors, or the unembedding [V, d]): d such that
    the ``local_quantile`` (median) of ``|h_{n,d}|`` over rows exceeds the ``percentile``-th percentile of all ``|h|``,
    strict ``>``, sorted by that median, largest first — their ``outlier_dims_quantile(X, loc=0.5, glo=0.99)`` with
    NumPy's linear-interpolation quantiles."""
    if h.ndim != 2 or h.shape[0] == 0:
        raise ValueError(f"expected vectors [N, d] with N >= 1, got {tuple(h.shape)}")
    a = h.detach().abs().to(torch.float64).cpu().numpy()
    threshold = np.quantile(a, percentile / 100.0)
    med = np.quantile(a, local_quantile, axis=0)
    dims = np.nonzero(med > threshold)[0]
    return dims[np.argsort(-med[dims], kind="stable")].tolist()


def split_logits(h: Tensor, weight: Tensor, dims: Sequence[int], bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    r"""``(only, rest)``: ``h_S W_S^\top`` and ``h_{\bar S} W_{\bar S}^\top + b`` for ``h`` ``[N, d]``, the
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

    ``update(logits [n, V], full [n, V], labels [n])`` (-100 = none); ``result``: mean KL(p_full ‖ p_cond), mean entropy
    of p_cond, top-1 accuracy, mean surprisal −log p_cond(label) (nats; Macocco et al.'s boxplots), ``top1_counts`` [V]
    and ``mean_logprob`` [V].
    """

    def __init__(self, vocab_size: int):
        self.kl = self.entropy = self.surprisal = 0.0
        self.correct = self.n = self.n_labelled = 0
        self.top1_counts = torch.zeros(vocab_size, dtype=torch.int64)
        self.logprob_sum = torch.zeros(vocab_size, dtype=torch.float64)

    @staticmethod
    def reference(full: Tensor) -> tuple[Tensor, Tensor]:
        """``(log p_full, p_full)`` float64 of the model's logits: computed once per chunk and handed to the
        ``update`` of every condition (the same numbers it would compute itself)."""
        lq = torch.log_softmax(full.to(torch.float64), -1)
        return lq, lq.exp()

    def update(self, logits: Tensor, full: Tensor, labels: Tensor, ref: tuple[Tensor, Tensor] | None = None) -> None:
        lp = torch.log_softmax(logits.to(torch.float64), -1)
        lq, q = ref if ref is not None else self.reference(full)
        self.kl += float((q * (lq - lp)).sum())
        self.entropy += float(-(lp.exp() * lp).sum())
        self.logprob_sum += lp.sum(0).cpu()
        top = logits.argmax(-1)
        self.top1_counts += torch.bincount(top.cpu(), minlength=self.top1_counts.numel())[: self.top1_counts.numel()]
        has = labels != -100
        lab = labels[has].to(top.device)
        self.correct += int((top[has] == lab).sum())
        self.surprisal -= float(lp[has.to(lp.device)].gather(1, lab[:, None].to(lp.device)).sum())
        self.n += logits.shape[0]
        self.n_labelled += int(has.sum())

    def result(self) -> dict:
        if self.n == 0:
            raise ValueError("no position was scored")
        return {"kl": self.kl / self.n, "entropy": self.entropy / self.n,
                "top1": self.correct / self.n_labelled if self.n_labelled else float("nan"),
                "surprisal": self.surprisal / self.n_labelled if self.n_labelled else float("nan"),
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


@dataclass(frozen=True)
class LinCoeff:
    """Macocco et al.'s per-condition frequency measures (``lin_coeff``).

    spearman, slope : ρ and least-squares slope of prediction frequency on corpus frequency (NaN when undefined)
    n_tokens : distinct tokens predicted at least once; n_correlated : those the corpus counts (the fit's points)
    status : ``ok``; ``no prediction``; ``one token`` (nothing to correlate); ``constant`` (ρ undefined; the slope is
        0 when only the predictions are constant)
    """

    spearman: float
    slope: float
    n_tokens: int
    n_correlated: int
    status: str


def lin_coeff(corpus_counts: Tensor, top1_counts: Tensor, min_count: int = 1) -> LinCoeff:
    r"""Macocco et al. 2025's ``lin_coeff`` (imacocco/llms_outlier_dimensions, ``src/analysis.py``) over the tokens V_c
    a condition predicts at least once and the corpus counts (``corpus_counts >= min_count``),

    .. math:: f_t = \frac{\text{corpus count}_t}{\sum_{t'} \text{corpus count}_{t'}}, \qquad
              g_t = \frac{\text{top-1 count}_t}{N}, \qquad t \in V_c

    Spearman ρ(f, g) and the slope of ``scipy.stats.linregress(f, g)``, as their code; N = sum of ``top1_counts``.
    Never-predicted tokens are *not* points (ties at 0 can flip the sign).  Where their ``try/except`` writes 0, this
    returns NaN and says why in ``status``.
    """
    counts = corpus_counts.flatten().to(torch.float64).cpu().numpy()
    pred = top1_counts.flatten().to(torch.float64).cpu().numpy()
    if counts.shape != pred.shape:
        raise ValueError(f"corpus_counts has {counts.size} tokens but top1_counts {pred.size}")
    n, total = pred.sum(), counts.sum()
    n_tokens = int((pred > 0).sum())
    keep = (pred > 0) & (counts >= min_count)
    nan = float("nan")
    if n == 0 or not keep.any():
        return LinCoeff(nan, nan, n_tokens, 0, "no prediction")
    if keep.sum() == 1:
        return LinCoeff(nan, nan, n_tokens, 1, "one token")
    f, g = counts[keep] / total, pred[keep] / n
    if np.all(f == f[0]):
        return LinCoeff(nan, nan, n_tokens, int(keep.sum()), "constant")
    slope = float(stats.linregress(f, g).slope)
    if np.all(g == g[0]):
        return LinCoeff(nan, slope, n_tokens, int(keep.sum()), "constant")
    return LinCoeff(float(stats.spearmanr(f, g)[0]), slope, n_tokens, int(keep.sum()), "ok")


def score_conditions(h: Tensor, labels: Tensor, weight: Tensor, bias: Tensor | None, sets: dict[str, list[int]],
                     freqs: Tensor, *, n_random: int, seed: int, min_count: int, chunk: int = 512) -> list[dict]:
    """Rows of ``COLUMNS`` (without ``positions``/``objective``) for ``full``, ``bias``, and per rule
    ``only``/``without`` and their random controls.  Random dims avoid the rule's own dims and both of Macocco
    et al.'s sets (``sets["macocco"]``, ``sets["unembedding"]`` where given)."""
    vocab, d = weight.shape
    gen = torch.Generator().manual_seed(int(seed))
    macocco = set(sets.get("macocco", [])) | set(sets.get("unembedding", []))
    draws = {name: [random_dims(d, len(dims), exclude=set(dims) | macocco, generator=gen) for _ in range(n_random)]
             for name, dims in sets.items() if dims and d - len(set(dims) | macocco) >= len(dims)}
    keys = [("model", "full", -1)] + ([("model", "bias", -1)] if bias is not None else [])
    for name, dims in sets.items():
        if dims:
            keys += [(name, "only", -1), (name, "without", -1)]
            keys += [(name, f"random_{c}", i) for i in range(len(draws.get(name, []))) for c in ("only", "without")]
    stats = {key: ConditionStats(vocab) for key in keys}
    for start in range(0, h.shape[0], chunk):
        hc, yc = h[start:start + chunk].to(weight), labels[start:start + chunk]
        full = hc @ weight.T + (bias if bias is not None else 0)
        ref = ConditionStats.reference(full)  # p_full once per chunk, not once per condition
        stats[("model", "full", -1)].update(full, full, yc, ref)
        if bias is not None:
            stats[("model", "bias", -1)].update(bias.expand_as(full), full, yc, ref)
        splits: dict[tuple[str, int], tuple[Tensor, Tensor]] = {}  # "only" and "without" of one dim set: one split
        for (name, cond, i), st in stats.items():
            if name == "model":
                continue
            if (name, i) not in splits:
                splits = {(name, i): split_logits(hc, weight, sets[name] if i < 0 else draws[name][i], bias)}
            only, rest = splits[(name, i)]
            st.update(only if cond.endswith("only") else rest, full, yc, ref)

    def metrics(st: ConditionStats) -> dict:
        r = st.result()
        lc = lin_coeff(freqs, r["top1_counts"], min_count)
        return {"kl": r["kl"], "entropy": r["entropy"], "surprisal": r["surprisal"], "top1": r["top1"],
                "n_positions": r["n_positions"], "spearman": lc.spearman, "slope": lc.slope, "n_tokens": lc.n_tokens,
                "n_correlated": lc.n_correlated, "lin_status": lc.status,
                "logprob_spearman": frequency_spearman(freqs, r["mean_logprob"], min_count)}

    n_counted = int((freqs >= min_count).sum())
    rows = []
    for (name, cond, i), st in stats.items():
        if i < 0:
            dims = sets.get(name, []) if name != "model" else []
            rows.append({"rule": name, "condition": cond, "n_dims": len(dims), "dims": ";".join(map(str, dims)),
                         **metrics(st), "n_draws": 1, "n_tokens_counted": n_counted})
    for name, ds in draws.items():
        for cond in ("only", "without"):
            per = [metrics(stats[(name, f"random_{cond}", i)]) for i in range(len(ds))]
            if not per:
                continue
            row = {"rule": name, "condition": f"random_{cond}", "n_dims": len(ds[0]),
                   "dims": "|".join(";".join(map(str, x)) for x in ds), "n_draws": len(per),
                   "n_positions": per[0]["n_positions"], "n_tokens_counted": n_counted,
                   "lin_status": ";".join(sorted({p["lin_status"] for p in per}))}
            for k in METRICS:
                vals = [p[k] for p in per if p[k] == p[k]]
                row[k] = statistics.fmean(vals) if vals else float("nan")
                row[f"{k}_std"] = statistics.stdev(vals) if len(vals) > 1 else float("nan")
            rows.append(row)
    return rows
