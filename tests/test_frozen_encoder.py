"""FrozenEncoder: every layer's hidden states + masks from any local/HF/own encoder; clear offline failure."""

from __future__ import annotations

import pytest
import torch

from outlierlab.models.encoder_source import EncoderUnavailableError, resolve_encoder
from outlierlab.models.loading import FrozenEncoder
from probe_fixtures import SENTENCES, minilm_path, save_own_run, save_tiny_bert, save_tiny_roberta


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="module")
def tiny_roberta(tmp_path_factory):
    return save_tiny_roberta(tmp_path_factory.mktemp("roberta"))


def _check_batches(enc: FrozenEncoder, texts, cls_id: int, sep_id: int, pad_id: int):
    expected_ids = enc.tokenizer(texts)["input_ids"]
    seen = 0
    for b in enc.encode(texts, batch_size=3):
        assert b.hidden.shape[0] == enc.num_layers + 1 and b.hidden.shape[-1] == enc.hidden_size
        for row, i in enumerate(b.index.tolist()):
            ids, n = expected_ids[i], len(expected_ids[i])
            assert int(b.attention_mask[row].sum()) == n
            assert b.input_ids[row, :n].tolist() == ids
            assert (b.input_ids[row, n:] == pad_id).all()
            assert ids[0] == cls_id and ids[-1] == sep_id
            special = b.special_tokens_mask[row, :n].tolist()
            assert special == [1] + [0] * (n - 2) + [1]  # only <s>/[CLS] and </s>/[SEP] are special
            seen += 1
    assert seen == len(texts)
    return b


def _reference_hidden(path, texts):
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    enc = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return torch.stack(model(**enc, output_hidden_states=True).hidden_states), enc["attention_mask"]


def test_tiny_bert_all_layers_and_masks(tiny_bert):
    enc = FrozenEncoder(str(tiny_bert), device="cpu")
    assert (enc.num_layers, enc.hidden_size, enc.max_length) == (2, 32, 64)
    tok = enc.tokenizer
    b = _check_batches(enc, SENTENCES[:5], tok.cls_token_id, tok.sep_token_id, tok.pad_token_id)
    ref, mask = _reference_hidden(tiny_bert, SENTENCES[3:5])
    assert b.hidden.shape[0] == 3  # embeddings + 2 layers
    keep = mask.bool()
    assert torch.allclose(b.hidden[:, :, :ref.shape[2]][:, keep], ref[:, keep], atol=1e-5)


def test_tiny_roberta_all_layers_and_masks(tiny_roberta):
    enc = FrozenEncoder(str(tiny_roberta), device="cpu")
    # RoBERTa positions start after padding_idx: 66 position rows -> 64 usable tokens.
    assert (enc.num_layers, enc.max_length) == (3, 64)
    b = _check_batches(enc, SENTENCES, cls_id=0, sep_id=2, pad_id=1)
    assert b.hidden.shape[0] == 4


@pytest.mark.parametrize("arch", ["distilbert", "mpnet"])
def test_other_automodel_architectures(tmp_path, arch):
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertModel, MPNetConfig, MPNetModel

    tok = AutoTokenizer.from_pretrained(minilm_path())
    torch.manual_seed(0)
    if arch == "distilbert":
        model = DistilBertModel(DistilBertConfig(vocab_size=tok.vocab_size, dim=32, n_layers=2, n_heads=2,
                                                 hidden_dim=64, max_position_embeddings=64))
    else:  # MPNet offsets positions by padding_idx like RoBERTa: 66 rows -> 64 tokens
        model = MPNetModel(MPNetConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=64, max_position_embeddings=66))
    model.eval().save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    enc = FrozenEncoder(str(tmp_path), device="cpu")
    assert (enc.num_layers, enc.hidden_size, enc.max_length) == (2, 32, 64)
    b = _check_batches(enc, SENTENCES[:3], tok.cls_token_id, tok.sep_token_id, tok.pad_token_id)
    ref, mask = _reference_hidden(tmp_path, [SENTENCES[i] for i in b.index.tolist()])
    keep = mask.bool()
    assert b.hidden.shape[0] == 3 and torch.allclose(b.hidden[:, :, :ref.shape[2]][:, keep], ref[:, keep], atol=1e-5)


def test_token_offsets_point_at_the_words(tiny_bert):
    enc = FrozenEncoder(str(tiny_bert))
    tok = enc.tokenize(["call me ishmael"])
    words = ["call me ishmael"[a:b] for a, b in tok.offsets[0][1:-1]]
    assert "".join(words).replace("#", "") == "callmeishmael" and tok.offsets[0][0] == (0, 0)


def test_minilm_real_model_layers_masks_and_values():
    enc = FrozenEncoder("all-minilm-l6-v2", device="cpu")
    assert resolve_encoder("all-minilm-l6-v2").model == minilm_path()
    assert (enc.num_layers, enc.hidden_size) == (6, 384)
    texts = SENTENCES[:2]
    b = _check_batches(enc, texts, enc.tokenizer.cls_token_id, enc.tokenizer.sep_token_id, 0)
    assert b.hidden.shape[0] == 7
    ref, mask = _reference_hidden(minilm_path(), texts)
    keep = mask.bool()
    assert torch.allclose(b.hidden[:, keep], ref[:, keep], atol=1e-4)


def test_offline_hub_id_fails_fast_with_one_clear_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EncoderUnavailableError) as e:
        FrozenEncoder("roberta-base")
    msg = str(e.value)
    assert "\n" not in msg and "offline" in msg and "encoder.name_or_path=" in msg


def test_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not found"):
        FrozenEncoder(str(tmp_path / "nope"))


def test_truncation_warns_with_count_or_fails(tiny_bert, caplog):
    texts = ["word " * 100, "short one", "word " * 80]
    enc = FrozenEncoder(str(tiny_bert), max_length=16)
    with caplog.at_level("WARNING"):
        tok = enc.tokenize(texts)
        enc.tokenize(texts, report=False)  # a pass that tokenizes in chunks reports once itself
    assert [r.getMessage() for r in caplog.records] == [
        "tokenize: 2 of 3 texts were longer than max_length=16 tokens and were truncated (152 tokens dropped)"]
    assert tok.lengths == [16, 4, 16] and tok.n_truncated == 2
    assert tok.truncated_tokens == (102 - 16) + (82 - 16)
    assert tok.input_ids[0][-1] == enc.tokenizer.sep_token_id  # truncation keeps [SEP]
    # one call, the long texts re-tokenized: what truncating every text in one call gives, offsets included
    ref = enc.tokenizer(texts, truncation=True, max_length=16, return_special_tokens_mask=True,
                        return_offsets_mapping=True)
    assert tok.input_ids == ref["input_ids"] and tok.special_tokens_mask == ref["special_tokens_mask"]
    assert tok.offsets == [[tuple(o) for o in row] for row in ref["offset_mapping"]]
    with pytest.raises(ValueError, match="exceed max_length=16"):
        FrozenEncoder(str(tiny_bert), max_length=16, on_overflow="error").tokenize(texts)
    with pytest.raises(ValueError, match="exceeds"):
        FrozenEncoder(str(tiny_bert), max_length=1000)


@pytest.mark.parametrize("max_length", [1, 0, -3, 2.5])
def test_a_max_length_below_two_is_refused_as_encoder_max_length_is(tiny_bert, max_length):
    # 1 kept only [CLS] (every text token dropped, reported as "0 tokens dropped"); 0 meant no limit at all
    with pytest.raises(ValueError) as e:
        FrozenEncoder(str(tiny_bert), max_length=max_length)
    assert str(e.value) == f"max_length must be an integer >= 2 or None (the model's 64), got {max_length!r}"
    assert FrozenEncoder(str(tiny_bert), max_length=2).max_length == 2


@pytest.mark.parametrize("pos", ["rope", "learned"])
def test_own_run_dir_export_and_checkpoint(tmp_path, pos):
    run = tmp_path / "run"
    model = save_own_run(run, pos=pos)
    texts = SENTENCES[:3]
    for target, kind in ((run, "outlierlab"), (run / "checkpoints" / "last.ckpt", "ckpt")):
        enc = FrozenEncoder(str(target), device="cpu")
        assert enc.source.kind == kind and enc.max_length == 48
        b = next(enc.encode(texts, batch_size=8))
        with torch.no_grad():
            ref = torch.stack(model.roberta(b.input_ids, b.attention_mask, output_hidden_states=True).hidden_states)
        keep = b.attention_mask.bool()
        assert b.hidden.shape[0] == 3 and torch.allclose(b.hidden[:, keep], ref[:, keep], atol=1e-5)
        assert b.input_ids[0, 0] == 0 and b.special_tokens_mask[0, 0] == 1


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_weights_loaded_on_first_encode_stay_modifiable(tmp_path, pos):
    """Weights are loaded lazily inside encode()'s inference mode; they must still be ordinary tensors,
    so the ablation can zero LayerNorm entries in place (regression: 'Inplace update to inference tensor')."""
    from outlierlab.models.layernorms import zero_layernorm_dims
    save_own_run(tmp_path / "run", pos=pos)
    run = tmp_path / "run"
    enc = FrozenEncoder(str(run))
    list(enc.encode(["a short test sentence"]))
    ln = enc.model.roberta.encoder.layer[0].output.LayerNorm
    assert not ln.weight.is_inference()
    before = ln.weight.detach().clone()
    with zero_layernorm_dims({"layer.0.output": ln}, [1]):
        assert ln.weight[1] == 0
    assert torch.equal(ln.weight, before)


@pytest.mark.parametrize("pos", ["none", "rope"])
def test_own_model_names_its_position_scheme_in_every_form(tmp_path, pos):
    """``FrozenEncoder.pos``: our scheme, read from the config of the run dir, its export and its checkpoint
    (probe.py's report says when a masked LM without positions is probed); None for other models."""
    save_own_run(tmp_path / "run", pos=pos)
    for target in (tmp_path / "run", tmp_path / "run" / "checkpoints" / "last.ckpt"):
        enc = FrozenEncoder(str(target), device="cpu")
        assert (enc.pos, enc.causal) == (pos, False)
    assert FrozenEncoder(str(minilm_path()), device="cpu").pos is None


def test_probe_report_of_a_model_without_positions_names_the_content_baseline(tmp_path, compose_cfg):
    from outlierlab.evaluation.probing import run

    for pos in ("none", "learned"):
        save_own_run(tmp_path / pos, pos=pos)
        cfg = compose_cfg("probe", [f"encoder.name_or_path={tmp_path / pos}", "progress=false", "probe.epochs=1",
                                    f"features.cache_dir={tmp_path / 'cache'}", "data.max_sentences=60",
                                    "transform=[none]"])
        run(cfg, tmp_path / f"probe_{pos}")
    assert "no position input" in (tmp_path / "probe_none" / "probe_report.md").read_text()
    assert "no position input" not in (tmp_path / "probe_learned" / "probe_report.md").read_text()


def test_evaluate_and_probe_report_truncation_in_the_same_one_line(tiny_bert, caplog):
    """evaluate's layer stream (in chunks) and probe's feature extraction say what truncation removed the same way:
    one warning line per pass with the count and the tokens dropped, never a line per chunk."""
    from outlierlab.datamodules.features import extract_features
    from outlierlab.evaluation.sentence_stream import Consumer, LayerStream

    class Count(Consumer):
        def update(self, layer, vectors, batch):
            pass

    texts = ["word " * 100, "short one", "word " * 80, "another short one"]
    enc = FrozenEncoder(str(tiny_bert), max_length=16)
    with caplog.at_level("WARNING"):
        LayerStream(enc, texts, chunk=1, batch_size=2).forward([Count()], desc="pass 1/1")
        extract_features(enc, texts, None, progress=False)
    tail = "2 of 4 texts were longer than max_length=16 tokens and were truncated (152 tokens dropped)"
    assert [r.getMessage() for r in caplog.records] == [f"pass 1/1: {tail}", f"features: {tail}"]
