"""Activation outlier dims (Luo et al. 2021 §2) and the ablation control draw."""

import pytest
import torch

from outlierlab.analysis.outlier_dims import detect_outlier_dims, outlier_dims_by_share, outlier_dims_by_sigma, random_dims
from outlierlab.analysis.outlier_stats import OutlierAccumulator, valid_token_mask

L, N, D = 2, 2000, 32


def _planted(seed: int = 0) -> torch.Tensor:
    """Layer 0: +20 on dim 5 for 90% of tokens; layer 1: −20 on dim 7 for 90% of tokens."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(L, N, D, generator=g)
    rows = torch.randperm(N, generator=g)[: int(0.9 * N)]
    h[0, rows, 5] += 20.0
    h[1, rows, 7] -= 20.0
    return h


def test_planted_activation_outlier_share_and_detection():
    acc = OutlierAccumulator(L, D)
    acc.update(_planted())
    smax, smin = acc.argmax_share(), acc.argmin_share()
    # the 10% untouched tokens add ~1/32 of their share: 0.9 ≤ share ≤ 0.9 + 0.1·(a few /32)
    assert 0.9 <= smax[0, 5] < 0.91
    assert 0.9 <= smin[1, 7] < 0.91
    assert smax[1].max() < 0.1 and smin[0].max() < 0.1  # no planted dim in the other direction
    assert torch.allclose(smax.sum(1), torch.ones(L, dtype=torch.float64))
    assert detect_outlier_dims(acc) == [[5], [7]]
    assert detect_outlier_dims(acc, method="sigma") == [[5], [7]]
    assert acc.mean()[0, 5] == pytest.approx(18.0, abs=0.1) and acc.mean()[1, 7] == pytest.approx(-18.0, abs=0.1)
    s = acc.summary(top_k=3)
    assert (s[0]["argmax_dim"], s[1]["argmin_dim"], s[0]["top_dims"][0], s[1]["top_dims"][0]) == (5, 7, 5, 7)
    assert s[0]["argmax_share"] == pytest.approx(float(smax[0, 5])) and s[0]["n_tokens"] == N


def test_isotropic_data_has_no_outlier_by_share():
    acc = OutlierAccumulator(1, D)
    acc.update(torch.randn(1, N, D, generator=torch.Generator().manual_seed(1)))
    assert detect_outlier_dims(acc) == [[]]
    assert acc.argmax_share().max() < 0.06  # ~1/32 each


def test_streaming_equals_in_memory_and_merge():
    h = _planted(seed=2)
    acc = OutlierAccumulator(L, D)
    for chunk in torch.split(h, [1, 333, 666, 1000], dim=1):
        acc.update(chunk)
    acc.update(h[:, :0])  # empty chunk is a no-op
    assert acc.count == N
    assert torch.allclose(acc.mean(), h.double().mean(1), atol=1e-6, rtol=0)
    expect_max = torch.stack([torch.bincount(h[i].argmax(-1), minlength=D) for i in range(L)])
    expect_min = torch.stack([torch.bincount(h[i].argmin(-1), minlength=D) for i in range(L)])
    assert torch.equal(acc.argmax_counts, expect_max) and torch.equal(acc.argmin_counts, expect_min)
    a, b = OutlierAccumulator(L, D), OutlierAccumulator(L, D)
    a.update(h[:, :700])
    b.update(h[:, 700:])
    a.merge(b)
    assert a.count == N and torch.allclose(a.mean(), acc.mean(), atol=1e-12)
    assert torch.equal(a.argmax_counts, acc.argmax_counts)
    # raw tensors are the live state (what an all_reduce would modify in place)
    for t in a.tensors():
        t.mul_(2)
    assert a.count == 2 * N and torch.allclose(a.mean(), acc.mean(), atol=1e-12)


def test_update_with_mask_and_valid_token_mask():
    attn = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]])
    special = torch.tensor([[1, 0, 0, 1, 0], [1, 0, 1, 0, 0]])
    m = valid_token_mask(attn, special)
    assert m.tolist() == [[False, True, True, False, False], [False, True, False, False, False]]
    assert valid_token_mask(attn).sum() == 7
    hs = torch.arange(L * 2 * 5 * 3, dtype=torch.float32).view(L, 2, 5, 3)
    acc = OutlierAccumulator(L, 3)
    acc.update(hs, mask=m)
    assert acc.count == 3
    assert torch.allclose(acc.mean(), hs[:, m].double().mean(1))


def test_share_and_sigma_rules_on_hand_values():
    smax = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25, 0.25, 0.25, 0.25]])
    smin = torch.tensor([[0.0, 0.0, 0.1, 0.9], [0.1, 0.1, 0.1, 0.7]])
    assert outlier_dims_by_share(smax, smin, 0.25) == [[3, 0, 1], [3, 0, 1, 2]]
    assert outlier_dims_by_share(smax, smin, 0.6) == [[3], [3]]
    mean = torch.zeros(1, 100)
    mean[0, 42] = 50.0
    mean[0, 7] = -49.0  # also far out: both flagged, largest |deviation| first
    assert outlier_dims_by_sigma(mean) == [[42, 7]]
    with pytest.raises(ValueError, match="method"):
        detect_outlier_dims({"mean": mean}, method="pca")
    with pytest.raises(ValueError, match="argmax_share"):
        detect_outlier_dims({"mean": mean})
    with pytest.raises(ValueError, match="empty"):
        OutlierAccumulator(1, 4).mean()


def test_random_dims_excludes_and_is_reproducible():
    excl = [3, 10, 11, 500]
    a, b = random_dims(768, 20, excl, 123), random_dims(768, 20, excl, 123)
    assert a == b and len(set(a)) == 20 and not set(a) & set(excl)
    assert random_dims(768, 20, excl, 124) != a
    assert random_dims(16, 12, [0, 1, 2, 3], 0) == list(range(4, 16))  # all that is left
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    assert random_dims(64, 4, [1], g1) == random_dims(64, 4, [1], g2)
    with pytest.raises(ValueError, match="cannot draw"):
        random_dims(8, 5, [0, 1, 2, 3])
