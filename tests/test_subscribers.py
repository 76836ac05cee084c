"""Analyses subscribe consumers to the shared sentence pass; consumers with equal keys are one (fed once), the
outliers analysis' counts and activations among them."""

from __future__ import annotations

import types

import torch

from llama_fixtures import save_tiny_llama
from llama_fixtures import texts as _texts
from outlierlab.evaluation.registry import AnalysisResult, SharedPasses
from outlierlab.evaluation.sentence_pass import OutlierCounts
from outlierlab.evaluation.sentence_stream import Consumer


class Tokens(Consumer):
    """Counts the raw tokens of each layer and how often it was fed."""

    def __init__(self, num_layers, key=None):
        self.key, self.n, self.calls = key, [0] * num_layers, 0

    def update(self, layer, vectors, batch):
        self.n[layer] += vectors.shape[1]
        self.calls += 1


def test_subscribe_shares_equal_keys_and_keeps_unkeyed_consumers_apart():
    shared = SharedPasses()
    a, b, c, d = Tokens(2, "tokens"), Tokens(2, "tokens"), Tokens(2), Tokens(2)
    assert [shared.subscribe(x) for x in (a, b, c, d)] == [a, a, c, d]
    assert shared.consumers == [a, c, d] and shared.consumers[1] is not shared.consumers[2]
    assert Tokens(1).result() is not None and OutlierCounts("clip", 3).key == ("outlier_counts", "clip")


def _toy(name, key, seen):
    def consumers(ctx):
        return [Tokens(ctx.encoder.num_layers + 1, key), OutlierCounts("none", ctx.encoder.num_layers + 1)]

    def run(ctx):
        seen[name] = list(ctx.consumers)
        tok, counts = ctx.consumers[0], ctx.consumers[1].result()
        return AnalysisResult(name, [{"layer": i, "tokens": tok.n[i], "counted": int(counts.count)}
                                     for i in range(len(tok.n))], f"## {name}\n")

    return types.SimpleNamespace(NAME=name, consumers=consumers, run=run)


def test_two_analyses_and_the_outliers_analysis_share_what_they_need(tmp_path):
    """Two notebook analyses that ask for the same keyed consumer get one object, fed once per (layer, batch); the
    raw outlier counts they ask for are the outliers analysis' own (and clip's): the same numbers in every table."""
    import outlierlab as ol
    from outlierlab.models.loading import FrozenEncoder

    enc = FrozenEncoder(str(save_tiny_llama(tmp_path / "llama")), device="cpu")
    seen: dict = {}
    tables = ol.evaluate(enc, _texts(30), analyses=["outliers", _toy("one", "tokens", seen),
                                                    _toy("two", "tokens", seen)],
                         transforms=["none", "clip"], progress=False)
    assert seen["one"][0] is seen["two"][0] and seen["one"][1] is seen["two"][1]
    fed_once = seen["one"][0].calls
    one, two, out = tables["one"], tables["two"], tables["outliers"]
    raw = out[out["transform"] == "none"]
    assert one["tokens"].tolist() == two["tokens"].tolist() == raw["n_tokens"].tolist() == one["counted"].tolist()
    assert (one["tokens"] > 0).all() and fed_once == seen["two"][0].calls
    # the same run with one toy: its consumer is fed as often as the shared one above (not twice as often)
    alone: dict = {}
    ol.evaluate(enc, _texts(30), analyses=[_toy("one", "tokens", alone)], transforms=["none"], progress=False)
    assert alone["one"][0].calls == fed_once and alone["one"][0].n == seen["one"][0].n
    assert torch.is_tensor(seen["one"][1].result().sum)
