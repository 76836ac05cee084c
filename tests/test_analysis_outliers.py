"""Activation outlier dims (Luo et al. 2021 §2) and the ablation control draw."""

import pytest
import torch

from outlierlab.metrics.outlier_dims import detect_outlier_dims, outlier_dims_by_share, outlier_dims_by_sigma, random_dims
from outlierlab.metrics.outlier_stats import OutlierAccumulator, valid_token_mask

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


def _loop_counts(h: torch.Tensor, which: str) -> torch.Tensor:
    """Reference: per layer and token, the FIRST dim holding the extreme (a NaN counts as the extreme, the
    first NaN wins), counted by hand."""
    n_layers, n, d = h.shape
    out = torch.zeros(n_layers, d, dtype=torch.int64)
    for layer in range(n_layers):
        for t in range(n):
            row = h[layer, t].tolist()
            nan = [i for i, x in enumerate(row) if x != x]
            if nan:
                best = nan[0]
            else:
                best = 0
                for i, x in enumerate(row):
                    if (x > row[best]) if which == "max" else (x < row[best]):
                        best = i
            out[layer, best] += 1
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_argmax_argmin_counts_equal_first_index_reference_with_ties_nan_and_signed_zero(dtype):
    """The counts (numpy's argmax/argmin on the CPU, torch's for other dtypes) equal a plain loop that takes
    the first of tied extremes: exact ties, -0.0 against 0.0, +-inf, NaN, a one-dim and a one-token input."""
    nan, inf = float("nan"), float("inf")
    rows = [[1.0, 3.0, 3.0, -2.0], [-0.0, 0.0, 0.0, -0.0], [0.0, -0.0, 1.0, -1.0], [2.0, 2.0, -5.0, -5.0],
            [inf, inf, -inf, -inf], [1.0, nan, 3.0, nan], [-inf, 1.0, -inf, nan], [7.0, 7.0, 7.0, 7.0]]
    g = torch.Generator().manual_seed(3)
    h = torch.stack([torch.tensor(rows), torch.randint(-2, 3, (8, 4), generator=g).float()]).to(dtype)
    acc = OutlierAccumulator(2, 4)
    acc.update(h)
    assert torch.equal(acc.argmax_counts, _loop_counts(h.float(), "max"))
    assert torch.equal(acc.argmin_counts, _loop_counts(h.float(), "min"))
    assert torch.equal(acc.argmax_counts, torch.zeros(2, 4, dtype=torch.int64).scatter_add_(
        1, h.argmax(-1), torch.ones(2, 8, dtype=torch.int64)))  # the torch kernels the numpy path replaced
    one = OutlierAccumulator(1, 1)
    one.update(torch.tensor([[[-3.0], [2.0]]], dtype=dtype))
    assert one.argmax_counts.tolist() == [[2]] and one.argmin_counts.tolist() == [[2]]
    tok = OutlierAccumulator(3, 4)
    tok.update(h[:1, :1].expand(3, 1, 4).to(dtype))
    assert tok.argmax_counts.tolist() == [[0, 1, 0, 0]] * 3 and tok.argmin_counts.tolist() == [[0, 0, 0, 1]] * 3


def test_update_counts_equal_the_previous_torch_formula_on_random_and_strided_inputs():
    """Bitwise: sum, argmax/argmin counts of several updates (strided, inference-mode, multi-layer) equal
    ``h.sum(1, float64)`` and torch's argmax/argmin + scatter_add_ (the plain formula)."""
    g = torch.Generator().manual_seed(0)
    acc, ref = OutlierAccumulator(3, 24), [torch.zeros(3, 24, dtype=torch.float64)] + [
        torch.zeros(3, 24, dtype=torch.int64) for _ in range(2)]
    for n in (1, 17, 300):
        with torch.inference_mode():
            h = torch.randn(3, n, 40, generator=g).round(decimals=1)[:, :, 8:32]  # non-contiguous, with ties
        acc.update(h)
        ref[0] += h.sum(1, dtype=torch.float64)
        ones = torch.ones(3, n, dtype=torch.int64)
        ref[1] += torch.zeros(3, 24, dtype=torch.int64).scatter_add_(1, h.argmax(-1), ones)
        ref[2] += torch.zeros(3, 24, dtype=torch.int64).scatter_add_(1, h.argmin(-1), ones)
    assert torch.equal(acc.sum, ref[0]) and torch.equal(acc.argmax_counts, ref[1])
    assert torch.equal(acc.argmin_counts, ref[2]) and acc.count == 318
