"""Encoder precision (dtype), placement (device_map), hub revisions (one pass and one layer in
memory: test_one_pass.py).

Every model here is tiny and saved locally; the "hub" is a local Hugging Face cache laid out as the hub
client writes it (refs/<revision> -> snapshots/<commit>/), read offline, so revisions resolve exactly as
they would for ``EleutherAI/pythia-160m`` at ``step1000``.
"""

from __future__ import annotations

import pytest
import torch

from outlierlab.evaluation.activation_pass import ActivationObserver
from outlierlab.evaluation.sentence_pass import AnisotropyReservoir, OutlierCounts, run_sentence_pass
from outlierlab.models.encoder_source import EncoderUnavailableError
from outlierlab.models.loading import FrozenEncoder
from llama_fixtures import PASS, RESERVOIR, fake_hub, save_tiny_llama
from llama_fixtures import texts as _texts
from probe_fixtures import save_tiny_bert


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
    """The pass with the outliers analysis' consumers (its outlier counts per transform, its activations) and the
    anisotropy analysis' reservoir."""
    counts = [OutlierCounts(t, enc.num_layers + 1) for t in ("none", "clip", "whiten")]
    obs, pairs = ActivationObserver(enc), AnisotropyReservoir(RESERVOIR.n_sentences, PASS["seed"])
    st = run_sentence_pass(enc, texts, ["none", "clip", "whiten"], need_whitener=True, need_covariance=True,
                           consumers=[*counts, obs, pairs], **PASS, **kw)
    return st, {c.transform: c.result() for c in counts}, obs, pairs


# ------------------------------------------------------------------------------------------------ dtype
def test_bfloat16_statistics_agree_with_float32_and_accumulate_in_float64(tmp_path):
    d = save_tiny_llama(tmp_path / "llama")
    texts = _texts()
    f32 = FrozenEncoder(str(d), device="cpu", dtype="float32")
    bf16 = FrozenEncoder(str(d), device="cpu", dtype="bfloat16")
    (a, ca, oa, pa), (b, cb, ob, pb) = _stats(f32, texts), _stats(bf16, texts)
    assert next(bf16.model.parameters()).dtype == torch.bfloat16
    assert next(f32.model.parameters()).dtype == torch.float32
    # the accumulators upcast: float64 sums whatever the model's dtype
    for st, counts, obs in ((a, ca, oa), (b, cb, ob)):
        assert counts["none"].sum.dtype == torch.float64
        src = st.transforms.source  # Σx, Σxxᵀ and the fit in float64; the fitted Σ and W kept in float32
        assert src.sum.dtype == src.singular_values.dtype == src.mean.dtype == torch.float64
        assert src.compact and src.cov.dtype == src.W.dtype == torch.float32
        assert st.transforms.source.sum_outer is None  # released once fitted (the (L+1)·d² sums are done)
        assert obs.acc.sum_sq.dtype == torch.float64
    # stated tolerance: bf16 keeps 8 mantissa bits (relative error 2^-8 = 0.4% per value, a few % after 3 layers)
    ma, mb = ca["none"].mean(), cb["none"].mean()
    assert torch.allclose(ma, mb, rtol=0.05, atol=0.05 * float(ma.abs().max()))
    sa, sb = ca["none"].argmax_share(), cb["none"].argmax_share()
    assert (sa - sb).abs().max() < 0.1  # argmax shares: ties in bf16 may move a few tokens
    assert ca["none"].argmax_share()[1:, 5].min() > 0.5  # the planted dim is found in both
    assert torch.allclose(pa.anisotropy(a.transforms, "none"), pb.anisotropy(b.transforms, "none"), atol=0.02)
    assert torch.allclose(oa.acc.kurtosis(), ob.acc.kurtosis(), rtol=0.05)


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
    (a, ca, _, pa), (b, cb, _, pb) = _stats(whole, texts), _stats(split, texts)
    assert split.model.hf_device_map["encoder.layer.1"] == "disk"
    # the layer really is off-device: its weights stay on "meta" and accelerate loads them (from the
    # safetensors file itself) for each forward
    assert next(split.model.encoder.layer[1].parameters()).device.type == "meta"
    assert next(split.model.encoder.layer[0].parameters()).device.type == "cpu"
    for name in ("none", "clip", "whiten"):
        assert torch.equal(ca[name].argmax_counts, cb[name].argmax_counts)
        assert torch.allclose(ca[name].sum, cb[name].sum, rtol=1e-6, atol=1e-6)
    assert torch.allclose(pa.anisotropy(a.transforms, "whiten"), pb.anisotropy(b.transforms, "whiten"), atol=1e-6)


def test_device_map_with_our_own_model_is_one_line(tmp_path):
    from probe_fixtures import save_own_run

    save_own_run(tmp_path / "run")
    with pytest.raises(ValueError, match="encoder.device_map applies to Hugging Face models"):
        FrozenEncoder(str(tmp_path / "run"), device="cpu", device_map="auto")


def test_mlm_analyses_load_the_encoders_revision_and_dtype(tmp_path, offline_cache):
    """ablation / frequency / attention sinks load the model again with its LM head: at the same revision
    and dtype as the encoder (not main, not float32)."""
    from transformers import AutoModel

    from outlierlab.models.lm_model import load_mlm

    fake_hub(offline_cache, "org/tiny", {"step0": save_tiny_bert(tmp_path / "s0", seed=0),
                                         "step1000": save_tiny_bert(tmp_path / "s1", seed=1)})
    enc = FrozenEncoder("org/tiny", device="cpu", revision="step1000", dtype="bfloat16")
    loaded = load_mlm(enc)
    emb = loaded.model.get_input_embeddings().weight
    assert emb.dtype == torch.bfloat16
    ref = AutoModel.from_pretrained(tmp_path / "s1").embeddings.word_embeddings.weight
    assert torch.equal(emb, ref.to(torch.bfloat16))
