"""Clip (Luo et al. 2021 §4) and whitening (Su et al. 2021)."""

import numpy as np
import pytest
import torch

from outlierlab.metrics.outlier_dims import detect_outlier_dims
from outlierlab.metrics.outlier_stats import OutlierAccumulator
from outlierlab.metrics.similarity import anisotropy, paired_sentence_tokens
from outlierlab.metrics.transforms import Whitener, clip


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


# ------------------------------------------------------------------------- whitening guard
from outlierlab.metrics.transforms import DegenerateWhiteningError, clip_dims_per_layer  # noqa: E402


def _reference_whiten(x: torch.Tensor, k=None) -> torch.Tensor:
    """Su et al. 2021's reference recipe in numpy: np.cov, SVD, W = U / sqrt(S), (x - mu) W[:, :k]."""
    a = x.double().numpy()
    mu = a.mean(0, keepdims=True)
    u, s, _ = np.linalg.svd(np.cov(a.T))
    w = (u / np.sqrt(s))[:, :k]
    return torch.from_numpy((a - mu) @ w)


def _same_up_to_column_sign(a: torch.Tensor, b: torch.Tensor, atol: float) -> bool:
    signs = torch.sign((a * b).sum(0))
    return bool(((a * signs) - b).abs().max() < atol)


def test_few_distinct_points_whiten_to_a_simplex_and_are_refused_in_one_line():
    g = torch.Generator().manual_seed(1)
    n, d = 10, 32
    pts = torch.randn(n, d, generator=g, dtype=torch.float64) * torch.linspace(0.5, 3, d, dtype=torch.float64) + 5.0
    x = pts.repeat(4, 1)  # 40 vectors, 10 distinct (a sentence encoded once per occurrence)
    w = Whitener(1, d).fit(x)
    assert w.n == 40 and int(w.n_distinct[0]) == n and int(w.rank[0]) == n - 1
    z = w.transform(pts)
    cos = torch.nn.functional.normalize(z, dim=1) @ torch.nn.functional.normalize(z, dim=1).T
    off = cos[~torch.eye(n, dtype=torch.bool)]
    # regular simplex: every pair at the same cosine -1/(N-1), whatever the original geometry was
    assert (off + 1 / (n - 1)).abs().max() < 1e-6
    assert (torch.nn.functional.normalize(pts - pts.mean(0), dim=1) @ torch.nn.functional.normalize(
        pts - pts.mean(0), dim=1).T)[~torch.eye(n, dtype=torch.bool)].std() > 0.05  # it was not one before
    with pytest.raises(DegenerateWhiteningError) as e:
        w.check("the 40 STS sentence vectors")
    msg = str(e.value)
    assert "\n" not in msg
    for part in ("the 40 STS sentence vectors", "40 vectors, 10 distinct", "rank 9 of 32", "k=32", "simplex",
                 "transform.fit_on=sentences", "transform.k=5", "transform.allow_degenerate=true"):
        assert part in msg, part
    fit = w.check("the 40 STS sentence vectors", allow_degenerate=True)
    assert fit.degenerate and fit.columns()["whiten_degenerate"] is True and fit.columns()["whiten_distinct"] == 10
    assert "DEGENERATE" in fit.describe()
    # k below N/2 is accepted: the top-k principal directions are estimated from the 10 points
    assert not Whitener(1, d, k=5).fit(x).check("x").degenerate
    with pytest.raises(DegenerateWhiteningError):
        Whitener(1, d, k=6).fit(x).check("x")  # 10 distinct < 2 x 6


def test_well_posed_fits_are_unchanged_from_the_reference_recipe():
    g = torch.Generator().manual_seed(2)
    d = 16
    big = torch.randn(3000, d, generator=g, dtype=torch.float64) @ torch.randn(d, d, generator=g,
                                                                              dtype=torch.float64) + 40.0
    w = Whitener(1, d).fit(big)  # N >> d, large mean (outlier-like): the shifted sums keep full precision
    fit = w.check("big")
    assert not fit.degenerate and fit.rank == d and fit.n_distinct == 3000 and not fit.distinct_capped
    # distinct vectors are counted exactly until 16 d = 256 are seen; rows streamed after that are not hashed
    chunked = Whitener(1, d)
    for part in big.split(300):
        chunked.partial_fit(part)
    cfit = chunked.finalize().check("chunked")
    assert cfit.distinct_capped and cfit.n_distinct == 300 and cfit.columns()["whiten_distinct"] == ">=300"
    assert _same_up_to_column_sign(w.transform(big), _reference_whiten(big), 1e-6)
    small = big[:40]  # 40 distinct in 16 dims with k = 8 < rank: accepted, equal to the reference's first 8
    wk = Whitener(1, d, k=8).fit(small)
    assert not wk.check("small").degenerate
    assert _same_up_to_column_sign(wk.transform(small), _reference_whiten(small, 8), 1e-6)


def test_layernorm_outputs_have_rank_d_minus_1_and_are_not_refused():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2000, 24, generator=g, dtype=torch.float64)
    x = torch.nn.functional.layer_norm(x, (24,)) * 1.5 + 0.2  # rows of the normalised part sum to zero
    w = Whitener(1, 24).fit(x)
    fit = w.check("post-LN vectors")
    assert fit.rank == 23 and not fit.degenerate


def test_clip_dims_by_layer_range():
    per, source = clip_dims_per_layer(5, 10, dims_by_layer={"1-3": [7, 2], "3": [9], "4": []})
    assert per == [[], [2, 7], [2, 7], [2, 7, 9], []] and "dims_by_layer" in source
    assert clip_dims_per_layer(3, 10, dims=[4])[0] == [[4], [4], [4]]
    x = torch.ones(5, 2, 10)
    out = clip(x, per)
    assert (out[0] == 1).all() and (out[1][:, [2, 7]] == 0).all() and (out[3][:, 9] == 0).all() \
        and (out[1][:, 9] == 1).all()
    for kwargs, match in (({"dims": [1], "dims_by_layer": {"1": [2]}}, "not both"),
                          ({"dims_by_layer": {"one-two": [2]}}, "not a layer or an inclusive range"),
                          ({"dims_by_layer": {"1-5": [2]}}, "outside layers 0-4"),
                          ({"dims_by_layer": {"1": [10]}}, "out of range for hidden size 10"),
                          ({}, "clip needs")):
        with pytest.raises(ValueError, match=match):
            clip_dims_per_layer(5, 10, **kwargs)


# ------------------------------------------------------------------- a fit's memory, same numbers
def _fitted_pair(method_names=("whiten",)):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 200, 12, generator=g, dtype=torch.float64) @ torch.randn(12, 12, generator=g,
                                                                                 dtype=torch.float64)
    x[:, :, 4] += 30.0  # an outlier dim with a large mean
    ref = Whitener(3, 12).partial_fit(x[:, :120]).partial_fit(x[:, 120:]).finalize()
    lean = Whitener(3, 12).partial_fit(x[:, :120]).partial_fit(x[:, 120:])
    sums = lean.sum_outer
    lean.finalize(release_sums=True, keep_eigvecs=False)
    # Σ and W live in the float64 sums' memory: the fit allocated no second [L, d, d] array
    for t in (lean.cov, lean.W):
        assert t.untyped_storage().data_ptr() == sums.untyped_storage().data_ptr()
    return x, ref, lean


def test_finalize_over_the_sums_without_eigenvectors_gives_the_same_fit():
    x, ref, lean = _fitted_pair()
    assert lean.sum_outer is None and lean._eig[1] is None and lean.compact  # no eigenvectors kept
    for attr in ("mean", "singular_values"):  # float64, computed from the same float64 sums
        assert torch.allclose(getattr(lean, attr), getattr(ref, attr), rtol=1e-12, atol=1e-12), attr
    for attr in ("cov", "W"):  # stored in float32: the same numbers rounded
        got, want = getattr(lean, attr), getattr(ref, attr)
        assert got.dtype == torch.float32 and torch.allclose(got.double(), want, rtol=1e-6, atol=1e-6), attr
    assert torch.equal(lean.rank, ref.rank)
    z = lean.transform(x.float())
    assert torch.allclose(torch.stack([torch.cov(z[i].double().T) for i in range(3)]),
                          torch.eye(12, dtype=torch.float64).expand(3, 12, 12), atol=1e-4)  # Su et al.: I
    with pytest.raises(ValueError, match="released by finalize"):
        lean.partial_fit(x[:, :5])


def test_derived_maps_recompute_the_eigenvectors_they_need():
    _, ref, lean = _fitted_pair()
    for method in ("abtt", "standardize", "center"):
        a, b = ref.derive(method, abtt_d=2 if method == "abtt" else None), \
            lean.derive(method, abtt_d=2 if method == "abtt" else None)
        assert torch.allclose(a.W, b.W.double(), atol=1e-6), method  # b: from the float32 Σ


def test_selecting_consecutive_layers_shares_the_fitted_map():
    _, ref, _ = _fitted_pair()
    one = ref.select([1])
    assert one.W.data_ptr() == ref.W[1].data_ptr()  # a view: no per-layer copy of W in the replay
    assert torch.equal(one.W[0], ref.W[1]) and torch.equal(one.mean[0], ref.mean[1])
    two = ref.select([2, 0])  # not a run: an indexed copy, same values
    assert torch.equal(two.W, ref.W[[2, 0]]) and two.num_layers == 2


def test_fit_by_layer_equals_the_all_layer_stream():
    x, ref, lean = _fitted_pair()
    chunks = [(0, 70), (70, 120), (120, 200)]
    by_layer = Whitener.fit_by_layer(3, 12, lambda layer: (x[layer, a:b] for a, b in chunks))
    stream = Whitener(3, 12)
    for a, b in chunks:
        stream.partial_fit(x[:, a:b])
    stream.finalize(release_sums=True, keep_eigvecs=False)
    # the same float64 sums in the same order: bitwise the same fit
    for attr in ("mean", "singular_values", "cov", "W", "sum", "shift", "rank", "n_distinct"):
        assert torch.equal(getattr(by_layer, attr), getattr(stream, attr)), attr
    assert by_layer.n == 200 and by_layer.compact and by_layer.sum_outer is None
    assert by_layer.W.is_contiguous()  # a strided W would be copied by every batched product
    w_only = Whitener.fit_by_layer(3, 12, lambda layer: (x[layer, a:b] for a, b in chunks), keep_cov=False)
    assert w_only.cov is None and torch.equal(w_only.W, stream.W)  # Σ not kept when nothing reads it
    assert torch.allclose(by_layer.W.double(), ref.W, rtol=1e-6, atol=1e-6)
    assert torch.allclose(by_layer.derive("abtt", abtt_d=2).W, ref.derive("abtt", abtt_d=2).W.float(), atol=1e-5)
    fit = by_layer.check("test vectors")
    assert not fit.degenerate and fit.n == 200
    with pytest.raises(ValueError, match="layer 1 got 70 vectors"):
        Whitener.fit_by_layer(2, 12, lambda layer: [x[layer, :120]] if layer == 0 else [x[layer, :70]])


def test_fit_by_layer_on_disk_gives_the_in_memory_fit_one_layer_at_a_time(tmp_path):
    """Σ and the maps in files (DiskLayers), read back one layer at a time: the same numbers as the
    in-memory fit for the fit, every derived map, a selected layer and the transform; the files go with them."""
    import gc

    from outlierlab.utils.disk_layers import DiskLayers

    x, _, _ = _fitted_pair()
    chunks = [(0, 70), (70, 120), (120, 200)]
    mem = Whitener.fit_by_layer(3, 12, lambda layer: (x[layer, a:b] for a, b in chunks))
    disk = Whitener.fit_by_layer(3, 12, lambda layer: (x[layer, a:b] for a, b in chunks), on_disk=tmp_path)
    assert isinstance(disk.W, DiskLayers) and isinstance(disk.cov, DiskLayers)
    assert disk.W.directory == tmp_path and not list(tmp_path.iterdir())  # unnamed files: nothing left by a kill
    assert torch.equal(disk.W[:], mem.W) and torch.equal(disk.cov[:], mem.cov)  # bitwise: the same fit
    assert torch.equal(disk.W[1], mem.W[1]) and torch.equal(disk.cov[[2, 0]], mem.cov[[2, 0]])
    z = x[:, :9].float()
    assert torch.allclose(disk.transform(z), mem.transform(z), rtol=1e-6, atol=1e-6)
    one = disk.select([1])  # the replay's one layer: an in-memory map of that layer only
    assert isinstance(one.W, torch.Tensor) and torch.equal(one.W[0], mem.W[1])
    derived = []
    for method in ("abtt", "standardize", "center"):
        d_map, m_map = (w.derive(method, abtt_d=2 if method == "abtt" else None) for w in (disk, mem))
        assert isinstance(d_map.W, DiskLayers) and d_map.W.directory == tmp_path, method  # Σ on disk: W too
        assert torch.equal(d_map.W[:], m_map.W), method
        derived.append(d_map.W._file)  # the file object only: the map itself may go
    own = [disk.W._file, disk.cov._file]
    assert not any(f.closed for f in own)  # the fit is still referenced
    del d_map, disk, one
    gc.collect()
    assert all(f.closed for f in derived + own)  # each file went with its map


def test_disk_layers_reads_and_writes_one_layer_at_a_time(tmp_path):
    from outlierlab.utils.disk_layers import DiskLayers

    ref = torch.arange(4 * 3 * 2, dtype=torch.float64).view(4, 3, 2)
    import os

    stack = DiskLayers(4, 3, 2, dtype=torch.float64, directory=tmp_path)
    assert os.fstat(stack._fd).st_size == 4 * 3 * 2 * 8 and stack.shape == (4, 3, 2) and len(stack) == 4
    assert not list(tmp_path.iterdir())  # no name in the directory
    for i in range(4):
        stack[i] = ref[i]
    assert torch.equal(stack[2], ref[2]) and torch.equal(stack[-1], ref[3])
    assert torch.equal(stack[1:3], ref[1:3]) and torch.equal(stack[[3, 0]], ref[[3, 0]])
    assert torch.equal(stack.to(torch.float32), ref.float())
    got = stack[0]
    got += 1  # a read is a fresh tensor: the file does not change
    assert torch.equal(stack[0], ref[0])
    with pytest.raises(IndexError, match="layer 4 out of range for 4 layers"):
        stack[4]
    with pytest.raises(ValueError, match=r"layer block must be \(3, 2\)"):
        stack[0] = torch.zeros(2, 3)
    with pytest.raises(TypeError, match="one layer at a time"):
        stack[0:2] = ref[:2]
    with pytest.raises(ValueError, match="float32 or float64"):
        DiskLayers(1, 2, 2, dtype=torch.bfloat16, directory=tmp_path)
    stack.close()
    assert stack.closed
