"""The per-layer stream that the evaluation analyses subscribe to — each consumer sees every layer of
every batch exactly once per loop, and the shared sentence pass built on it equals the plain two-pass oracle
(:mod:`sentence_pass_oracle`) for every statistic × transform."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch

from llama_fixtures import PASS, RESERVOIR, save_tiny_llama, similarity_pass
from llama_fixtures import texts as _texts
from sentence_pass_oracle import oracle_pass
from outlierlab.evaluation.sentence_stream import Consumer, LayerStream
from outlierlab.evaluation.sentence_pass import OutlierCounts, run_sentence_pass
from outlierlab.metrics.transform_fit import FittedTransforms
from outlierlab.configuration.run_settings import TransformSettings
from outlierlab.models.loading import FrozenEncoder

ALL = ["none", "clip", "whiten", "standardize", "abtt", "center"]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    return FrozenEncoder(str(save_tiny_llama(tmp_path_factory.mktemp("llama"))), device="cpu")


class Recorder(Consumer):
    """Counts (layer, batch) visits and the token rows it was handed."""

    def __init__(self, words: bool = False) -> None:
        self.words, self.seen, self.rows, self.ended = words, Counter(), 0, []

    def update(self, layer, vectors, batch) -> None:
        self.seen[(layer, batch.index)] += 1
        if not self.words:
            assert vectors.shape[1] == batch.n_tokens
            self.rows += vectors.shape[1] if layer == 0 else 0

    def end_layer(self, layer) -> None:
        self.ended.append(layer)


@pytest.mark.parametrize("keep_tokens", [True, False])
def test_every_consumer_sees_every_layer_of_every_batch_exactly_once_per_loop(encoder, keep_tokens):
    texts = _texts(20)
    stream = LayerStream(encoder, texts, batch_size=6, chunk=24, keep_tokens=keep_tokens,
                         word_index={"the": 0, "and": 1})
    first, words = Recorder(), Recorder(words=True)
    stream.forward([first, words], FittedTransforms())
    n_layers, n_batches = encoder.num_layers + 1, len(stream.batches)
    assert n_batches == 4  # 20 texts, 6 per batch
    assert set(first.seen) == {(i, b) for i in range(n_layers) for b in range(n_batches)}
    assert set(first.seen.values()) == {1} and first.ended == list(range(n_layers))
    assert first.rows == sum(b.n_tokens for b in stream.batches) > 0
    assert set(words.seen.values()) == {1}  # word vectors: once per (layer, batch with words)
    second = Recorder()
    stream.replay([second], FittedTransforms())
    assert set(second.seen) == set(first.seen) and set(second.seen.values()) == {1}
    assert second.ended == list(range(n_layers)) and second.rows == first.rows
    assert len(stream.logs) == (1 if keep_tokens else 2)  # a replay without a store is a second forward
    assert stream.store is None  # removed after the replay


@pytest.mark.parametrize("one_pass", [True, False])
def test_the_sentence_pass_equals_the_two_pass_oracle_for_every_statistic_and_transform(encoder, one_pass):
    kw = {**PASS, "transform": TransformSettings(allow_degenerate=True)}
    counts = {t: OutlierCounts(t, encoder.num_layers + 1) for t in ALL}  # the outliers analysis' subscribers
    st, pairs, sims = similarity_pass(encoder, _texts(40), ALL, consumers=list(counts.values()),
                                      **{**kw, "data": replace(PASS["data"], one_pass=one_pass)})
    ref = oracle_pass(encoder, _texts(40), ALL, anisotropy=RESERVOIR, **kw)
    assert st.transforms.clip_dims == ref["transforms"].clip_dims and any(st.transforms.clip_dims)
    assert st.words == ref["words"] and len(st.words) >= 2
    assert torch.equal(pairs.result().vectors, ref["anisotropy"].vectors)
    for t in ALL:
        a, b = counts[t].result(), ref["outliers"][t]
        assert a.count == b.count > 0, t
        assert torch.equal(a.argmax_counts, b.argmax_counts) and torch.equal(a.argmin_counts, b.argmin_counts), t
        assert torch.allclose(a.mean(), b.mean(), rtol=1e-6, atol=1e-7), t
        k1, v1 = sims[t].result().compute(3)
        k2, v2 = ref["self_sim"][t].compute(3)
        assert torch.equal(k1, k2) and k1.numel() and torch.allclose(v1, v2, rtol=1e-5, atol=1e-7), t
        assert sims[t].intra_n == ref["intra_n"][t] > 0, t
        # the stream pools word vectors from the transformed tokens, the oracle transforms the pooled vectors: equal
        # maps (each transform is affine), float32 rounding apart -- 1.2e-6 relative under this 40-sentence
        # degenerate whitening, which amplifies it (3e-9 on MiniLM's 2,000 sentences, docs/evaluation_scale.md)
        assert torch.allclose(sims[t].intra_sentence(), ref["intra_sum"][t] / ref["intra_n"][t], rtol=1e-5), t
        assert torch.allclose(pairs.anisotropy(st.transforms, t), torch.cat([
            _aniso(ref, t, layer) for layer in range(st.num_layers)]).double(), rtol=1e-5, atol=1e-6), t


def _aniso(ref, t, layer):
    from outlierlab.metrics.similarity import anisotropy

    a, b = ref["anisotropy"].pair_vectors(layer)
    tf = ref["transforms"].get(t, a.shape[-1]).select([layer])
    return anisotropy(tf(a.float()), tf(b.float()))


TOY = '''
"""A toy analysis written by a user: the mean squared norm of the token vectors per layer and transform."""
import outlierlab as ol

COLUMNS = ["layer", "transform", "mean_sq_norm", "tokens"]


class SquaredNorm(ol.Consumer):
    def __init__(self, transform, num_layers):
        self.transform, self.sum, self.n = transform, [0.0] * num_layers, [0] * num_layers
        self.key = ("squared_norm", transform)

    def update(self, layer, vectors, batch):
        self.sum[layer] += float(vectors[0].double().pow(2).sum())
        self.n[layer] += vectors.shape[1]


def consumers(ctx):
    return [SquaredNorm(t, ctx.encoder.num_layers + 1) for t in ctx.transforms]


def run(ctx):
    rows = [{"layer": i, "transform": c.transform, "mean_sq_norm": c.sum[i] / c.n[i], "tokens": c.n[i]}
            for c in ctx.consumers for i in range(len(c.sum))]
    return ol.AnalysisResult("toypkg.norms", rows, "## Toy norms\\n")
'''


def test_an_analysis_written_in_one_module_subscribes_to_the_stream_and_is_in_the_output(tmp_path, compose_cfg,
                                                                                        monkeypatch):
    """A module of one's own, selected by its path, gets every layer once with the run's transforms: its raw mean
    squared norm equals the hidden states' own, whitened vectors have mean squared norm d·(n-1)/n (Σ = I on the
    data they were fitted on), and its rows are ``toypkg.norms.csv`` -- and ol.evaluate's table of that name."""
    import csv

    from outlierlab.evaluation.run_writer import evaluate

    (tmp_path / "toypkg").mkdir()
    (tmp_path / "toypkg" / "__init__.py").write_text("")
    (tmp_path / "toypkg" / "norms.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    d = save_tiny_llama(tmp_path / "llama")
    texts = _texts(40)
    (tmp_path / "s.txt").write_text("\n".join(texts) + "\n")
    cfg = compose_cfg("evaluate", [f"encoder.name_or_path={d}", "encoder.device=cpu",
                                   f"data.files=[{tmp_path / 's.txt'}]", "transform=[none,whiten]",
                                   "transform.allow_degenerate=true", "analyses=[outliers,toypkg.norms]",
                                   "tensorboard=false", "progress=false", "plots=false"])
    res = evaluate(cfg, tmp_path / "run")
    rows = list(csv.DictReader(open(tmp_path / "run" / "toypkg.norms.csv")))
    enc = FrozenEncoder(str(d), device="cpu")
    n_layers = enc.num_layers + 1
    assert len(rows) == 2 * n_layers
    sq, n = torch.zeros(n_layers, dtype=torch.float64), 0
    for b in enc.batches(enc.tokenize(texts)):
        from outlierlab.metrics.outlier_stats import valid_token_mask

        v = valid_token_mask(b.attention_mask, b.special_tokens_mask)
        sq += b.hidden[:, v].double().pow(2).sum((1, 2))
        n += int(v.sum())
    for r in rows:
        layer = int(r["layer"])
        assert int(r["tokens"]) == n
        # whitened: Σ = I with Σ's unbiased 1/(n-1), so the mean over the n tokens is d·(n-1)/n
        want = sq[layer] / n if r["transform"] == "none" else enc.hidden_size * (n - 1) / n
        assert float(r["mean_sq_norm"]) == pytest.approx(float(want), rel=1e-4), r
    assert res["meta"]["sentences"]["passes"] == 1  # the toy rode the one shared pass
    # the same module, by the same name, from the Python API: in memory, the CSV's rows
    import pandas as pd

    import outlierlab as ol

    tables = ol.evaluate(enc, texts, analyses=["outliers", "toypkg.norms"], transforms=["none", "whiten"],
                         overrides=["transform.allow_degenerate=true"], progress=False)
    pd.testing.assert_frame_equal(tables["toypkg.norms"], pd.read_csv(tmp_path / "run" / "toypkg.norms.csv"),
                                  check_exact=True)
