"""A port of Macocco et al. 2025's analysis code (github.com/imacocco/llms_outlier_dimensions), NumPy only, for the
parity tests: the functions below follow ``src/evaluate.py`` (``outlier_dims_quantile``; the ablation loop of
``run``: conditions, random draws, KL) and ``src/analysis.py`` (``lin_coeff``: its numbers, without the plots and
the CSV), written from the published code; names and steps kept, torch replaced by NumPy."""

from collections import Counter

import numpy as np
from scipy.stats import linregress as lr
from scipy.stats import spearmanr as sp


def outlier_dims_quantile(X, loc=0.5, glo=0.99):
    """``src/evaluate.py::outlier_dims_quantile`` (sort=True, no plot)."""
    X = abs(X)
    qt = np.quantile(X, q=loc, axis=0)
    threshold = np.quantile(X, q=glo)
    idx = np.where(qt > threshold)[0]
    return idx[np.argsort(qt[idx])[::-1]]


def ablation_modalities(reps, X_out, rd_last, rng, n_random=5):
    """``src/evaluate.py::run``: the unembedding outliers and the dim sets of every condition."""
    D = X_out.shape[1]
    rd_out = outlier_dims_quantile(X_out)
    not_out = np.setdiff1d(np.arange(D), rd_out)
    not_last = np.setdiff1d(np.arange(D), rd_last)
    not_rd = list(set.intersection(*[set(not_out), set(not_last)]))
    mods = {"only_ODs": rd_last, "only_out": rd_out, "ablate_ODs": not_last, "ablate_out": not_out}
    for i in range(n_random):
        mods["only_random" + str(i)] = rng.choice(not_rd, len(rd_last), replace=False)
        mods["ablate_random" + str(i)] = np.setdiff1d(np.arange(D), mods["only_random" + str(i)])
    return mods


def log_softmax(z):
    z = z - z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def score(reps, X_out, mods, next_token):
    """``src/evaluate.py::run``'s loop: per condition the top-1 token (``idx[:, 0]``), KL(full ‖ condition),
    entropy and surprisal of the ground truth."""
    P = log_softmax(reps @ X_out.T)
    out = {"full_model": {"top": P.argmax(1), "entropy": (-np.exp(P) * P).sum(1),
                          "surprisal": -P[np.arange(len(P)), next_token]}}
    for k, feats in mods.items():
        Q = log_softmax(reps[:, feats] @ X_out[:, feats].T)
        out[k] = {"top": Q.argmax(1), "entropy": (-np.exp(Q) * Q).sum(1),
                  "surprisal": -Q[np.arange(len(Q)), next_token], "kl_div": (np.exp(P) * (P - Q)).sum(1)}
    return out


def lin_coeff(preds, next_token, freqs):
    """``src/analysis.py::lin_coeff`` for one condition: ``preds`` its top-1 tokens, ``freqs`` the counts file
    ``[[token_id, count], ...]``; returns (slope, spearman, n_tokens, accuracy), 0 for a failed fit as theirs."""
    tot = freqs[:, 1].sum()
    freqs = dict(zip(freqs[:, 0], freqs[:, 1] / tot))
    tmp = list(preds)
    c = Counter(tmp)
    n_tokens = len(c)
    accuracy = np.sum(next_token == np.array(tmp)) / len(tmp)
    vocab = set.intersection(*[set(c.keys()), set(freqs.keys())])
    ref = np.array([freqs[kk] for kk in vocab])
    test = np.array([c[kk] for kk in vocab]) / len(tmp)
    try:
        spear = sp(ref, test)
        line = lr(ref, test)
        return line.slope, spear[0], n_tokens, accuracy
    except Exception:  # noqa: BLE001 - theirs is a bare except
        return 0, 0, n_tokens, accuracy
