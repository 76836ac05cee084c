"""Packing of documents into <s>-led blocks, the train/val split, and the resumable sampler."""
from __future__ import annotations

import numpy as np
import pytest

from packing_fixtures import build_stream, pack_blocks
from outlierlab.datamodules.sampler import ResumableSampler


# ------------------------------------------------------------------------------------------------ packing
def test_pack_hand_computed():
    stream = build_stream([[10, 11], [12]], eos_id=2)
    assert stream.tolist() == [10, 11, 2, 12, 2]
    ids, mask = pack_blocks(stream, block_size=3, bos_id=0, pad_id=1)
    assert ids.tolist() == [[0, 10, 11], [0, 2, 12], [0, 2, 1]]
    assert mask.tolist() == [[1, 1, 1], [1, 1, 1], [1, 1, 0]]


def test_pack_exact_multiple_has_no_padding():
    ids, mask = pack_blocks(np.arange(10, 16), block_size=4, bos_id=0, pad_id=1)
    assert ids.tolist() == [[0, 10, 11, 12], [0, 13, 14, 15]]
    assert mask.min() == 1


@pytest.mark.parametrize("block_size", [2, 7, 128])
def test_pack_keeps_every_token_once_in_order(block_size):
    rng = np.random.default_rng(block_size)
    docs = [rng.integers(5, 1000, size=int(rng.integers(1, 300))) for _ in range(60)]
    stream = build_stream(docs, eos_id=2)
    ids, mask = pack_blocks(stream, block_size, bos_id=0, pad_id=1)
    assert (ids[:, 0] == 0).all() and (mask[:, 0] == 1).all()  # every block starts with <s>
    assert (ids == 0).sum() == len(ids)  # ... and <s> appears nowhere else
    # Token count: non-<s>, non-pad tokens == stream tokens (documents + one </s> each).
    assert int(mask.sum()) - len(ids) == len(stream) == sum(len(d) + 1 for d in docs)
    # Nothing duplicated or reordered: the block bodies read back as the stream.
    assert ids[:, 1:][mask[:, 1:] == 1].tolist() == stream.tolist()
    assert (mask[:-1] == 1).all() and (ids[mask == 0] == 1).all()  # only the last block is padded
    assert (mask == 0).sum() < block_size - 1


def test_datamodule_blocks_decode_back_to_the_documents(tmp_path):
    from outlierlab.datamodules.corpus import load_embedded_texts
    from outlierlab.datamodules.mlm_datamodule import MLMDataModule

    docs = load_embedded_texts(max_documents=200)
    dm = MLMDataModule(source="embedded", max_documents=200, tokenizer={"vocab_size": 600}, block_size=64,
                       batch_size=8, val_fraction=0.1, cache_dir=str(tmp_path))
    dm.prepare_data()
    dm.setup("fit")
    tok = dm.tokenizer
    table, mask = dm.train_dataset.blocks.arrays()  # every block, cut from the memory-mapped token file
    assert (table[:, 0] == tok.bos_token_id).all()
    stream = table[:, 1:][mask[:, 1:] == 1]
    expected = sum(len(tok(d, add_special_tokens=False)["input_ids"]) + 1 for d in docs)
    assert len(stream) == expected == dm.stats["stream_tokens"]
    assert dm.stats["blocks"] == len(table) == -(-expected // 63)
    # Split the stream at </s>: the decoded pieces are exactly the documents, in order.
    cuts = np.flatnonzero(stream == tok.eos_token_id)
    pieces = np.split(stream, cuts + 1)[:-1]
    assert [tok.decode(p[:-1]) for p in pieces] == docs


def test_split_is_disjoint_complete_and_seeded(tmp_path):
    from outlierlab.datamodules.mlm_datamodule import MLMDataModule

    def rows(seed):
        dm = MLMDataModule(max_documents=150, tokenizer={"vocab_size": 500}, block_size=32, val_fraction=0.1,
                           seed=seed, cache_dir=str(tmp_path))
        dm.setup("fit")
        return set(dm.train_dataset.rows.tolist()), set(dm.val_dataset.rows.tolist()), dm.stats["blocks"]

    train, val, n = rows(0)
    assert not train & val and train | val == set(range(n))
    assert len(val) == round(0.1 * n)
    assert rows(0)[1] == val and rows(1)[1] != val


# ------------------------------------------------------------------------------------------------ sampler
def test_sampler_epoch_is_a_seeded_permutation():
    s = ResumableSampler(50, batch_size=8, seed=3)
    e0 = list(s)
    s.set_epoch(1)
    e1 = list(s)
    assert sorted(e0) == sorted(e1) == list(range(50))
    assert e0 != e1
    assert list(ResumableSampler(50, batch_size=8, seed=3)) == e0
    assert list(ResumableSampler(50, batch_size=8, seed=4)) != e0
    assert list(ResumableSampler(5, batch_size=2, shuffle=False)) == [0, 1, 2, 3, 4]


def test_sampler_shards_ranks_like_distributed_sampler():
    shards = [list(ResumableSampler(10, batch_size=2, seed=0, rank=r, world_size=3)) for r in range(3)]
    assert all(len(s) == 4 for s in shards)  # ceil(10 / 3), padded by wrapping
    full = list(ResumableSampler(10, batch_size=2, seed=0))
    padded = full + full[:2]
    assert shards == [padded[r::3] for r in range(3)]
    assert set().union(*shards) == set(range(10))


@pytest.mark.parametrize("k", [0, 1, 3])  # 13 indices per rank = 4 batches
def test_sampler_resumed_after_k_batches_yields_the_remaining_order(k):
    bs = 4
    straight = ResumableSampler(26, batch_size=bs, seed=7, rank=1, world_size=2)
    straight.set_epoch(2)
    order = list(straight)
    resumed = ResumableSampler(26, batch_size=bs, seed=7, rank=1, world_size=2)
    resumed.load_state_dict({"epoch": 2, "batches_consumed": k})
    resumed.set_epoch(2)  # as the trainer does at the start of the resumed epoch
    assert list(resumed) == order[k * bs:]
    # the next epoch is complete again
    resumed.set_epoch(3)
    straight.set_epoch(3)
    assert list(resumed) == list(straight)


def test_sampler_aligns_to_a_trainer_epoch_counter_that_runs_ahead():
    # Lightning resumes a max_steps run one epoch "ahead" of the data epoch (see sampler docstring).
    ref = ResumableSampler(20, batch_size=4, seed=1)
    resumed = ResumableSampler(20, batch_size=4, seed=1)
    resumed.load_state_dict({"epoch": 0, "batches_consumed": 2})
    resumed.set_epoch(1)  # trainer's counter
    assert resumed.epoch == 0 and list(resumed) == list(ref)[8:]
    resumed.set_epoch(2)
    ref.set_epoch(1)
    assert resumed.epoch == 1 and list(resumed) == list(ref)


def test_sampler_complete_epoch_rolls_over_or_yields_nothing():
    s = ResumableSampler(12, batch_size=4, seed=0)
    s.load_state_dict({"epoch": 3, "batches_consumed": 3}, roll_over=True)
    assert s.epoch == 4 and list(s) == s._epoch_order(4).tolist()
    s.load_state_dict({"epoch": 3, "batches_consumed": 3}, roll_over=False)
    assert list(s) == []


def test_sampler_counts_consumed_batches_without_a_trainer():
    s = ResumableSampler(20, batch_size=4, seed=0)
    it = iter(s)
    for _ in range(9):
        next(it)
    assert s.state_dict() == {"epoch": 0, "batches_consumed": 2}
    assert s.state_dict(batches_consumed=5)["batches_consumed"] == 5


def test_train_loader_shards_by_trainer_rank(tmp_path):
    from types import SimpleNamespace

    from outlierlab.datamodules.mlm_datamodule import MLMDataModule

    shards = []
    for rank in range(2):
        dm = MLMDataModule(max_documents=150, tokenizer={"vocab_size": 500}, block_size=32, batch_size=4,
                           val_blocks=3, cache_dir=str(tmp_path))
        dm.setup("fit")
        dm.trainer = SimpleNamespace(global_rank=rank, world_size=2, max_steps=-1)  # what Lightning exposes
        loader = dm.train_dataloader()
        shards.append([int(dm.train_dataset.rows[i]) for i in loader.sampler])
        n_train = len(dm.train_dataset)
    assert len(shards[0]) == len(shards[1]) == -(-n_train // 2)
    assert set(shards[0]) | set(shards[1]) == set(dm.train_dataset.rows.tolist())
    assert len(set(shards[0]) & set(shards[1])) == 2 * len(shards[0]) - n_train  # only the wrap-padding repeats
