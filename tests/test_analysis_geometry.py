"""Rogue dimensions (Timkey & van Schijndel 2021), IsoScore / IsoScore* (Rudman et al. 2022; Rudman & Eickhoff
2023) and the affine post-processing transforms (standardize, all-but-the-top, center; Mu & Viswanath 2018)."""

import math

import numpy as np
import pytest
import torch

from outlierlab.metrics.isoscore import (covariance, isoscore, isoscore_from_covariance, isoscore_star,
                                          transformed_covariance)
from outlierlab.metrics.postprocessing import default_abtt_d, fit_size
from outlierlab.metrics.rogue_dims import (RogueSummary, cosine_contributions, ranking_without_top, rogue_summary,
                                           top_share)
from outlierlab.metrics.similarity import anisotropy
from outlierlab.metrics.transforms import FittedTransform, Whitener
from outlierlab.metrics.whitening import DegenerateWhiteningError


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------------------- rogue dimensions
def test_contributions_of_hand_made_pairs_sum_exactly_to_the_mean_cosine():
    a = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    b = torch.tensor([[1.0, 1.0, 0.0], [0.0, 1.0, 1.0]], dtype=torch.float64)
    # pair 1: x·y = 1, ‖x‖‖y‖ = √2 -> dim 0 holds 1/√2; pair 2: x·y = 1 on dim 1, ‖x‖‖y‖ = 2 -> 1/2
    cc = cosine_contributions(a, b)
    assert torch.allclose(cc, torch.tensor([0.5 / math.sqrt(2), 0.25, 0.0], dtype=torch.float64), atol=1e-15)
    assert float(cc.sum()) == pytest.approx((1 / math.sqrt(2) + 0.5) / 2, abs=1e-15)
    assert float(cc.sum()) == pytest.approx(float(anisotropy(a, b)), abs=1e-12)
    # on random layers too: Σ_i CC_i = anisotropy, layer by layer
    x, y = torch.randn(3, 50, 16, generator=_g()), torch.randn(3, 50, 16, generator=_g(1)) + 0.3
    assert torch.allclose(cosine_contributions(x, y).sum(-1), anisotropy(x.double(), y.double()), atol=1e-12)


def test_a_planted_large_constant_dim_gets_almost_all_of_the_anisotropy():
    x, y = torch.randn(2, 400, 32, generator=_g(2)).unbind(0)
    x[:, 7] += 40.0
    y[:, 7] += 40.0
    cc = cosine_contributions(x, y)
    assert int(cc.argmax()) == 7
    assert float(top_share(cc[None], 1)[0]) > 0.99
    assert float(cc.sum()) > 0.9  # the dim makes the space anisotropic
    # a rogue dim that also varies decides the ranking of the pairs (Timkey & van Schijndel §4): without it the
    # cosines correlate far less with the full ones than without an ordinary dim
    x[:, 7] += 20.0 * torch.randn(400, generator=_g(12))
    y[:, 7] += 20.0 * torch.randn(400, generator=_g(13))
    r2_rogue, rho_rogue = ranking_without_top(x[None], y[None], torch.tensor([[7]]))
    r2_plain, rho_plain = ranking_without_top(x[None], y[None], torch.tensor([[3]]))
    assert float(r2_rogue[0]) < 0.3 and float(rho_rogue[0]) < 0.6
    assert float(r2_plain[0]) > 0.95 and float(rho_plain[0]) > 0.95
    assert 0.0 <= float(r2_rogue[0]) <= 1.0
    s = rogue_summary(x, y, (1, 3, 5))
    assert int(s.order[0, 0]) == 7 and set(s.share) == {1, 3, 5} and float(s.share[5][0]) >= float(s.share[1][0]) - 1e-9


def test_rogue_summaries_of_single_layers_stack_to_the_summary_of_all_layers():
    g = _g(21)
    a, b = torch.randn(3, 50, 12, generator=g), torch.randn(3, 50, 12, generator=g)
    a[1, :, 4] += 6.0  # a layer with a rogue dim, whose shares are defined
    b[1, :, 4] += 6.0
    whole = rogue_summary(a, b, (1, 3))
    parts = RogueSummary.stack([rogue_summary(a[i:i + 1], b[i:i + 1], (1, 3)) for i in range(3)])
    assert torch.equal(parts.cc, whole.cc) and torch.equal(parts.order, whole.order)
    for f in ("share", "r2", "spearman"):
        for k in (1, 3):
            # exactly equal, NaN (an undefined share) where the whole has NaN
            assert torch.allclose(getattr(parts, f)[k], getattr(whole, f)[k], rtol=0, atol=0, equal_nan=True)
    assert int(parts.order[1, 0]) == 4 and parts.anisotropy.shape == (3,)


# ---------------------------------------------------------------------------------------------- IsoScore
def _isoscore_reference(points: np.ndarray) -> float:
    """Rudman et al.'s IsoScore.py, steps 2-7, on points [N, n] (their input is the transpose, [n, N])."""
    pts = points - points.mean(0)
    cov_diag = np.linalg.eigvalsh(np.cov(pts.T))[::-1]  # PCA-rotated variances
    n = len(cov_diag)
    normalized = cov_diag * np.sqrt(n) / np.linalg.norm(cov_diag)
    defect = np.linalg.norm(normalized - np.ones(n)) / np.sqrt(2 * (n - np.sqrt(n)))
    return ((n - defect ** 2 * (n - np.sqrt(n))) ** 2 - n) / (n * (n - 1))


def test_isoscore_is_one_for_an_isotropic_gaussian_and_zero_for_points_on_a_line():
    n_points, d = 20000, 8
    iso = float(isoscore(torch.randn(n_points, d, generator=_g(3), dtype=torch.float64)))
    # sampling error of the eigenvalues ~ √(d/N): the participation ratio drops by ~ d/N
    assert 1.0 - iso < 5 * d / n_points
    line = torch.randn(500, 1, generator=_g(4), dtype=torch.float64) * torch.randn(1, d, generator=_g(5),
                                                                                    dtype=torch.float64)
    assert abs(float(isoscore(line + 3.0))) < 1e-12
    # a space using 2 of 8 dims equally: (PR - 1)/(n - 1) = (2 - 1)/7
    plane = torch.zeros(4000, d, dtype=torch.float64)
    plane[:, :2] = torch.randn(4000, 2, generator=_g(6), dtype=torch.float64)
    assert float(isoscore_from_covariance(torch.diag(torch.tensor([1.0, 1, 0, 0, 0, 0, 0, 0])))) == pytest.approx(1 / 7)


def test_isoscore_equals_the_papers_formula_on_a_hand_computed_3_dim_covariance():
    # eigenvalues 4, 1, 1: normalised to norm √3 -> √3·(4,1,1)/√18; isotropy defect and score by hand
    lam = np.array([4.0, 1.0, 1.0])
    n = 3
    lam_hat = lam * np.sqrt(n) / np.linalg.norm(lam)
    defect = np.linalg.norm(lam_hat - 1) / np.sqrt(2 * (n - np.sqrt(n)))
    by_hand = ((n - defect ** 2 * (n - np.sqrt(n))) ** 2 - n) / (n * (n - 1))
    assert by_hand == pytest.approx(((6 ** 2 / 18) - 1) / 2)  # = (PR - 1)/(n - 1), PR = (Σλ)²/Σλ²
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(3, 3)))
    cov = q @ np.diag(lam) @ q.T  # the same spectrum, rotated: IsoScore is rotation invariant (PCA step)
    assert float(isoscore_from_covariance(torch.from_numpy(cov))) == pytest.approx(by_hand, abs=1e-12)
    # and on points, against the authors' steps
    pts = np.random.default_rng(1).normal(size=(300, 3)) @ np.diag([2.0, 1.0, 0.5]) @ q
    assert float(isoscore(torch.from_numpy(pts))) == pytest.approx(_isoscore_reference(pts), abs=1e-12)


def test_isoscore_from_the_streamed_covariance_equals_the_batch_one():
    x = torch.randn(2, 3000, 12, generator=_g(7)) * torch.linspace(0.2, 3.0, 12) + 5.0  # large mean: shifted sums
    w = Whitener(2, 12)
    for chunk in x.split(257, dim=1):
        w.partial_fit(chunk)
    w.finalize()
    streamed = isoscore_from_covariance(w.cov)
    batch = isoscore(x.double())
    assert torch.allclose(streamed, batch, atol=1e-10)
    # IsoScore* with zeta = 0 is IsoScore; zeta = 1 is the score of C0 alone (identity: 1)
    c = covariance(x.double())
    assert torch.allclose(isoscore_star(c, None, 0.0), batch, atol=1e-12)
    assert torch.allclose(isoscore_star(c, None, 1.0), torch.ones(2, dtype=torch.float64), atol=1e-12)
    # the covariance after an affine map is WᵀΣW: IsoScore of whitened data is 1
    z = w.transform(x.double())
    assert torch.allclose(isoscore(z), isoscore_from_covariance(transformed_covariance(w.cov, w.W)), atol=1e-8)
    assert torch.allclose(isoscore(z), torch.ones(2, dtype=torch.float64), atol=1e-8)


# ------------------------------------------------------------------------- standardize, abtt, center
def _data(seed=8, n=600, d=16):
    scale = torch.linspace(0.1, 5.0, d)
    return torch.randn(2, n, d, generator=_g(seed), dtype=torch.float64) * scale + torch.arange(d) * 0.7


def test_standardization_gives_mean_0_std_1_on_the_fitting_data():
    x = _data()
    w = Whitener(2, 16, method="standardize").fit(x)
    z = w.transform(x)
    assert torch.allclose(z.mean(1), torch.zeros(2, 16, dtype=torch.float64), atol=1e-10)
    assert torch.allclose(z.std(1), torch.ones(2, 16, dtype=torch.float64), atol=1e-10)  # ddof = 1, as np.cov
    # per dim only: the correlations between dims are kept (unlike whitening)
    assert torch.allclose(torch.corrcoef(z[0].T), torch.corrcoef(x[0].T), atol=1e-10)


@pytest.mark.parametrize("d_top", [0, 1, 3])
def test_abtt_removes_exactly_the_top_d_principal_components(d_top):
    x = _data(9)
    w = Whitener(2, 16, method="abtt", abtt_d=d_top).fit(x)
    z = w.transform(x)
    _, u = torch.linalg.eigh(covariance(x))
    top = u.flip(-1)[:, :, :d_top]  # the top D principal directions of the fit data
    assert torch.allclose(z @ top, torch.zeros(2, x.shape[1], d_top, dtype=torch.float64), atol=1e-9)
    xc = x - x.mean(1, keepdim=True)
    rest = u.flip(-1)[:, :, d_top:]
    assert torch.allclose(z @ rest, xc @ rest, atol=1e-9)  # and nothing else
    if d_top == 0:  # D = 0 is mean removal, = center
        assert torch.allclose(z, Whitener(2, 16, method="center").fit(x).transform(x), atol=1e-12)
        assert torch.allclose(z, xc, atol=1e-10)


def test_one_pass_fits_every_method_and_the_default_d_is_d_over_100():
    assert [default_abtt_d(d) for d in (64, 128, 384, 768, 1024)] == [1, 1, 4, 8, 10]
    x = _data(10)
    acc = Whitener(2, 16).fit(x)
    for method in ("standardize", "abtt", "center"):
        derived = acc.derive(method)
        direct = Whitener(2, 16, method=method).fit(x)
        assert derived.method == method and torch.allclose(derived.W, direct.W, atol=1e-12)
        ft = FittedTransform(method, 16, whitener=derived)
        assert torch.allclose(ft(x), direct.transform(x), atol=1e-10) and ft.out_dim == 16
    with pytest.raises(ValueError, match="abtt_d must be in"):
        Whitener(1, 16, method="abtt", abtt_d=16)
    with pytest.raises(ValueError, match="whiten only"):
        Whitener(1, 16, k=4, method="center")


@pytest.mark.parametrize("method, p", [("standardize", 2), ("abtt", 5), ("center", 1)])
def test_fits_on_too_few_distinct_vectors_are_refused_as_whitening_is(method, p):
    d, n = 32, 12
    pts = torch.randn(n, d, generator=_g(11), dtype=torch.float64)
    assert fit_size(method, d, abtt_d=4) == p
    few = pts[: max(1, 2 * p - 1)].repeat(5, 1)  # 2p - 1 distinct vectors, each 5 times
    w = Whitener(1, d, method=method, abtt_d=4 if method == "abtt" else None).fit(few)
    with pytest.raises(DegenerateWhiteningError) as e:
        w.check("the 5x repeated sentence vectors")
    msg = str(e.value)
    assert "\n" not in msg and method in msg and "distinct" in msg and "transform.allow_degenerate=true" in msg
    fit = w.check("x", allow_degenerate=True)
    assert fit.degenerate and fit.columns()[f"{method}_degenerate"] is True and "DEGENERATE" in fit.describe()
    enough = Whitener(1, d, method=method, abtt_d=4 if method == "abtt" else None).fit(pts[: 2 * p].repeat(3, 1))
    assert not enough.check("x").degenerate
    if method == "abtt":  # N ≤ D + 1 distinct: every fitted vector is removed entirely
        tiny = Whitener(1, d, method="abtt", abtt_d=4).fit(pts[:5])
        assert tiny.transform(pts[:5]).abs().max() < 1e-9


def test_a_share_of_an_anisotropy_indistinguishable_from_zero_is_not_given():
    x, y = torch.randn(2, 2, 500, 16, generator=_g(14), dtype=torch.float64).unbind(0)  # centred, isotropic
    y[1] += 3.0
    x[1] += 3.0  # layer 1: every vector shares a direction -> clearly anisotropic
    s = rogue_summary(x, y, (1, 3))
    assert math.isnan(float(s.share[1][0])) and math.isnan(float(s.share[3][0]))
    assert not math.isnan(float(s.share[3][1])) and 0 < float(s.share[3][1]) <= 1.0
    assert torch.allclose(s.anisotropy, anisotropy(x, y), atol=1e-12)  # CC_i are kept either way


def test_the_monitor_records_the_top_dims_share_and_isoscore_per_layer():
    from outlierlab.metrics.monitor_records import hidden_state_records

    hidden = torch.randn(3, 8, 12, 32, generator=_g(15))
    hidden[2, :, :, 9] += 25.0  # layer 2: one dim carries a large constant -> it causes the anisotropy
    mask = torch.ones(8, 12, dtype=torch.long)
    rows, summary = hidden_state_records(5, hidden, mask, vectors=False)
    got = {(r[1], r[2]): r for r in rows}
    assert got[("layer_2", "rogue_top1_share")][3] == 9 and got[("layer_2", "rogue_top1_share")][4] > 0.9
    assert math.isnan(got[("layer_0", "rogue_top1_share")][4])  # isotropic noise: no share of ~0
    for layer in range(3):
        assert 0.0 <= got[(f"layer_{layer}", "isoscore")][4] <= 1.0
    # IsoScore is a property of the covariance: the constant that makes layer 2 anisotropic leaves it unchanged
    plain = hidden[2].clone()
    plain[..., 9] -= 25.0
    assert got[("layer_2", "isoscore")][4] == pytest.approx(float(isoscore(plain.reshape(-1, 32).double())), abs=1e-9)
    assert torch.allclose(summary["isoscore"], isoscore(hidden.reshape(3, -1, 32).double()), atol=1e-9)


def test_isotropy_takes_the_transformed_covariance_without_products_for_none_and_clip():
    """evaluate's isotropy: Σ itself (none) and Σ with the clipped dims' rows/columns zeroed (clip) are exactly
    IᵀΣI and diag(k)ᵀΣdiag(k) — the IsoScore the products gave, at O(d²) instead of two d³ products; a fitted map
    still goes through WᵀΣW, which equals the covariance of the mapped points."""
    from types import SimpleNamespace

    from outlierlab.metrics.transform_fit import FittedTransforms
    from outlierlab.metrics.transforms import clip_mask
    from outlierlab.evaluation.analyses.isotropy import transformed_layer_covariance

    def transform_matrix(st, name: str, layer: int) -> torch.Tensor:
        """W itself, ``[1, d, d]`` float64: I (none), diag(kept dims) (clip), the fitted map."""
        if name == "none":
            return torch.eye(st.dim, dtype=torch.float64)[None]
        if name == "clip":
            return torch.diag_embed((~clip_mask(st.transforms.clip_dims, st.num_layers, st.dim)[layer:layer + 1]
                                     ).to(torch.float64))
        return st.transforms.fitted[name].W[layer:layer + 1].to(torch.float64)

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 300, 6, dtype=torch.float64, generator=g) * torch.tensor([1.0, 5.0, 0.3, 2.0, 1.0, 9.0])
    w = Whitener(2, 6).fit(x)
    st = SimpleNamespace(num_layers=2, dim=6, transforms=FittedTransforms(clip_dims=[[1], [1, 5]], fitted={"whiten": w}))
    for layer in (0, 1):
        cov = covariance(x[layer:layer + 1])
        for name in ("none", "clip", "whiten"):
            got = transformed_layer_covariance(st, name, layer, cov)
            assert torch.equal(got, transformed_covariance(cov, transform_matrix(st, name, layer))), (name, layer)
        clipped = x[layer].clone()
        clipped[:, st.transforms.clip_dims[layer]] = 0
        assert torch.allclose(transformed_layer_covariance(st, "clip", layer, cov), covariance(clipped[None]),
                              atol=1e-12)
        assert float(isoscore_from_covariance(transformed_layer_covariance(st, "whiten", layer, cov))[0]) == \
            pytest.approx(1.0, abs=1e-6)  # whitened: every direction carries the same variance


def test_a_rogue_k_above_the_hidden_size_is_refused_not_dropped():
    # k = 500 of 12 dims has no top-k share; it used to vanish from the tables (no top500_share column, no word)
    g = _g(31)
    a, b = torch.randn(2, 30, 12, generator=g), torch.randn(2, 30, 12, generator=g)
    a[:, :, 4] += 6.0  # a rogue dim: the shares are defined
    b[:, :, 4] += 6.0
    with pytest.raises(ValueError, match=r"rogue k \[500\] outside 1\.\.12.*anisotropy\.rogue_k"):
        rogue_summary(a, b, (1, 500))
    # k = d is allowed: all dims hold the whole anisotropy, a share of exactly 1
    s = rogue_summary(a, b, (1, 12))
    assert set(s.share) == {1, 12} and torch.allclose(s.share[12], torch.ones(2, dtype=s.share[12].dtype))
