"""BERT-whitening against a port of Su et al. 2021's code (github.com/bojone/BERT-whitening, ``eng/utils.py``:
``compute_kernel_bias``, ``transform_and_normalize``; ``eng/eval.py``: ``kernel[:, :n_components]``)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from reference_whitening import compute_kernel_bias, transform_and_normalize

from outlierlab.metrics.whitening import Whitener

pytestmark = pytest.mark.parity


def _vecs(seed=0, n=400, d=16):
    g = np.random.default_rng(seed)
    mix = g.normal(0, 1, (d, d)) * np.exp(g.normal(0, 1, d))  # correlated, anisotropic
    return g.normal(0, 1, (n, d)) @ mix + g.normal(0, 5, d)  # a large mean (outlier-like offset)


def _align(ours, theirs):
    """Eigenvectors are defined up to sign: flip our columns to theirs."""
    sign = np.sign((ours * theirs).sum(0))
    return ours * sign


@pytest.mark.parametrize("k", [None, 4])
def test_kernel_bias_and_whitened_vectors_equal_su_et_al(k):
    """compute_kernel_bias: W = U diag(1/√S) of np.cov (ddof 1), bias −μ; y = (x + bias)·W[:, :k]; normalised."""
    x = _vecs()
    kernel, bias = compute_kernel_bias([x[:200], x[200:]])
    kernel = kernel if k is None else kernel[:, :k]
    w = Whitener(1, x.shape[1], k=k).fit(torch.from_numpy(x))
    assert np.allclose(w.mean[0].numpy(), -bias[0], atol=1e-10)
    assert np.allclose(_align(w.W[0].numpy(), kernel), kernel, rtol=1e-7, atol=1e-9)
    ours = F.normalize(w.transform(torch.from_numpy(x)), dim=-1).numpy()
    assert np.allclose(_align(ours, transform_and_normalize(x, kernel, bias)), transform_and_normalize(x, kernel, bias),
                       atol=1e-8)
    if k is None:  # the fitted vectors' sample covariance is exactly I (ddof 1, as np.cov)
        assert np.allclose(np.cov(w.transform(torch.from_numpy(x)).numpy().T), np.eye(16), atol=1e-8)
