"""Clip (Luo et al. 2021 §4) and whitening (Su et al. 2021)."""

import numpy as np
import pytest
import torch

from analysis.outliers import OutlierAccumulator, detect_outlier_dims
from analysis.similarity import anisotropy, paired_sentence_tokens
from analysis.transforms import Whitener, clip


def test_clip_zeroes_exactly_the_requested_dims():
    x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(0)) + 1.0
    x[1, 0, 2] = float("nan")
    before = x.clone()
    out = clip(x, [2, 6])
    assert torch.equal(x.nan_to_num(), before.nan_to_num())  # input untouched
    assert (out[..., [2, 6]] == 0).all()
    keep = [0, 1, 3, 4, 5, 7]
    assert torch.equal(out[..., keep], x[..., keep])
    per = clip(x, [[1], [], [0, 7]])
    assert (per[0, :, 1] == 0).all() and torch.equal(per[0, :, [0, 2, 3, 4, 5, 6, 7]], x[0, :, [0, 2, 3, 4, 5, 6, 7]])
    assert torch.equal(per[1].nan_to_num(), x[1].nan_to_num())
    assert (per[2, :, [0, 7]] == 0).all() and torch.equal(per[2, :, 1:7], x[2, :, 1:7])
    flat = clip(x[0], [3])
    assert (flat[:, 3] == 0).all() and torch.equal(flat[:, :3], x[0, :, :3])
    four_d = clip(x.view(3, 5, 2, 4).transpose(2, 3).reshape(3, 5, 1, 8), [[1], [2], [3]])
    assert (four_d[0, ..., 1] == 0).all() and (four_d[2, ..., 3] == 0).all() and (four_d[0, ..., 3] != 0).all()
    assert torch.equal(clip(x, []).nan_to_num(), x.nan_to_num())
    # dims given as tensors / arrays (what detect_outlier_dims users may pass)
    assert torch.equal(clip(x, torch.tensor([2, 6])).nan_to_num(), out.nan_to_num())
    mixed = clip(x, [torch.tensor([1]), np.array([], dtype=int), (0, 7)])
    assert torch.equal(mixed.nan_to_num(), per.nan_to_num())
    with pytest.raises(ValueError, match="per-layer"):
        clip(x, [[1], [2]])
    with pytest.raises(ValueError, match="out of range"):
        clip(x, [8])


def test_auto_detection_then_clip_removes_planted_dim():
    g = torch.Generator().manual_seed(1)
    h = torch.randn(2, 500, 16, generator=g)
    h[1, :, 9] += 15.0
    acc = OutlierAccumulator(2, 16)
    acc.update(h)
    dims = detect_outlier_dims(acc)
    assert dims == [[], [9]]
    out = clip(h, dims)
    assert torch.equal(out[0], h[0]) and (out[1, :, 9] == 0).all()


def _data(n: int = 3000, d: int = 16, seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(2, d, d, dtype=torch.float64, generator=g)
    return torch.randn(2, n, d, dtype=torch.float64, generator=g) @ mix + 5.0 * torch.randn(2, 1, d, dtype=torch.float64, generator=g)


def _su_numpy(x: np.ndarray):
    """Su et al.'s reference code (bert-whitening): mu, cov, u, s = svd, W = u·diag(1/√s)."""
    mu = x.mean(axis=0, keepdims=True)
    u, s, _ = np.linalg.svd(np.cov(x.T))
    return mu, u @ np.diag(1 / np.sqrt(s))


def _align_signs(w: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return w * torch.sign((w * ref).sum(-2, keepdim=True))


def test_whitened_train_vectors_have_zero_mean_identity_cov_and_match_numpy():
    x = _data()
    w = Whitener(2, 16).fit(x)
    z = w.transform(x)
    assert z.dtype == torch.float64
    for layer in range(2):
        assert z[layer].mean(0).abs().max() < 1e-8
        cov = torch.cov(z[layer].T)
        assert (cov - torch.eye(16, dtype=torch.float64)).abs().max() < 1e-4
        mu, W_np = _su_numpy(x[layer].numpy())
        W_np = torch.from_numpy(W_np)
        assert torch.allclose(w.mean[layer], torch.from_numpy(mu[0]), atol=1e-10)
        assert torch.allclose(_align_signs(w.W[layer], W_np), W_np, atol=1e-8)


def test_whitening_is_fit_only_by_partial_fit_and_streams():
    x = _data()
    w = Whitener(2, 16).fit(x)
    W0, mu0 = w.W.clone(), w.mean.clone()
    other = _data(seed=3)
    w.transform(other)
    w.transform(other.float())
    assert torch.equal(w.W, W0) and torch.equal(w.mean, mu0)
    ws = Whitener(2, 16)
    for chunk in torch.split(x, [7, 993, 1000, 1000], dim=1):
        ws.partial_fit(chunk)
    ws.finalize()
    assert ws.n == 3000
    assert torch.allclose(ws.mean, w.mean, atol=1e-6, rtol=0)
    assert torch.allclose(_align_signs(ws.W, w.W), w.W, atol=1e-6, rtol=0)


def test_whitening_removes_anisotropy_and_k_reduces():
    g = torch.Generator().manual_seed(4)
    d, n = 32, 4000
    u = torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0)
    v = torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0)
    # common offset 8·u (anisotropy) + a high-variance direction v (variance 9 + 1 vs 1 elsewhere)
    x = (8.0 * u + 3.0 * torch.randn(1, n, 1, generator=g) * v + torch.randn(1, n, d, generator=g)).float()
    a, b = paired_sentence_tokens(torch.arange(n), 0)
    assert anisotropy(x[:, a], x[:, b]).item() > 0.5
    w = Whitener(1, d).fit(x)
    z = w.transform(x)
    assert z.dtype == torch.float32
    assert anisotropy(z[:, a], z[:, b]).abs().item() < 0.05
    wk = Whitener(1, d, k=4).fit(x)
    zk = wk.transform(x[0])  # [N, d] works for L = 1
    assert zk.shape == (n, 4) and wk.W.shape == (1, d, 4)
    assert (torch.cov(zk.double().T) - torch.eye(4, dtype=torch.float64)).abs().max() < 1e-4
    # the first k columns are the top-variance directions: column 0 aligns with v
    assert torch.nn.functional.cosine_similarity(wk.W[0, :, 0], v.double(), dim=0).abs() > 0.99


def test_eps_floor_handles_clipped_rank_deficient_data_and_state_roundtrip():
    x = clip(_data(n=500), [3, 4])  # two zero-variance dims
    w = Whitener(2, 16).fit(x)
    z = w.transform(x)
    assert torch.isfinite(z).all()
    sv = w.singular_values
    assert (sv[:, -2:] < 1e-9 * sv[:, :1]).all()
    cov = torch.cov(z[0].T)
    assert (cov[:14, :14] - torch.eye(14, dtype=torch.float64)).abs().max() < 1e-4  # full-rank part whitened
    w2 = Whitener.from_state_dict(w.state_dict())
    assert torch.equal(w2.transform(x), z)
    with pytest.raises(ValueError, match="not fitted"):
        Whitener(2, 16).transform(x)
