"""A port of Su et al. 2021's BERT-whitening (github.com/bojone/BERT-whitening, ``eng/utils.py``:
``compute_kernel_bias``, ``transform_and_normalize``; ``eng/eval.py`` keeps ``kernel[:, :n_components]``),
written from the published code."""

import numpy as np


def compute_kernel_bias(vecs):
    """y = (x + bias).dot(kernel)."""
    vecs = np.concatenate(vecs, axis=0)
    mu = vecs.mean(axis=0, keepdims=True)
    cov = np.cov(vecs.T)
    u, s, vh = np.linalg.svd(cov)
    W = np.dot(u, np.diag(1 / np.sqrt(s)))
    return W, -mu


def transform_and_normalize(vecs, kernel=None, bias=None):
    if not (kernel is None or bias is None):
        vecs = (vecs + bias).dot(kernel)
    norms = (vecs ** 2).sum(axis=1, keepdims=True) ** 0.5
    return vecs / np.clip(norms, 1e-8, np.inf)
