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


def test_anisotropy_isotropy_and_self_similarity_read_one_reservoir_fed_once(tmp_path, monkeypatch):
    """The three sentence analyses that read the anisotropy reservoir subscribe it under one key: it is fed once per
    (layer, batch) whichever of them run, and self-similarity subtracts the very anisotropy the anisotropy table
    reports (the same pairs)."""
    import outlierlab as ol
    from outlierlab.evaluation import sentence_pass
    from outlierlab.models.loading import FrozenEncoder

    calls = []
    update = sentence_pass.AnisotropyReservoir.update
    monkeypatch.setattr(sentence_pass.AnisotropyReservoir, "update",
                        lambda self, *a: (calls.append(id(self)), update(self, *a))[1])
    enc = FrozenEncoder(str(save_tiny_llama(tmp_path / "llama")), device="cpu")
    kw = dict(transforms=["none", "whiten"], overrides=["transform.allow_degenerate=true",
                                                        "self_similarity.min_sentences=3"], progress=False)
    tables = ol.evaluate(enc, _texts(40), analyses=["anisotropy", "isotropy", "self_similarity"], **kw)
    assert len(set(calls)) == 1
    together, calls[:] = len(calls), []
    ol.evaluate(enc, _texts(40), analyses=["anisotropy"], **kw)
    assert together == len(calls) > 0  # not three times as often
    aniso, sims = tables["anisotropy"], tables["self_similarity"]
    merged = aniso.merge(sims, on=["layer", "transform"], suffixes=("", "_subtracted"))
    assert len(merged) == len(aniso) == 2 * (enc.num_layers + 1)
    # the same pairs: equal to float32 rounding (rogue_summary sums the cosines in float64, the adjustment in float32)
    assert (merged["anisotropy"] - merged["anisotropy_subtracted"]).abs().max() < 1e-6
    assert (merged["self_similarity_raw"] - merged["anisotropy_subtracted"] - merged["self_similarity"]).abs().max() < 1e-12


def test_a_subscriber_no_later_analysis_reads_is_released_after_its_analysis():
    """What an analysis subscribed (the reservoir: [L+1, 2000, d]) is dropped once no later analysis reads it, and
    kept while one does."""
    from outlierlab.evaluation.core import _release_consumers

    shared = SharedPasses()
    r, mine, theirs = Tokens(2, "reservoir"), Tokens(2), Tokens(2)
    ctx = {n: types.SimpleNamespace(shared=shared, consumers=[shared.subscribe(c) for c in cs])
           for n, cs in (("a", [r, mine]), ("b", [Tokens(2, "reservoir"), theirs]), ("c", []))}
    _release_consumers(ctx, ["a", "b", "c"])
    assert shared.consumers == [r, theirs] and ctx["a"].consumers == [] and ctx["b"].consumers == [r, theirs]
    _release_consumers(ctx, ["b", "c"])
    assert shared.consumers == [] and ctx["b"].consumers == []
