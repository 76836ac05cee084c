"""The out-of-core data pipeline: streamed documents -> one flat token file -> blocks from a memory map.

The reference for every block is the in-memory path of earlier versions: tokenize the list of documents,
:func:`build_stream`, :func:`pack_blocks`.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from packing_fixtures import build_stream, pack_blocks
from outlierlab.datamodules import token_cache
from outlierlab.datamodules.token_blocks import TokenBlocks
from outlierlab.datamodules.corpus import load_embedded_texts
from outlierlab.datamodules.masking import DeterministicMLMCollator
from outlierlab.datamodules.mlm_datamodule import MLMDataModule
from outlierlab.datamodules.token_cache import read_meta, token_dtype, write_token_file
from outlierlab.datamodules.tokenizer import train_bpe_tokenizer

N_DOCS, VOCAB, BLOCK = 1500, 700, 64


def reference_blocks(tok, docs, block_size=BLOCK):
    """The in-memory path of earlier versions (blocks.build_blocks): tokenizer call, stream, pack."""
    ids = tok(docs, add_special_tokens=False, verbose=False)["input_ids"]
    stream = build_stream(ids, tok.sep_token_id if tok.sep_token_id is not None else tok.eos_token_id)
    return stream, *pack_blocks(stream, block_size, tok.cls_token_id, tok.pad_token_id)


def datamodule(cache, **kw):
    args = dict(max_documents=N_DOCS, tokenizer={"vocab_size": VOCAB}, block_size=BLOCK, batch_size=8,
                val_fraction=0.05, cache_dir=str(cache), num_proc=1, tokenize_chunk_mb=0.02)
    dm = MLMDataModule(**{**args, **kw})
    dm.prepare_data()
    dm.setup("fit")
    return dm


class OneShot:
    """Documents that can be read exactly once, one at a time: no len(), a second iter() raises.

    At every document handed out it records how many bytes of token file are already on disk under ``watch``,
    so a test can tell a stream (written while read) from a list made first.
    """

    def __init__(self, docs, watch=None):
        self.docs, self.watch, self.used, self.on_disk = docs, watch, False, []

    def __len__(self):
        raise AssertionError("the corpus was measured with len(): it would have to be materialised")

    def __iter__(self):
        if self.used:
            raise AssertionError("the corpus was read twice")
        self.used = True
        for d in self.docs:
            if self.watch is not None:
                self.on_disk.append(sum(p.stat().st_size for p in self.watch.rglob("tokens.bin")))
            yield d


# ------------------------------------------------------------------------------- equal to the old path
def test_memmap_blocks_masks_split_and_masking_equal_the_in_memory_path(tmp_path):
    docs = load_embedded_texts(max_documents=N_DOCS)
    dm = datamodule(tmp_path)
    stream, ref_ids, ref_mask = reference_blocks(dm.tokenizer, docs)
    assert isinstance(dm.train_dataset.blocks.stream, np.memmap) and dm.token_meta["dtype"] == "<u2"
    ids, mask = dm.train_dataset.blocks.arrays()
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(mask, ref_mask)
    assert dm.stats["stream_tokens"] == len(stream) and dm.stats["blocks"] == len(ref_ids)
    assert dm.stats["pad_tokens"] == int((ref_mask == 0).sum())
    # the split of earlier versions (a seeded permutation of the block ids), and its token count
    n = len(ref_ids)
    order = np.random.default_rng(dm.seed).permutation(n)
    n_val = round(0.05 * n)
    assert dm.val_dataset.rows.tolist() == sorted(order[:n_val].tolist())
    assert dm.train_dataset.rows.tolist() == sorted(order[n_val:].tolist())
    assert dm.stats["train_tokens"] == int(ref_mask[dm.train_dataset.rows].sum())
    # the same masked positions, batch by batch, for the seed: collate the reference blocks of the same indices
    collator = DeterministicMLMCollator(dm.tokenizer, seed=dm.seed)
    loader = dm.train_dataloader()
    order = dm._train_sampler._epoch_order(0).tolist()
    for b, batch in zip(range(3), loader):
        rows = [int(dm.train_dataset.rows[i]) for i in order[b * 8:(b + 1) * 8]]
        ref = collator([{"index": r, "input_ids": torch.from_numpy(ref_ids[r]),
                         "attention_mask": torch.from_numpy(ref_mask[r])} for r in rows])
        assert set(batch) == {"input_ids", "attention_mask", "labels"}
        for k in batch:
            assert torch.equal(batch[k], ref[k]), k
        assert (batch["labels"] != -100).any()


def test_num_proc_two_writes_the_same_file_and_a_second_block_size_reuses_it(tmp_path):
    one = datamodule(tmp_path / "a")
    two = datamodule(tmp_path / "b", num_proc=2)
    assert two.cache_hits == {"tokenizer": False, "blocks": False}
    a, b = (dm.blocks_path / "tokens.bin" for dm in (one, two))
    assert a.read_bytes() == b.read_bytes() and one.blocks_path.name == two.blocks_path.name
    # the token file does not depend on the block size: another block size maps the same file
    wide = datamodule(tmp_path / "a", block_size=128)
    assert wide.cache_hits == {"tokenizer": True, "blocks": True} and wide.blocks_path == one.blocks_path
    _, ref_ids, ref_mask = reference_blocks(wide.tokenizer, load_embedded_texts(max_documents=N_DOCS), 128)
    ids, mask = wide.train_dataset.blocks.arrays()
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(mask, ref_mask)


# ---------------------------------------------------------------------------- a stream, never a list
@pytest.mark.parametrize("num_proc", [1, 2])
def test_a_generator_corpus_is_read_once_as_a_stream(tmp_path, num_proc):
    docs = load_embedded_texts(max_documents=600)
    tok = train_bpe_tokenizer(OneShot(docs), vocab_size=500)  # the BPE trainer streams it too
    assert tok.get_vocab() == train_bpe_tokenizer(docs, vocab_size=500).get_vocab()
    corpus = OneShot(iter(docs), watch=tmp_path)
    meta = write_token_file(corpus, tok, tok.sep_token_id, tmp_path / "tok", {"source": "generator"},
                            num_proc=num_proc, chunk_chars=800)
    assert corpus.used and meta["documents"] == 600 and read_meta(tmp_path / "tok") == meta
    stream, _, _ = reference_blocks(tok, docs)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "tok" / "tokens.bin", dtype=meta["dtype"]), stream)
    # written while read: when the last document was handed out, most of the file was on disk already
    # (a list made first would show 0 bytes at every document)
    final = (tmp_path / "tok" / "tokens.bin").stat().st_size
    assert corpus.on_disk[0] == 0 and corpus.on_disk[-1] > 0.5 * final


# ---------------------------------------------------------------------------------- killed builds
def test_a_killed_build_leaves_no_cache_a_later_run_trusts(tmp_path, monkeypatch):
    good = datamodule(tmp_path / "good")
    real = token_cache.encode_documents

    def dies_after_two_chunks(*args, **kw):
        for i, chunk in enumerate(real(*args, **kw)):
            if i == 2:
                raise RuntimeError("simulated kill inside the writer")
            yield chunk

    monkeypatch.setattr(token_cache, "encode_documents", dies_after_two_chunks)
    cache = tmp_path / "cache"
    with pytest.raises(RuntimeError, match="simulated kill"):
        datamodule(cache)
    tokens_dir = cache / "tokens"
    assert not list(tokens_dir.rglob("meta.json")) and not list(tokens_dir.rglob("tokens.bin"))
    # what a kill -9 leaves (the except clause never ran): a temporary folder, and a final folder that does
    # not verify (tokens.bin shorter than meta.json announces)
    final = tokens_dir / good.blocks_path.name
    (tokens_dir / f".{final.name}.deadbeef").mkdir()
    (tokens_dir / f".{final.name}.deadbeef" / "tokens.bin").write_bytes(b"\0" * 100)
    final.mkdir()
    (final / "tokens.bin").write_bytes((good.blocks_path / "tokens.bin").read_bytes()[:-64])
    (final / "meta.json").write_text((good.blocks_path / "meta.json").read_text())
    assert read_meta(final) is None
    monkeypatch.setattr(token_cache, "encode_documents", real)
    again = datamodule(cache)
    assert again.cache_hits["blocks"] is False and again.blocks_path == final
    assert not list(tokens_dir.glob(".*"))  # leftovers of the dead build removed
    for a, b in zip(again.train_dataset.blocks.arrays(), good.train_dataset.blocks.arrays()):
        np.testing.assert_array_equal(a, b)
    # and a cache of another format version is rebuilt, not trusted
    meta = json.loads((final / "meta.json").read_text())
    (final / "meta.json").write_text(json.dumps({**meta, "format": "flat-stream-v1"}))
    assert datamodule(cache).cache_hits["blocks"] is False


# ------------------------------------------------------------------------------- dtype by vocab size
def test_dtype_follows_the_vocabulary_size():
    assert token_dtype(8192) == np.uint16 and token_dtype(50265) == np.uint16
    assert token_dtype(65536) == np.uint16  # ids 0..65535 fit
    assert token_dtype(65537) == np.int32 and token_dtype(250_002) == np.int32


@pytest.mark.parametrize("vocab_size, dtype", [(65536, "<u2"), (70_000, "<i4")])
def test_ids_at_the_top_of_a_large_vocabulary_round_trip(tmp_path, vocab_size, dtype):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    vocab = {t: i for i, t in enumerate(specials)} | {f"w{i}": i for i in range(5, vocab_size)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", pad_token="<pad>", eos_token="</s>",
                                  unk_token="<unk>", mask_token="<mask>", cls_token="<s>", sep_token="</s>")
    assert len(tok) == vocab_size
    top = [vocab_size - 1, vocab_size - 2, 65535, 65534, 5, 40000]
    docs = [" ".join(f"w{i}" for i in top), "w65535 w7", " ".join(f"w{i}" for i in reversed(top))]
    meta = write_token_file(iter(docs), tok, 2, tmp_path / "t", {}, num_proc=1)
    assert meta["dtype"] == dtype and (tmp_path / "t" / "tokens.bin").stat().st_size == meta["tokens"] * (
        2 if dtype == "<u2" else 4)
    stream, ref_ids, ref_mask = reference_blocks(tok, docs, block_size=4)
    assert stream.max() == vocab_size - 1
    blocks = TokenBlocks(tmp_path / "t", meta, 4, bos_id=0, pad_id=1)
    ids, mask = blocks.arrays()
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(mask, ref_mask)


def test_memmap_is_not_pickled_with_the_dataset(tmp_path):
    import pickle

    dm = datamodule(tmp_path)
    item = dm.train_dataset[3]
    clone = pickle.loads(pickle.dumps(dm.train_dataset))  # a spawned DataLoader worker / ddp_spawn
    assert len(pickle.dumps(dm.train_dataset)) < 10 * len(dm.train_dataset) + 10_000  # no token stream inside
    assert all(torch.equal(clone[3][k], item[k]) for k in ("input_ids", "attention_mask")) and clone[3]["index"] == item["index"]


def test_bad_build_settings_are_one_line():
    with pytest.raises(ValueError, match=r"data\.num_proc must be an integer >= 1"):
        MLMDataModule(num_proc=0)
    with pytest.raises(ValueError, match=r"data\.tokenize_chunk_mb must be in"):
        MLMDataModule(tokenize_chunk_mb=0)
    with pytest.raises(ValueError, match=r"data\.tokenizer\.max_training_documents must be an integer >= 1"):
        MLMDataModule(tokenizer={"max_training_documents": 0})


def test_bpe_sample_cap_trains_on_the_first_documents_only(tmp_path):
    docs = load_embedded_texts(max_documents=N_DOCS)
    capped = datamodule(tmp_path, tokenizer={"vocab_size": VOCAB, "max_training_documents": 300})
    full = datamodule(tmp_path, tokenizer={"vocab_size": VOCAB})
    assert capped.tokenizer.get_vocab() == train_bpe_tokenizer(docs[:300], vocab_size=VOCAB).get_vocab()
    assert capped.tokenizer.get_vocab() != full.tokenizer.get_vocab()
    assert capped.token_meta["documents"] == full.token_meta["documents"] == N_DOCS  # the cap is for the BPE only


def test_build_progress_lines_at_info(tmp_path, caplog):
    import logging

    from outlierlab.datamodules.corpus import embedded_files
    from outlierlab.datamodules.documents import FileDocuments

    caplog.set_level(logging.INFO, logger="outlierlab.datamodules.token_cache")
    docs = FileDocuments(embedded_files()[:1])  # one novel, ~0.5-1 MB
    tok = train_bpe_tokenizer(load_embedded_texts(max_documents=300), vocab_size=400)
    fractions = []

    def fraction():
        fractions.append(docs.fraction())
        return fractions[-1]

    write_token_file(docs, tok, 2, tmp_path / "t", {}, num_proc=1, chunk_chars=100_000, fraction=fraction,
                     log_every_s=0)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[tokenize]")]
    assert len(lines) >= 5  # one per 100k-character chunk, and the final one
    assert all(k in lines[0] for k in ("documents |", "tokens |", "MB/s", "tokens/s", "ETA"))
    assert "ETA ?" not in lines[1] and "%)" in lines[1]  # the files' bytes give the share done
    assert 0 < fractions[0] < fractions[-2] <= 1 and lines[-1].split("ETA ")[1].startswith("0:00:00")


def test_file_digest_is_remembered_by_stat_and_recomputed_after_a_change(tmp_path):
    import os

    from outlierlab.datamodules.corpus import corpus_identity

    f = tmp_path / "a.txt"
    f.write_text("one\ntwo\n")
    memo = tmp_path / "memo"
    plain = corpus_identity("files", [str(f)])
    assert corpus_identity("files", [str(f)], memo_dir=memo) == plain  # the same id as without a memo
    (entry,) = memo.glob("*.json")
    entry.write_text(entry.read_text().replace(json.loads(entry.read_text())["sha256"], "0" * 64))
    assert corpus_identity("files", [str(f)], memo_dir=memo) != plain  # read from the memo, not the file
    f.write_text("one\nchanged\n")
    os.utime(f, ns=(1, 1))  # a new stat: size/mtime differ, so the digest is computed from the bytes
    assert corpus_identity("files", [str(f)], memo_dir=memo) == corpus_identity("files", [str(f)]) != plain


def test_sampler_int32_permutation_is_the_int64_one_of_earlier_versions():
    from outlierlab.datamodules.sampler import ResumableSampler

    for n, world in ((10, 1), (1001, 2), (70_001, 3)):
        for rank in range(world):
            s = ResumableSampler(n, batch_size=4, seed=9, rank=rank, world_size=world)
            g = torch.Generator().manual_seed(9 + 2)
            order = torch.randperm(n, generator=g).tolist()  # earlier versions: int64, a list
            total = len(s) * world
            order += order[: total - n]
            s.set_epoch(2)
            assert list(s) == order[rank:total:world]


def test_training_corpus_check_streams_and_runs_once_per_file_version(tmp_path, monkeypatch, compose_cfg):
    import os

    from outlierlab.datamodules import validation

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one\n\ntwo\nthree\n")
    cfg = compose_cfg("train", ["data=files", f"data.files=[{corpus}]", f"data.cache_dir={tmp_path / 'cache'}"])
    calls = []
    real = validation.count_text_lines
    monkeypatch.setattr(validation, "count_text_lines", lambda *a: calls.append(a) or real(*a))
    validation.validate_inputs(cfg, "train")
    validation.validate_inputs(cfg, "train")  # the same file version: not read again
    assert len(calls) == 1 and real(corpus, "data.files") == 3
    corpus.write_bytes(b"one\n\xff\xfe bad\n")
    os.utime(corpus, ns=(1, 1))
    with pytest.raises(validation.DataFileError, match=r"line 2 is not UTF-8 \(byte 0xff at column 1\)"):
        validation.validate_inputs(cfg, "train")


@pytest.mark.parametrize("streaming", [True, False])
def test_a_hub_dataset_builds_the_same_token_file_as_the_files(tmp_path, streaming):
    src = tmp_path / "docs.txt"
    src.write_text("\n".join(load_embedded_texts(max_documents=300)) + "\n")
    files = datamodule(tmp_path / "c", source="files", files=[str(src)], max_documents=None)
    hub = datamodule(tmp_path / "c", source="hub", max_documents=None if not streaming else 10_000,
                     hub={"path": "text", "name": None, "data_files": [str(src)], "streaming": streaming})
    assert hub.token_meta["documents"] == files.token_meta["documents"] == 300
    assert hub.blocks_path != files.blocks_path  # another corpus identity ...
    assert (hub.blocks_path / "tokens.bin").read_bytes() == (files.blocks_path / "tokens.bin").read_bytes()
