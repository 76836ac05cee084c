"""Issue 39: encoder precision (dtype), placement (device_map), hub revisions, one layer in memory.

Every model here is tiny and saved locally; the "hub" is a local Hugging Face cache laid out as the hub
client writes it (refs/<revision> -> snapshots/<commit>/), read offline, so revisions resolve exactly as
they would for ``EleutherAI/pythia-160m`` at ``step1000``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from outlierlab.evaluation.streaming import run_sentence_pass
from outlierlab.models.loading import EncoderUnavailableError, FrozenEncoder
from probe_fixtures import minilm_path, save_tiny_bert

PASS = dict(outlier_method="share", outlier_threshold=0.25, outlier_k=3.0, n_anisotropy_sentences=40,
            min_sentences=3, max_words=20, lowercase=True, seed=0, chunk=16, batch_size=8)


def _texts(n: int = 40) -> list[str]:
    from outlierlab.datamodules.probe_data import load_position_texts

    return load_position_texts(None, n)


def save_tiny_llama(directory: Path, seed: int = 0, dtype=torch.float32) -> Path:
    """A random 3-layer Llama (pre-RMSNorm decoder) with the MiniLM WordPiece tokenizer, saved in ``dtype``."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaModel

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(minilm_path())
    cfg = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                      pad_token_id=tok.pad_token_id, bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id)
    model = LlamaModel(cfg).eval()
    with torch.no_grad():  # a massive-activation-like dim so the statistics have something to find
        model.embed_tokens.weight[:, 5] += 4.0
    model.to(dtype).save_pretrained(directory)
    tok.save_pretrained(directory)
    return Path(directory)


def fake_hub(cache: Path, repo: str, revisions: dict[str, Path]) -> None:
    """Lay saved model directories out as the hub client's cache: ``models--org--name/refs/<rev>`` holds a
    commit hash, ``snapshots/<hash>/`` the files."""
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    for rev, src in revisions.items():
        commit = hashlib.sha1(rev.encode()).hexdigest()
        snap = root / "snapshots" / commit
        snap.mkdir(parents=True, exist_ok=True)
        for f in src.iterdir():
            (snap / f.name).write_bytes(f.read_bytes())
        (root / "refs" / rev).write_text(commit)


@pytest.fixture()
def offline_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def _stats(enc, texts, **kw):
    return run_sentence_pass(enc, texts, ["none", "clip", "whiten"], outlier_transforms=["none", "clip", "whiten"],
                             need_whitener=True, need_covariance=True, need_activations=True, **PASS, **kw)


# ------------------------------------------------------------------------------------------------ dtype
def test_bfloat16_statistics_agree_with_float32_and_accumulate_in_float64(tmp_path):
    d = save_tiny_llama(tmp_path / "llama")
    texts = _texts()
    f32 = FrozenEncoder(str(d), device="cpu", dtype="float32")
    bf16 = FrozenEncoder(str(d), device="cpu", dtype="bfloat16")
    a, b = _stats(f32, texts), _stats(bf16, texts)
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    assert next(f32.model.parameters()).dtype == torch.float32
    # the accumulators upcast: float64 sums whatever the model's dtype
    for st in (a, b):
        assert st.outliers["none"].sum.dtype == torch.float64
        src = st.transforms.source  # Σx, Σxxᵀ and the fit in float64; the fitted Σ and W kept in float32
        assert src.sum.dtype == src.singular_values.dtype == src.mean.dtype == torch.float64
        assert src.compact and src.cov.dtype == src.W.dtype == torch.float32
        assert st.transforms.source.sum_outer is None  # released once fitted (the (L+1)·d² sums are done)
        assert st.activations.acc.sum_sq.dtype == torch.float64
    # stated tolerance: bf16 keeps 8 mantissa bits (relative error 2^-8 = 0.4% per value, a few % after 3 layers)
    ma, mb = a.outliers["none"].mean(), b.outliers["none"].mean()
    assert torch.allclose(ma, mb, rtol=0.05, atol=0.05 * float(ma.abs().max()))
    sa, sb = a.outliers["none"].argmax_share(), b.outliers["none"].argmax_share()
    assert (sa - sb).abs().max() < 0.1  # argmax shares: ties in bf16 may move a few tokens
    assert a.outliers["none"].argmax_share()[1:, 5].min() > 0.5  # the planted dim is found in both
    assert torch.allclose(a.anisotropy("none"), b.anisotropy("none"), atol=0.02)
    assert torch.allclose(a.activations.acc.kurtosis(), b.activations.acc.kurtosis(), rtol=0.05)


def test_dtype_auto_keeps_the_checkpoint_dtype(tmp_path):
    d = save_tiny_llama(tmp_path / "llama16", dtype=torch.float16)
    assert next(FrozenEncoder(str(d), device="cpu", dtype="auto").model.parameters()).dtype == torch.float16
    assert next(FrozenEncoder(str(d), device="cpu").model.parameters()).dtype == torch.float32
    with pytest.raises(ValueError, match="encoder.dtype must be one of"):
        FrozenEncoder(str(d), device="cpu", dtype="int8")


# ------------------------------------------------------------------------------------------------ revisions
def test_revision_reaches_from_pretrained_for_model_and_tokenizer(tmp_path, offline_cache):
    fake_hub(offline_cache, "org/tiny", {"step0": save_tiny_bert(tmp_path / "s0", seed=0),
                                         "step1000": save_tiny_bert(tmp_path / "s1", seed=1)})
    from transformers import AutoModel

    for rev, seed_dir in (("step0", "s0"), ("step1000", "s1")):
        enc = FrozenEncoder("org/tiny", device="cpu", revision=rev)
        ref = AutoModel.from_pretrained(tmp_path / seed_dir)
        assert torch.equal(enc.model.embeddings.word_embeddings.weight, ref.embeddings.word_embeddings.weight)
        assert enc.source.revision == rev and enc.identity["requested_revision"] == rev
        assert enc.tokenizer("a b")["input_ids"][0] == enc.tokenizer.cls_token_id
    assert FrozenEncoder("org/tiny", device="cpu", revision="step0").identity != \
        FrozenEncoder("org/tiny", device="cpu", revision="step1000").identity  # the feature cache tells them apart


def test_unknown_revision_offline_is_one_line(tmp_path, offline_cache):
    fake_hub(offline_cache, "org/tiny", {"step0": save_tiny_bert(tmp_path / "s0")})
    with pytest.raises(EncoderUnavailableError) as e:
        FrozenEncoder("org/tiny", device="cpu", revision="step9")
    msg = str(e.value)
    assert "\n" not in msg and "'step9'" in msg and "hf download org/tiny --revision step9" in msg


def test_revision_with_a_local_path_is_one_line(tmp_path):
    d = save_tiny_bert(tmp_path / "b")
    with pytest.raises(ValueError, match="encoder.revision=step1 names a hub snapshot"):
        FrozenEncoder(str(d), device="cpu", revision="step1")


def test_from_config_reads_every_encoder_key(tmp_path):
    from omegaconf import OmegaConf

    d = save_tiny_bert(tmp_path / "b")
    node = OmegaConf.create({"name_or_path": str(d), "max_length": 32, "on_overflow": "error", "device": "cpu",
                             "batch_size": 4, "dtype": "bfloat16", "device_map": None, "revision": None})
    enc = FrozenEncoder.from_config(node)
    assert (enc.max_length, enc.on_overflow, enc.batch_size, enc.dtype_name) == (32, "error", 4, "bfloat16")


# ------------------------------------------------------------------------------------------------ device_map
def test_device_map_split_over_cpu_and_disk_gives_the_same_statistics(tmp_path):
    """accelerate on a CPU-only machine can place modules on "cpu" and offload others to "disk" (loaded into
    CPU memory one module at a time, as it does for CPU-offloaded layers of a GPU run)."""
    d = save_tiny_bert(tmp_path / "b", layers=2)
    texts = _texts()
    whole = FrozenEncoder(str(d), device="cpu")
    split = FrozenEncoder(str(d), device="cpu", device_map={"embeddings": "cpu", "encoder.layer.0": "cpu",
                                                            "encoder.layer.1": "disk", "pooler": "cpu"},
                          offload_folder=str(tmp_path / "offload"))
    a, b = _stats(whole, texts), _stats(split, texts)
    assert split.model.hf_device_map["encoder.layer.1"] == "disk"
    # the layer really is off-device: its weights stay on "meta" and accelerate loads them (from the
    # safetensors file itself) for each forward
    assert next(split.model.encoder.layer[1].parameters()).device.type == "meta"
    assert next(split.model.encoder.layer[0].parameters()).device.type == "cpu"
    for name in ("none", "clip", "whiten"):
        assert torch.equal(a.outliers[name].argmax_counts, b.outliers[name].argmax_counts)
        assert torch.allclose(a.outliers[name].sum, b.outliers[name].sum, rtol=1e-6, atol=1e-6)
    assert torch.allclose(a.anisotropy("whiten"), b.anisotropy("whiten"), atol=1e-6)


def test_device_map_with_our_own_model_is_one_line(tmp_path):
    from probe_fixtures import save_own_run

    save_own_run(tmp_path / "run")
    with pytest.raises(ValueError, match="encoder.device_map applies to Hugging Face models"):
        FrozenEncoder(str(tmp_path / "run"), device="cpu", device_map="auto")


# ------------------------------------------------------------------------------------------------ one pass
def _run_evaluate(cfg, out: Path) -> dict:
    import importlib.util

    spec = importlib.util.spec_from_file_location("evaluate_script", Path(__file__).parents[1] / "evaluate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.evaluate(cfg, out)


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
@pytest.mark.parametrize("arch", ["bert", "gpt2", "gpt_neox", "llama", "olmo", "ours"])
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
               # not in the family registry: the layers come from output_hidden_states (the fallback)
               "olmo": lambda: T.OlmoConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=3,
                                            num_attention_heads=4, intermediate_size=64, pad_token_id=0)}[arch]()
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
    from outlierlab.analysis.sts import mean_pool
    from outlierlab.analysis.transforms import Whitener
    from outlierlab.evaluation.sts import sentence_vectors
    from outlierlab.evaluation.transform_fit import WhitenSettings
    from outlierlab.evaluation.wic import target_vectors

    enc = FrozenEncoder(str(save_tiny_llama(tmp_path / "llama")), device="cpu", batch_size=3)
    s = _texts(6)
    pairs = []
    for i in range(5):
        a, b = s[i], s[(i + 1) % 5]  # every sentence twice: once as sentence1, once as sentence2
        wa, wb = a.split()[1], b.split()[2]
        pairs.append({"sentence1": a, "sentence2": b, "start1": a.index(wa), "end1": a.index(wa) + len(wa),
                      "start2": b.index(wb), "end2": b.index(wb) + len(wb), "label": True})
    vecs, found, w = target_vectors(enc, pairs, WhitenSettings())
    assert found.all()
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
    # fitted from the stored tokens one layer at a time, Σ kept in float32
    assert torch.allclose(w.cov.double(), ref_w.finalize().cov, rtol=1e-5, atol=1e-7)
    out, ok = sentence_vectors(enc, s + s[:2])
    assert ok.all() and torch.equal(out[:, 6], out[:, 0])  # a repeated text: the same vector
    for i, text in enumerate(s):
        (b,) = list(enc.encode([text]))
        valid = b.attention_mask.bool() & ~b.special_tokens_mask.bool()
        assert torch.allclose(out[:, i], mean_pool(b.hidden, valid)[:, 0], atol=1e-5)


def test_mlm_analyses_load_the_encoders_revision_and_dtype(tmp_path, offline_cache):
    """ablation / frequency / attention sinks load the model again with its LM head: at the same revision
    and dtype as the encoder (not main, not float32)."""
    from transformers import AutoModel

    from outlierlab.evaluation.mlm_loading import load_mlm

    fake_hub(offline_cache, "org/tiny", {"step0": save_tiny_bert(tmp_path / "s0", seed=0),
                                         "step1000": save_tiny_bert(tmp_path / "s1", seed=1)})
    enc = FrozenEncoder("org/tiny", device="cpu", revision="step1000", dtype="bfloat16")
    loaded = load_mlm(enc)
    emb = loaded.model.get_input_embeddings().weight
    assert emb.dtype == torch.bfloat16
    ref = AutoModel.from_pretrained(tmp_path / "s1").embeddings.word_embeddings.weight
    assert torch.equal(emb, ref.to(torch.bfloat16))


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
    store.cleanup()
    assert not (tmp_path / "s").exists()


def test_frequency_chunks_one_layer_at_a_time_equal_the_stacked_batches(tmp_path):
    from outlierlab.analysis.outlier_stats import OutlierAccumulator, valid_token_mask
    from outlierlab.evaluation.frequency import _activation_stats, _valid_chunks

    enc = FrozenEncoder(str(save_tiny_llama(tmp_path / "llama")), device="cpu", batch_size=4)
    tok = enc.tokenize(_texts(10))
    dims = [5, 0, 17]
    ref = OutlierAccumulator(enc.num_layers + 1, enc.hidden_size)
    for (ids, vals), b in zip(_valid_chunks(enc, tok, dims), enc.batches(tok, sort_by_length=True)):
        valid = valid_token_mask(b.attention_mask, b.special_tokens_mask)
        assert torch.equal(ids, b.input_ids[valid])
        assert torch.equal(vals, b.hidden[:, valid][..., dims])
        ref.update(b.hidden, mask=valid)
    got = _activation_stats(enc, tok)
    for k, v in ref.stats().items():
        assert torch.allclose(got[k], v, rtol=0, atol=1e-12), k


def test_anisotropy_reservoir_sized_to_the_sentences_draws_the_same_pairs():
    """streaming.py sizes the reservoir min(anisotropy.n_sentences, #sentences): the same tokens and pairs as the
    full 2,000-slot reservoir (the generator is consumed the same way), without its memory."""
    from outlierlab.analysis.similarity import AnisotropyAccumulator

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


def test_a_refused_fit_leaves_no_stored_tokens_behind(tmp_path, monkeypatch):
    import tempfile

    from outlierlab.analysis.whitening import DegenerateWhiteningError

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    enc = FrozenEncoder(str(save_tiny_llama(tmp_path / "llama")), device="cpu")
    with pytest.raises(DegenerateWhiteningError):  # 6 tokens cannot support a 32-dim whitening
        run_sentence_pass(enc, ["the cat", "the dog", "a bird"], ["none", "clip", "whiten"],
                          outlier_transforms=["none", "clip", "whiten"], need_self_sim=False,
                          **{**PASS, "n_anisotropy_sentences": 3})
    assert not list((tmp_path / "tmp").glob("outlierlab-replay-*"))


def test_the_sentence_maps_are_released_before_wic_unless_wic_reads_them(tmp_path, compose_cfg):
    """evaluate.py drops the shared pass's [L, d, d] maps and reservoir once no analysis left reads them (so
    WiC's own fit never sits beside them), and keeps them when WiC fits on the sentences' maps."""
    import importlib.util
    import json

    from probe_fixtures import SENTENCES

    from outlierlab.evaluation.transform_fit import WhitenSettings

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
    spec = importlib.util.spec_from_file_location("evaluate_script", Path(__file__).parents[1] / "evaluate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod._reads_sentence_maps(["wic"], spec_cfg) and mod._reads_sentence_maps(["isotropy"], spec_cfg)
    eval_cfg = compose_cfg("evaluate", common)  # fit_on=eval: WiC fits its own maps
    assert not mod._reads_sentence_maps(["wic", "sts"], eval_cfg)
    # WiC with fit_on=sentences still finds the sentence pass's maps (not released after isotropy)
    res = mod.evaluate(spec_cfg, tmp_path / "sent")
    wic = next(r for r in res["results"] if r.name == "wic")
    assert "evaluation sentences" in wic.summary["transforms"]["whiten"]
    assert any(r["transform"] == "whiten" and r["best_accuracy"] >= 0 for r in wic.rows)
    # what the release keeps and drops
    st = run_sentence_pass(FrozenEncoder(str(d), device="cpu"), (tmp_path / "s.txt").read_text().splitlines(),
                           ["none", "whiten"], outlier_transforms=["none", "whiten"], need_covariance=True,
                           need_self_sim=False, whiten=WhitenSettings(allow_degenerate=True), **PASS)
    src = st.transforms.source
    assert src.W is not None and src.cov is not None and st.anisotropy_acc is not None
    info = st.transforms.columns("whiten")
    st.release_layer_state()
    assert src.W is None and src.cov is None and st.anisotropy_acc is None
    assert st.transforms.columns("whiten") == info and st.outliers["whiten"].count > 0
