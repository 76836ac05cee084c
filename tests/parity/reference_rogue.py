"""A port of Timkey & van Schijndel 2021's rogue-dimension code (github.com/wtimkey/rogue-dimensions,
``replication.ipynb``): ``cos_contrib`` (cell 14, their Eq. 3), the mean contributions and top-dim shares
(cell 15), the r² of the pair cosines without the top dims (cell 21) and the post-processed cosines of cell 39
(``similarity``: ``std_cosine``, ``mean_sub_cosine``, ``rm_pcs_cosine`` = all-but-the-top), written from the
published notebook over given pairs instead of random ones."""

import numpy as np
from scipy import stats
from scipy.spatial.distance import cosine
from sklearn.decomposition import PCA


def cos_contrib(emb1, emb2):
    numerator_terms = emb1 * emb2
    denom = np.linalg.norm(emb1) * np.linalg.norm(emb2)
    return numerator_terms / denom


def mean_contributions(a, b):
    """Cell 15: the mean of ``cos_contrib`` over the pairs; its sum is the anisotropy."""
    return np.array([cos_contrib(x, y) for x, y in zip(a, b)]).mean(axis=0)


def top_shares(cc, k=3):
    """Cell 15: the share of the anisotropy of each of the top-k dims (``np.argsort`` of the signed mean)."""
    aniso = cc.sum()
    top = np.argsort(cc)[-k:]
    return [cc[d] / aniso for d in top[::-1]]


def r2_without_top(a, b, cc, top_n):
    """Cell 21: r² between the pair cosines and the cosines over every dim but the top_n."""
    sims = [1 - cosine(x, y) for x, y in zip(a, b)]
    bottom = np.argsort(cc)[:-top_n]
    cut = [1 - cosine(x[bottom], y[bottom]) for x, y in zip(a, b)]
    return stats.pearsonr(sims, cut)[0] ** 2


def fit_postprocessing(sample, num_pcs=3):
    """Cell 39 ``get_model_mean_std_pcs`` for one layer: mean, std (NumPy's, ddof 0) and the top PCs."""
    means, stds = sample.mean(axis=0), sample.std(axis=0)
    pca = PCA(n_components=num_pcs)
    pca.fit(sample - means)
    return means, stds, pca.components_


def std_cosine(e1, e2, means, stds):
    return 1 - cosine((e1 - means) / stds, (e2 - means) / stds)


def mean_sub_cosine(e1, e2, means):
    return 1 - cosine(e1 - means, e2 - means)


def rm_pcs_cosine(e1, e2, means, pcs):
    """Cell 39 all-but-the-top: the projections on the PCs are taken of the RAW vectors (``pc.dot(emb1)``)."""
    rm1, rm2 = np.zeros(e1.shape[0]), np.zeros(e2.shape[0])
    for pc in pcs:
        rm1 += pc.dot(e1) * pc
        rm2 += pc.dot(e2) * pc
    return 1 - cosine(e1 - means - rm1, e2 - means - rm2)
