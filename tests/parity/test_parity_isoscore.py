"""IsoScore and IsoScore* against the authors' package (``pip install IsoScore``, Rudman et al. 2022; the same
code as github.com/bcbi-edu/p_eickhoff_isoscore ``IsoScore/IsoScore.py``: ``IsoScore``, ``IsoScore_star``,
``IsoScore_cov``).  Agreement to 1e-6, not 1e-12: the package takes ``torch.sqrt`` of an integer tensor
(``n = torch.tensor(points.shape[1])``), which is float32, so its normalisation carries float32 rounding (~1e-8)."""

import numpy as np
import pytest
import torch
from IsoScore import IsoScore as iso

from outlierlab.metrics.isoscore import covariance, isoscore, isoscore_from_covariance, isoscore_star

pytestmark = pytest.mark.parity
TOL = 1e-6  # the package's float32 √n (module docstring)


def _cloud(seed, n=300, d=12):
    g = np.random.default_rng(seed)
    scales = np.exp(g.normal(0, 1.0, d))  # anisotropic
    return g.normal(0, 1, (n, d)) * scales + g.normal(0, 3, d)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_isoscore_equals_the_package_on_anisotropic_clouds(seed):
    """IsoScore.IsoScore(points) (their ``IsoScore.py``)."""
    x = _cloud(seed)
    ours = float(isoscore(torch.from_numpy(x)))
    assert ours == pytest.approx(float(iso.IsoScore(x)), abs=TOL)
    assert ours == pytest.approx(float(iso.IsoScore_cov(np.cov(x.T))), abs=TOL)


@pytest.mark.parametrize("k", [1, 3, 12])
def test_k_of_n_dims_used_equally_gives_k_minus_1_over_n_minus_1_in_both(k):
    """IsoScore.IsoScore on ±e_i, i < k (Rudman et al.'s property: k of n dims used uniformly)."""
    n = 12
    pts = np.concatenate([np.eye(n)[:k], -np.eye(n)[:k]])
    expected = (k - 1) / (n - 1)
    assert float(isoscore(torch.from_numpy(pts))) == pytest.approx(expected, abs=1e-12)
    assert float(iso.IsoScore(pts)) == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("zeta", [0.0, 0.75, 1.0])
def test_isoscore_star_equals_the_package_with_a_larger_sample_as_c0(zeta):
    """IsoScore.IsoScore_star(points, C0, zeta) with C0 the covariance of a larger sample (their I-STAR
    ``analysis.py`` protocol), and with the identity (their fallback)."""
    small, big = _cloud(3, n=40), _cloud(3, n=2000)
    c0 = np.cov(big.T)
    ours = float(isoscore_star(covariance(torch.from_numpy(small)), torch.from_numpy(c0), zeta))
    assert ours == pytest.approx(float(iso.IsoScore_star(small, torch.from_numpy(c0), zeta)), abs=TOL)
    ours_eye = float(isoscore_star(covariance(torch.from_numpy(small)), None, zeta))
    assert ours_eye == pytest.approx(float(iso.IsoScore_star(small, torch.eye(12, dtype=torch.float64), zeta)),
                                     abs=TOL)
    assert float(isoscore_from_covariance(torch.from_numpy(c0))) == pytest.approx(float(iso.IsoScore_cov(c0)),
                                                                                 abs=TOL)
