"""evaluate.py in one forward pass, one layer in memory at a time, its fits one layer at a time after the
pass — each against the two-pass / stacked reference."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from llama_fixtures import PASS, save_tiny_llama, similarity_pass
from llama_fixtures import texts as _texts
from probe_fixtures import minilm_path
from outlierlab.configuration.analysis_settings import AnisotropySettings
from outlierlab.configuration.run_settings import TransformSettings
from outlierlab.evaluation.sentence_pass import run_sentence_pass
from outlierlab.models.loading import FrozenEncoder
from outlierlab.utils.disk_layers import DiskLayers


# ------------------------------------------------------------------------------------------------ one pass
def _run_evaluate(cfg, out: Path) -> dict:
    from outlierlab.evaluation.run_writer import evaluate  # what evaluate.py runs

    return evaluate(cfg, out)


def _numbers(rows: list[dict]) -> dict:
    """Every numeric cell of an analysis' rows, keyed by (row identity, column)."""
    out = {}
    for i, r in enumerate(rows):
        key = tuple(str(r.get(k, "")) for k in ("layer", "transform", "dataset", "word", "threshold")) + (i,)
        for c, v in r.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and c != "seconds":
                out[key + (c,)] = float(v)
    return out


def test_one_pass_equals_two_passes_for_every_analysis_and_transform(tmp_path, compose_cfg):
    """The default analyses (+ STS) × all six transforms: one forward over the sentences (fitted transforms
    applied to the stored tokens) against the two-pass reference (re-encoding to apply them)."""
    import csv
    import json

    from probe_fixtures import SENTENCES

    d = save_tiny_llama(tmp_path / "llama")
    texts = [f"{s} and then {t}" for s in SENTENCES for t in SENTENCES[:5]]  # 40 sentences, words repeat
    (tmp_path / "s.txt").write_text("\n".join(texts) + "\n")
    pairs = []
    for i, (a, b) in enumerate(zip(SENTENCES, SENTENCES[1:] + SENTENCES[:1])):
        w = a.split()[0]
        b = b if w in b.split() else f"{w} {b}"
        pairs.append({"word": w, "sentence1": a, "sentence2": b, "start1": a.index(w), "end1": a.index(w) + len(w),
                      "start2": b.index(w), "end2": b.index(w) + len(w), "label": i % 2 == 0})
    (tmp_path / "wic.jsonl").write_text("\n".join(json.dumps(p) for p in pairs) + "\n")
    with open(tmp_path / "sts.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["sentence1", "sentence2", "score"])
        for i, (a, b) in enumerate(zip(SENTENCES, SENTENCES[3:] + SENTENCES[:3])):
            w.writerow([a, b, float(i % 5)])
    common = [f"encoder.name_or_path={d}", "encoder.device=cpu", f"data.files=[{tmp_path / 's.txt'}]",
              f"wic.files=[{tmp_path / 'wic.jsonl'}]", f"sts.files=[{tmp_path / 'sts.csv'}]",
              "transform=[none,clip,whiten,standardize,abtt,center]", "transform.allow_degenerate=true",
              "analyses=[outliers,anisotropy,isotropy,self_similarity,wic,sts]", "self_similarity.min_sentences=3",
              "anisotropy.n_sentences=40", "tensorboard=false", "progress=false", "encoder.batch_size=7",
              "data.chunk=16"]
    one = _run_evaluate(compose_cfg("evaluate", common + ["data.one_pass=true"]), tmp_path / "one")
    two = _run_evaluate(compose_cfg("evaluate", common + ["data.one_pass=false"]), tmp_path / "two")
    assert one["meta"]["sentences"]["passes"] == 1 and two["meta"]["sentences"]["passes"] == 2
    assert one["meta"]["sentences"]["tokens_encoded"] * 2 == two["meta"]["sentences"]["tokens_encoded"]
    checked = set()
    for a, b in zip(one["results"], two["results"]):
        assert a.name == b.name
        na, nb = _numbers(a.rows), _numbers(b.rows)
        assert na.keys() == nb.keys() and na, a.name
        for k in na:
            assert na[k] == pytest.approx(nb[k], rel=1e-5, abs=1e-6, nan_ok=True), (a.name, k)
        checked |= {(a.name, r.get("transform")) for r in a.rows}
    for name in ("outliers", "anisotropy", "isotropy", "self_similarity", "wic", "sts"):
        assert {t for n, t in checked if n == name} >= {"none", "clip", "whiten", "standardize", "abtt", "center"}, name


# ------------------------------------------------------------------------------------------------ one layer at a time
@pytest.mark.parametrize("arch", ["bert", "gpt2", "gpt_neox", "llama", "olmo", "olmo2", "olmo3", "olmoe", "ours"])
def test_layers_one_at_a_time_equal_the_stacked_hidden_states(tmp_path, arch):
    """forward_layers (hooks on the family's blocks, each layer handed over and dropped) gives exactly the
    hidden states of output_hidden_states, the last one after the final norm where HF applies it."""
    import transformers as T

    from probe_fixtures import save_own_run

    torch.manual_seed(0)
    if arch == "ours":
        save_own_run(tmp_path / "run", pos="rope")
        enc = FrozenEncoder(str(tmp_path / "run"), device="cpu")
    else:
        cfg = {"bert": lambda: T.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=3,
                                            num_attention_heads=4, intermediate_size=64),
               "gpt2": lambda: T.GPT2Config(vocab_size=30522, n_embd=32, n_layer=3, n_head=4),
               "gpt_neox": lambda: T.GPTNeoXConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=3,
                                                   num_attention_heads=4, intermediate_size=64),
               "llama": lambda: T.LlamaConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=3,
                                              num_attention_heads=4, num_key_value_heads=2, intermediate_size=64),
               "olmo": lambda: T.OlmoConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=3,
                                            num_attention_heads=4, intermediate_size=64, pad_token_id=0),
               "olmo2": lambda: T.Olmo2Config(vocab_size=30522, hidden_size=32, num_hidden_layers=3,
                                              num_attention_heads=4, intermediate_size=64, pad_token_id=0),
               "olmo3": lambda: T.Olmo3Config(vocab_size=30522, hidden_size=32, num_hidden_layers=3,
                                              num_attention_heads=4, intermediate_size=64, pad_token_id=0,
                                              sliding_window=4),
               # not in the family registry (OLMoE: a mixture-of-experts FFN): the layers come from
               # output_hidden_states (the fallback)
               "olmoe": lambda: T.OlmoeConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=3,
                                              num_attention_heads=4, intermediate_size=64, num_experts=4,
                                              num_experts_per_tok=2, pad_token_id=0)}[arch]()
        from transformers import AutoModel, AutoTokenizer

        AutoModel.from_config(cfg).save_pretrained(tmp_path / arch)
        AutoTokenizer.from_pretrained(minilm_path()).save_pretrained(tmp_path / arch)
        enc = FrozenEncoder(str(tmp_path / arch), device="cpu")
    tok = enc.tokenize(_texts(6))
    (b,) = list(enc.batches(tok, 6))
    got = {}
    enc.forward_layers(b.input_ids, b.attention_mask, lambda i, h: got.__setitem__(i, h.clone()))
    assert sorted(got) == list(range(enc.num_layers + 1))
    stacked = torch.stack([got[i] for i in range(enc.num_layers + 1)]).float()
    assert torch.equal(stacked, b.hidden)


def test_wic_and_sts_vectors_one_layer_at_a_time_equal_the_stacked_path(tmp_path):
    """WiC target vectors (+ the fit_on=eval whitener sums, repeated sentences weighted) and STS mean-pooled
    sentence vectors, taken layer by layer, equal what the stacked [L+1, B, T, d] batches give."""
    from sentence_pass_oracle import mean_pool
    from outlierlab.metrics.transforms import Whitener
    from outlierlab.evaluation.analyses.sts import sentence_vectors
    from outlierlab.metrics.transform_fit import WhitenSettings
    from outlierlab.evaluation.analyses.wic import target_vectors

    enc = FrozenEncoder(str(save_tiny_llama(tmp_path / "llama")), device="cpu", batch_size=3)
    s = _texts(6)
    pairs = []
    for i in range(5):
        a, b = s[i], s[(i + 1) % 5]  # every sentence twice: once as sentence1, once as sentence2
        wa, wb = a.split()[1], b.split()[2]
        pairs.append({"sentence1": a, "sentence2": b, "start1": a.index(wa), "end1": a.index(wa) + len(wa),
                      "start2": b.index(wb), "end2": b.index(wb) + len(wb), "label": True})
    targets, found, w = target_vectors(enc, pairs, WhitenSettings())
    assert found.all()
    # kept on disk, read back one layer at a time
    vecs = torch.stack([targets.layer(i) for i in range(targets.num_layers)])
    assert torch.equal(targets.layer(1), vecs[1]) and vecs.shape == (enc.num_layers + 1, 2, 5, enc.hidden_size)
    ref_w = Whitener(enc.num_layers + 1, enc.hidden_size)
    for p_i, p in enumerate(pairs):
        for side in (1, 2):
            text, start, end = p[f"sentence{side}"], p[f"start{side}"], p[f"end{side}"]
            (b,) = list(enc.encode([text]))
            offs = enc.tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
            toks = [t for t, (a0, a1) in enumerate(offs) if a1 > a0 and a0 < end and a1 > start]
            assert torch.allclose(vecs[:, side - 1, p_i], b.hidden[:, 0, toks].mean(1), atol=1e-5)
            valid = (b.attention_mask.bool() & ~b.special_tokens_mask.bool())[0]
            ref_w.partial_fit(b.hidden[:, 0, valid])
    assert w.n == ref_w.n == sum(len(enc.tokenize([p[k]]).input_ids[0]) - 2 for p in pairs
                                 for k in ("sentence1", "sentence2"))
    # fitted from the stored tokens one layer at a time, Σ kept in float32 on disk (read one layer at a time)
    assert isinstance(w.cov, DiskLayers) and isinstance(w.W, DiskLayers)
    assert torch.allclose(w.cov[:].double(), ref_w.finalize().cov, rtol=1e-5, atol=1e-7)
    vecs, ok = sentence_vectors(enc, s + s[:2])
    out = torch.stack([vecs.layer(i) for i in range(vecs.num_layers)])  # on disk, one layer read at a time
    assert len(vecs.order) == 6 and torch.equal(vecs.layer(2), out[2])  # the repeated texts stored once
    assert ok.all() and torch.equal(out[:, 6], out[:, 0])  # a repeated text: the same vector
    for i, text in enumerate(s):
        (b,) = list(enc.encode([text]))
        valid = b.attention_mask.bool() & ~b.special_tokens_mask.bool()
        assert torch.allclose(out[:, i], mean_pool(b.hidden, valid)[:, 0], atol=1e-5)
    assert vecs.store.directory.is_dir()
    vecs.cleanup()
    assert not vecs.store.directory.exists()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_layer_token_store_gives_back_exactly_what_it_was_given(tmp_path, dtype):
    from outlierlab.datamodules.features import LayerTokenStore

    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(n, 3, 5, generator=g).to(dtype) for n in (4, 1, 7)]  # [N, L, d] per batch
    store = LayerTokenStore(tmp_path / "s", num_layers=3, dim=5)
    for x in batches:
        for layer in range(3):
            store.append(layer, x[:, layer])
    store.close()
    start = 0
    for x in batches:
        for layer in range(3):
            got = store.rows(layer, start, start + x.shape[0])
            assert got.dtype == dtype and torch.equal(got, x[:, layer])
        start += x.shape[0]
    assert store.rows_written == [12, 12, 12]
    assert torch.equal(store.rows(1, 10, 99), torch.cat([b[:, 1] for b in batches])[10:])  # clipped at the end
    assert not list((tmp_path / "s").iterdir())  # unnamed files: a killed run leaves no 84 GB behind
    files = list(store._files)
    store.cleanup()
    assert not (tmp_path / "s").exists() and all(f.closed for f in files)


def test_frequency_columns_from_the_stream_equal_the_stacked_batches(tmp_path):
    from outlierlab.metrics.outlier_stats import OutlierAccumulator, valid_token_mask
    from outlierlab.evaluation.analyses.frequency import DimColumns
    from outlierlab.evaluation.sentence_stream import LayerStream
    from outlierlab.evaluation.sentence_pass import OutlierCounts

    enc = FrozenEncoder(str(save_tiny_llama(tmp_path / "llama")), device="cpu", batch_size=4)
    texts = _texts(10)
    tok = enc.tokenize(texts)
    dims = [5, 0, 17]
    columns, counts = DimColumns(dims), OutlierCounts("none", enc.num_layers + 1)
    LayerStream(enc, texts).forward([columns, counts])
    assert len(columns.chunks) == 3  # 10 texts, 4 a batch
    ref = OutlierAccumulator(enc.num_layers + 1, enc.hidden_size)
    for (ids, vals), b in zip(columns.chunks, enc.batches(tok, sort_by_length=True)):
        valid = valid_token_mask(b.attention_mask, b.special_tokens_mask)
        assert torch.equal(ids, b.input_ids[valid])
        assert torch.equal(vals, b.hidden[:, valid][..., dims])
        ref.update(b.hidden, mask=valid)
    got = counts.result(enc.hidden_size).stats()
    for k, v in ref.stats().items():
        assert torch.allclose(got[k], v, rtol=0, atol=1e-12), k


def test_anisotropy_reservoir_sized_to_the_sentences_draws_the_same_pairs():
    """streaming.py sizes the reservoir min(anisotropy.n_sentences, #sentences): the same tokens and pairs as the
    full 2,000-slot reservoir (the generator is consumed the same way), without its memory."""
    from outlierlab.metrics.similarity import AnisotropyAccumulator

    g = torch.Generator().manual_seed(1)
    big, small = AnisotropyAccumulator(3, 8, 2000, seed=4), AnisotropyAccumulator(3, 8, 37, seed=4)
    for n_sent in (10, 15, 12):  # 37 sentences in all
        sid = torch.randint(0, n_sent, (60,), generator=g).sort().values
        h = torch.randn(3, 60, 8, generator=g)
        big.update(h, sid)
        small.update(h, sid)
    assert big.n_kept == small.n_kept
    for a, b in zip(big.pair_vectors(), small.pair_vectors()):
        assert torch.equal(a, b)
    assert small.vectors.shape[1] == 37 and big.vectors.shape[1] == 2000


def test_bf16_pass_keeps_its_reservoir_in_bf16_and_word_sums_one_layer_at_a_time(tmp_path, monkeypatch):
    """What stays in memory after the pass: the anisotropy reservoir in the model's dtype (the same pairs
    as a float32 one), the self-similarity sums [L, K, d] compacted to [L, K], and every transform's word sums
    (none's too: the replay takes them from the stored tokens) alive for one layer at a time, never [L, K, d]."""
    import outlierlab.evaluation.sentence_pass as streaming
    from outlierlab.metrics.similarity import SelfSimilarityAccumulator

    alive, most = [], [0]

    class Tracked(SelfSimilarityAccumulator):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            alive.append(self)
            most[0] = max(most[0], sum(x.sum_unit is not None for x in alive))

    monkeypatch.setattr(streaming, "SelfSimilarityAccumulator", Tracked)
    enc = FrozenEncoder(str(save_tiny_llama(tmp_path / "llama", dtype=torch.bfloat16)), device="cpu", dtype="auto")
    st, pairs, sims = similarity_pass(enc, _texts(40), ["none", "clip", "whiten"])
    assert pairs.result().vectors.dtype == torch.bfloat16
    assert all(s.result().sum_unit is None and s.result().sum_norm_sq.shape == (st.num_layers, len(st.words))
               for s in sims.values()) and len(st.words) >= 2
    assert all(acc.num_layers == 1 for acc in alive)  # no [L, K, d] set: not even none's, during the forward
    assert len(alive) == 3 * st.num_layers and most[0] == 3  # none's, clip's, whiten's of one layer at a time
    ref, ref_pairs, ref_sims = similarity_pass(enc, _texts(40), ["none", "clip", "whiten"],
                                               data=replace(PASS["data"], one_pass=False))
    for name in ("none", "clip", "whiten"):
        assert torch.allclose(pairs.anisotropy(st.transforms, name), ref_pairs.anisotropy(ref.transforms, name),
                              rtol=1e-5, atol=1e-6)
        k1, v1 = sims[name].result().compute(3)
        k2, v2 = ref_sims[name].result().compute(3)
        assert torch.equal(k1, k2) and torch.allclose(v1, v2, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("case", ["none", "clip_with_given_dims"])
def test_word_statistics_taken_in_the_replay_equal_the_pass_s_bit_for_bit(tmp_path, case):
    """The replay takes the word statistics of the transforms the pass already applied (none; clip with given
    dims), also when no transform is fitted after the pass (IsoScore's Σ alone makes the replay): the same float64
    sums, added in the same order, as filling them during the forward (the pass without a store does)."""
    enc = FrozenEncoder(str(save_tiny_llama(tmp_path / "llama")), device="cpu")
    names, extra = (["none"], {}) if case == "none" else (["none", "clip"], {"transform": TransformSettings(dims=(3, 7))})
    replayed, _, replayed_sims = similarity_pass(enc, _texts(40), names, need_covariance=True, **extra)
    in_pass, _, in_pass_sims = similarity_pass(enc, _texts(40), names, **extra)  # no store, no replay: the forward fills
    assert replayed.passes and len(replayed.passes) == 1  # still one forward
    for name in names:
        a, b = replayed_sims[name].result(), in_pass_sims[name].result()
        assert torch.equal(a.sum_norm_sq, b.sum_norm_sq) and torch.equal(a.counts, b.counts)
        assert torch.equal(replayed_sims[name].intra_sum, in_pass_sims[name].intra_sum)
        assert replayed_sims[name].intra_n == in_pass_sims[name].intra_n > 0


def test_a_refused_fit_leaves_no_stored_tokens_behind(tmp_path, monkeypatch):
    import tempfile

    from outlierlab.metrics.whitening import DegenerateWhiteningError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    enc = FrozenEncoder(str(save_tiny_llama(tmp_path / "llama")), device="cpu")
    with pytest.raises(DegenerateWhiteningError):  # 6 tokens cannot support a 32-dim whitening
        similarity_pass(enc, ["the cat", "the dog", "a bird"], ["none", "clip", "whiten"], words=False, reservoir=3)
    assert not list((tmp_path / "tmp").glob("outlierlab-replay-*"))


def test_the_sentence_maps_are_released_before_wic_unless_wic_reads_them(tmp_path, compose_cfg):
    """evaluate.py drops the shared pass's [L, d, d] maps and reservoir once no analysis left reads them (so
    WiC's own fit never sits beside them), and keeps them when WiC fits on the sentences' maps."""
    import json

    from probe_fixtures import SENTENCES

    d = save_tiny_llama(tmp_path / "llama")
    (tmp_path / "s.txt").write_text("\n".join(f"{s} and then {t}" for s in SENTENCES for t in SENTENCES[:5]) + "\n")
    pairs = [{"sentence1": a, "sentence2": f"{a.split()[0]} {b}", "start1": 0, "end1": len(a.split()[0]),
              "start2": 0, "end2": len(a.split()[0]), "label": i % 2 == 0}
             for i, (a, b) in enumerate(zip(SENTENCES, SENTENCES[1:] + SENTENCES[:1]))]
    (tmp_path / "wic.jsonl").write_text("\n".join(json.dumps(p) for p in pairs) + "\n")
    common = [f"encoder.name_or_path={d}", "encoder.device=cpu", f"data.files=[{tmp_path / 's.txt'}]",
              f"wic.files=[{tmp_path / 'wic.jsonl'}]", "transform=[none,whiten]", "transform.allow_degenerate=true",
              "analyses=[outliers,isotropy,wic]", "tensorboard=false", "progress=false"]
    spec_cfg = compose_cfg("evaluate", common + ["transform.fit_on=sentences"])
    from types import SimpleNamespace

    from outlierlab.evaluation.analyses import isotropy, sts, wic
    from outlierlab.evaluation.registry import EvalContext
    from outlierlab.evaluation.sentence_pass import pass_needs
    from outlierlab.evaluation import run_writer as mod

    def context(cfg):
        return EvalContext(None, None, cfg, [], None)

    # what each analysis reads from the shared pass (the maps are kept while a later one reads anything)
    assert pass_needs(wic, context(spec_cfg)) == pass_needs(sts, context(spec_cfg))
    assert pass_needs(wic, context(spec_cfg)) == {"fitted_maps"}
    assert pass_needs(isotropy, context(spec_cfg)) == {"covariance", "fitted_maps"}
    eval_cfg = compose_cfg("evaluate", common)  # fit_on=eval: WiC fits its own maps
    assert not pass_needs(wic, context(eval_cfg)) | pass_needs(sts, context(eval_cfg))
    with pytest.raises(ValueError, match=r"SENTENCE_PASS names \['covariances'\]; valid: covariance"):
        pass_needs(SimpleNamespace(__name__="mine", SENTENCE_PASS={"covariances"}), None)
    # WiC with fit_on=sentences still finds the sentence pass's maps (not released after isotropy)
    res = mod.evaluate(spec_cfg, tmp_path / "sent")
    wic = next(r for r in res["results"] if r.name == "wic")
    assert "evaluation sentences" in wic.summary["transforms"]["whiten"]
    assert any(r["transform"] == "whiten" and r["best_accuracy"] >= 0 for r in wic.rows)
    # what the release keeps and drops
    from outlierlab.evaluation.sentence_pass import OutlierCounts

    enc = FrozenEncoder(str(d), device="cpu")
    counts = OutlierCounts("whiten", enc.num_layers + 1)
    st = run_sentence_pass(enc, (tmp_path / "s.txt").read_text().splitlines(), ["none", "whiten"],
                           need_covariance=True, consumers=[counts],
                           transform=TransformSettings(allow_degenerate=True), **PASS)
    src = st.transforms.source
    assert src.W is not None and src.cov is not None
    info = st.transforms.columns("whiten")
    st.release_layer_state()
    assert src.W is None and src.cov is None
    assert st.transforms.columns("whiten") == info and counts.result().count > 0
