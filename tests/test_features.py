"""Feature extraction + cache (outlierlab.datamodules.features): values, layout, reuse, and the clip/whiten fits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from outlierlab.metrics.outlier_stats import OutlierAccumulator
from outlierlab.metrics.transform_fit import fit_transform
from outlierlab.datamodules.features import FeatureSet, RowBatches, chunk_outlier_stats, extract_features, iter_chunks
from outlierlab.models.loading import FrozenEncoder
from probe_fixtures import SENTENCES, save_tiny_bert


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return str(save_tiny_bert(tmp_path_factory.mktemp("bert"), layers=2, hidden=32))


def test_cached_layout_matches_the_encoder(tiny_bert, tmp_path):
    enc = FrozenEncoder(tiny_bert, device="cpu")
    fs = extract_features(enc, SENTENCES, tmp_path, progress=False)
    lengths = [len(x) for x in enc.tokenizer(SENTENCES)["input_ids"]]
    assert fs.tokens.shape == (3, sum(lengths), 32) and fs.tokens.dtype == np.float16
    assert fs.sentences.shape == (3, len(SENTENCES), 32)
    for i, text in enumerate(SENTENCES):
        rows = np.flatnonzero(fs.sentence_id == i)
        assert fs.position[rows].tolist() == list(range(lengths[i]))  # 0 = [CLS]
        b = next(enc.encode([text]))
        h = b.hidden[:, 0, :lengths[i]]
        assert np.allclose(fs.tokens[:, rows], h.numpy(), atol=2e-3, rtol=2e-3)
        assert fs.token_id[rows].tolist() == b.input_ids[0].tolist()
        assert fs.special[rows].tolist() == [True] + [False] * (lengths[i] - 2) + [True]
        # sentence vector: mean over the non-special tokens only
        assert np.allclose(fs.sentences[:, i], h[:, 1:-1].mean(1).numpy(), atol=2e-3, rtol=2e-3)
    # stored outlier statistics = accumulator over all non-special token rows
    stats = fs.outlier_stats()
    acc = OutlierAccumulator(3, 32)
    acc.update(torch.from_numpy(fs.tokens[:, ~fs.special].astype(np.float32)))
    assert torch.allclose(stats["argmax_share"], acc.argmax_share())
    assert torch.allclose(stats["mean"], acc.mean(), atol=1e-3)


def test_second_run_reuses_the_cache_without_calling_the_encoder(tiny_bert, tmp_path):
    first = FrozenEncoder(tiny_bert, device="cpu")
    a = extract_features(first, SENTENCES, tmp_path, batch_size=3, progress=False)
    assert first.n_forward_calls == 3  # 8 texts in batches of 3
    second = FrozenEncoder(tiny_bert, device="cpu")
    b = extract_features(second, SENTENCES, tmp_path, batch_size=3, progress=False)
    assert second.n_forward_calls == 0 and second._model is None  # weights never even loaded
    assert b.directory == a.directory and np.array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
    # different data or different max_length -> a new entry
    third = FrozenEncoder(tiny_bert, device="cpu", max_length=8)
    c = extract_features(third, SENTENCES, tmp_path, progress=False)
    assert third.n_forward_calls > 0 and c.directory != a.directory
    fourth = FrozenEncoder(tiny_bert, device="cpu")
    extract_features(fourth, SENTENCES[:-1], tmp_path, progress=False)
    assert fourth.n_forward_calls > 0
    assert FeatureSet.load(a.directory).meta["n_texts"] == len(SENTENCES)


def test_without_a_cache_root_the_same_features_are_held_in_memory(tiny_bert, tmp_path, monkeypatch):
    """cache_root=None: every array and statistic equals the cached entry's, and no file is written (the
    working and temporary directories are listed before and after)."""
    enc = FrozenEncoder(tiny_bert, device="cpu")
    cached = extract_features(enc, SENTENCES, tmp_path / "cache", progress=False)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("TMPDIR", str(work))
    monkeypatch.setattr("tempfile.tempdir", None)  # re-read TMPDIR
    calls = enc.n_forward_calls
    mem = extract_features(enc, SENTENCES, None, store_tokens=True, progress=False)
    assert list(work.iterdir()) == [] and enc.n_forward_calls > calls and mem.directory is None
    for name in ("sentences", "lengths", "tokens", "sentence_id", "position", "token_id", "special"):
        assert np.array_equal(getattr(mem, name), getattr(cached, name)), name
    assert mem.meta == cached.meta
    for key, value in cached.outlier_stats().items():
        assert torch.equal(mem.outlier_stats()[key], value), key
    assert mem.token_rows(np.array([1])).tolist() == cached.token_rows(np.array([1])).tolist()


def _planted(n=400, d=6, seed=0):
    g = np.random.default_rng(seed)
    x = g.normal(size=(2, n, d))
    x[:, :, 2] += 20.0  # dim 2 is the argmax of every token: an outlier (Luo §2)
    x[1, :, 4] -= 30.0  # layer 1: dim 4 is also the argmin of every token
    return x.astype(np.float16)


def test_clip_zeroes_given_or_detected_dims():
    x = _planted()
    rows = np.arange(x.shape[1])
    vt = fit_transform("clip", 2, 6, None, dims=[1, 3])
    out, _ = RowBatches(x, rows, np.zeros(len(rows)), vt)[list(rows[:50])]
    raw = torch.from_numpy(x[:, :50].astype(np.float32))
    assert (out[..., [1, 3]] == 0).all() and torch.equal(out[..., [0, 2, 4, 5]], raw[..., [0, 2, 4, 5]])
    # dims=None: per-layer dims detected on the (training) chunks
    from outlierlab.datamodules.features import detect_train_outliers

    detected = detect_train_outliers(chunk_outlier_stats(iter_chunks(x, rows, 128), None, 2, 6))
    assert detected == [[2], [2, 4]]
    vt = fit_transform("clip", 2, 6, None, outlier_dims=detected)
    out, _ = RowBatches(x, rows, np.zeros(len(rows)), vt)[list(rows)]
    assert (out[0, :, 2] == 0).all() and (out[0, :, 4] != 0).all() and (out[1, :, [2, 4]] == 0).all()
    # probing one layer alone uses that layer's dims
    out1, _ = RowBatches(x, rows, np.zeros(len(rows)), vt, layers=[1])[[0, 1]]
    assert out1.shape == (1, 2, 6) and (out1[0, :, [2, 4]] == 0).all()


def test_whiten_is_fitted_on_train_only_and_applied_to_all_splits():
    x = _planted(n=600)
    train, test = np.arange(400), np.arange(400, 600)
    x[:, 400:] += np.float16(5.0)  # test split shifted: must NOT be re-centred
    vt = fit_transform("whiten", 2, 6, lambda: iter_chunks(x, train, 100))
    assert vt.whitener.n == 400
    tr, _ = RowBatches(x, train, np.zeros(400), vt)[list(range(400))]
    te, _ = RowBatches(x, test, np.zeros(200), vt)[list(range(200))]
    for layer in range(2):
        cov = torch.cov(tr[layer].double().T)
        assert torch.allclose(cov, torch.eye(6, dtype=torch.float64), atol=1e-2)
        assert tr[layer].mean(0).abs().max() < 1e-3
        assert te[layer].mean(0).abs().max() > 1.0
    k2 = fit_transform("whiten", 2, 6, lambda: iter_chunks(x, train, 100), k=2)
    assert k2.out_dim == 2 and RowBatches(x, train, np.zeros(400), k2)[[0]][0].shape == (2, 1, 2)
