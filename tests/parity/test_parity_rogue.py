"""Rogue dimensions and the post-processed cosines against a port of Timkey & van Schijndel 2021's notebook
(github.com/wtimkey/rogue-dimensions, ``replication.ipynb``: ``cos_contrib`` cell 14, contributions and top-dim
shares cell 15, r² without the top dims cell 21, ``similarity`` cell 39)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.spatial.distance import cosine
from reference_rogue import (cos_contrib, fit_postprocessing, mean_contributions, mean_sub_cosine, r2_without_top,
                             rm_pcs_cosine, std_cosine, top_shares)

from outlierlab.metrics.rogue_dims import cosine_contributions, ranking_without_top, top_share
from outlierlab.metrics.whitening import Whitener

pytestmark = pytest.mark.parity


def _pairs(seed=0, p=300, d=20):
    """Pairs with two rogue dims: a large shared offset on dim 3 and a smaller one on dim 11."""
    g = np.random.default_rng(seed)
    a, b = g.normal(0, 1, (p, d)), g.normal(0, 1, (p, d))
    for x in (a, b):
        x[:, 3] += 8.0
        x[:, 11] -= 3.0
    return a, b


def test_cosine_contributions_and_top_shares_equal_the_notebook():
    """cell 14 cos_contrib (Eq. 3) averaged over pairs; cell 15 shares of the top 3 (signed argsort)."""
    a, b = _pairs()
    theirs = mean_contributions(a, b)
    ours = cosine_contributions(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    assert np.allclose(ours, theirs, atol=1e-14)
    assert ours.sum() == pytest.approx(np.mean([cos_contrib(x, y).sum() for x, y in zip(a, b)]), abs=1e-14)
    shares = top_shares(theirs, 3)
    for k in (1, 2, 3):
        assert float(top_share(torch.from_numpy(ours), k)) == pytest.approx(sum(shares[:k]), abs=1e-12)
    assert np.argsort(theirs)[-2:].tolist() == [11, 3]


@pytest.mark.parametrize("top_n", [1, 3, 5])
def test_r2_without_the_top_dims_equals_the_notebook(top_n):
    """cell 21: r² of the pair cosines against those over every dim but the top_n (ours: those dims set to 0 in
    both vectors — the same cosine)."""
    a, b = _pairs(1)
    cc = mean_contributions(a, b)
    dims = torch.from_numpy(np.argsort(cc)[-top_n:].copy())[None]
    r2, _ = ranking_without_top(torch.from_numpy(a)[None], torch.from_numpy(b)[None], dims)
    assert float(r2[0]) == pytest.approx(r2_without_top(a, b, cc, top_n), abs=1e-12)


def _fitted(sample, method, **kw):
    return Whitener(1, sample.shape[1], method=method, **kw).fit(torch.from_numpy(sample))


def _cos(w, x, y):
    tx, ty = w.transform(torch.from_numpy(np.stack([x, y])))
    return float(F.cosine_similarity(tx, ty, dim=0))


def test_standardized_and_mean_removed_cosines_equal_the_notebook():
    """cell 39 std_cosine (NumPy std, ddof 0; ours ddof 1: a common factor that no cosine sees) and
    mean_sub_cosine."""
    sample = np.concatenate(_pairs(2))
    means, stds, _ = fit_postprocessing(sample)
    std_w, center_w = _fitted(sample, "standardize"), _fitted(sample, "center")
    a, b = _pairs(3, p=20)
    for x, y in zip(a, b):
        assert _cos(std_w, x, y) == pytest.approx(std_cosine(x, y, means, stds), abs=1e-12)
        assert _cos(center_w, x, y) == pytest.approx(mean_sub_cosine(x, y, means), abs=1e-12)


def test_all_but_the_top_projects_the_centred_vector_where_the_notebook_projects_the_raw_one():
    """cell 39 rm_pcs_cosine, D = 3: ``x − μ − Σ (u·x) u``; ours (Mu & Viswanath's PCA on centred data, applied
    consistently) ``x − μ − Σ (u·(x − μ)) u``.  Equal when the mean has no component on the top PCs; with a large
    mean the cosines differ — our deliberate choice (docs/fidelity.md)."""
    sample = np.concatenate(_pairs(4))
    means, _, pcs = fit_postprocessing(sample, num_pcs=3)
    ours = _fitted(sample, "abtt", abtt_d=3)
    a, b = _pairs(5, p=20)
    proj = pcs.T @ pcs  # Σ_j u_j u_jᵀ over the 3 PCs

    def centred_form(x, y):  # the notebook's line with pc.dot(emb - mean)
        cx, cy = x - means, y - means
        return 1 - cosine(cx - proj @ cx, cy - proj @ cy)

    centred = [centred_form(x, y) for x, y in zip(a, b)]
    literal = [rm_pcs_cosine(x, y, means, pcs) for x, y in zip(a, b)]
    mine = [_cos(ours, x, y) for x, y in zip(a, b)]
    assert np.allclose(mine, centred, atol=1e-10)
    assert np.abs(np.array(literal) - np.array(mine)).max() > 0.05  # a large mean: the raw projection differs
    zero_mean = sample - means  # a centred space: both forms agree
    m0, _, pcs0 = fit_postprocessing(zero_mean, num_pcs=3)
    ours0 = _fitted(zero_mean, "abtt", abtt_d=3)
    for x, y in zip(a - means, b - means):
        assert _cos(ours0, x, y) == pytest.approx(rm_pcs_cosine(x, y, m0, pcs0), abs=1e-10)
