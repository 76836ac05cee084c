"""MLM masking statistics (BERT/RoBERTa 15% and 80/10/10), determinism, and exact resume with a real Trainer."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from outlierlab.datamodules.masking import DeterministicMLMCollator, batch_seed

B, L = 32, 128


@pytest.fixture(scope="module")
def tokenizer():
    from outlierlab.datamodules.corpus import load_embedded_texts
    from outlierlab.datamodules.tokenizer import train_bpe_tokenizer

    return train_bpe_tokenizer(load_embedded_texts(max_documents=200), vocab_size=400)


def _examples(tok, start: int, rng: np.random.Generator, n: int = B) -> list[dict]:
    """Blocks like the packer makes: <s> at 0, text ids, some </s>; every 4th block ends in padding."""
    out = []
    for i in range(n):
        ids = rng.integers(5, len(tok), size=L)
        ids[0] = tok.bos_token_id
        ids[rng.choice(np.arange(1, L), size=6, replace=False)] = tok.eos_token_id
        mask = np.ones(L, dtype=np.int64)
        if i % 4 == 3:
            cut = int(rng.integers(10, L))
            ids[cut:], mask[cut:] = tok.pad_token_id, 0
        out.append({"index": start + i, "input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)})
    return out


def test_masking_rates_match_the_bert_recipe(tokenizer):
    collate = DeterministicMLMCollator(tokenizer, mlm_probability=0.15, seed=0)
    rng = np.random.default_rng(0)
    counts = dict(eligible=0, selected=0, masked=0, random=0, unchanged=0)
    for b in range(100):
        ex = _examples(tokenizer, b * B, rng)
        orig = torch.stack([e["input_ids"] for e in ex])
        att = torch.stack([e["attention_mask"] for e in ex])
        out = collate(ex)
        special = (orig < 5) | (att == 0)  # ids 0..4 are the special tokens; pads are id 1
        sel = out["labels"] != -100
        # never selected: specials and padding; they pass through unchanged
        assert not (sel & special).any()
        assert torch.equal(out["input_ids"][special], orig[special])
        # labels hold the original token at selected positions; unselected inputs are untouched
        assert torch.equal(out["labels"][sel], orig[sel])
        assert torch.equal(out["input_ids"][~sel], orig[~sel])
        assert torch.equal(out["attention_mask"], att)
        got = out["input_ids"][sel]
        counts["eligible"] += int((~special).sum())
        counts["selected"] += int(sel.sum())
        counts["masked"] += int((got == tokenizer.mask_token_id).sum())
        counts["unchanged"] += int((got == orig[sel]).sum())
        counts["random"] += int(((got != tokenizer.mask_token_id) & (got != orig[sel])).sum())
    n = counts["selected"]
    assert counts["eligible"] > 300_000
    assert abs(n / counts["eligible"] - 0.15) < 0.004  # ~7 standard errors
    assert abs(counts["masked"] / n - 0.80) < 0.01
    assert abs(counts["random"] / n - 0.10) < 0.01
    assert abs(counts["unchanged"] / n - 0.10) < 0.01


def test_masking_probability_is_configurable(tokenizer):
    rng = np.random.default_rng(1)
    ex = [e for b in range(10) for e in _examples(tokenizer, b * B, rng)]
    out = DeterministicMLMCollator(tokenizer, mlm_probability=0.4, seed=0)(ex)
    eligible = (torch.stack([e["input_ids"] for e in ex]) >= 5) & (out["attention_mask"] == 1)
    assert abs((out["labels"] != -100).sum().item() / eligible.sum().item() - 0.4) < 0.01


def test_masking_depends_only_on_seed_and_indices(tokenizer):
    collate = DeterministicMLMCollator(tokenizer, seed=5)
    ex = _examples(tokenizer, 0, np.random.default_rng(2))
    torch.manual_seed(0)
    a = collate(ex)
    torch.manual_seed(123)
    torch.rand(1000)  # unrelated RNG use in between must not matter
    state = torch.get_rng_state()
    b = collate(ex)
    assert torch.equal(torch.get_rng_state(), state)  # and the collator leaves the global RNG alone
    assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
    # another seed, or the same blocks under other indices, give another mask
    c = DeterministicMLMCollator(tokenizer, seed=6)(ex)
    shifted = [{**e, "index": e["index"] + 1000} for e in ex]
    d = collate(shifted)
    assert not torch.equal(a["labels"], c["labels"]) and not torch.equal(a["labels"], d["labels"])


def test_batch_seed_is_order_sensitive_and_stable():
    assert batch_seed(0, [1, 2, 3]) == batch_seed(0, [1, 2, 3])
    assert len({batch_seed(0, [1, 2, 3]), batch_seed(0, [3, 2, 1]), batch_seed(1, [1, 2, 3]),
                batch_seed(0, [1, 2])}) == 4
    assert 0 <= batch_seed(2**40, list(range(500))) < 2**63


# ------------------------------------------------------------------------------------ resume, real Trainer
@pytest.mark.parametrize("workers", [0, 2])
def test_resumed_training_sees_exactly_the_batches_of_a_straight_run(tmp_path, workers):
    """N steps straight == k steps, checkpoint, resume to N (data order AND masks), also across epochs; also when
    DataLoader workers mask the batches (what ``data.num_workers=auto`` gives on a GPU): their prefetching runs the
    sampler ahead of training, and the checkpoint must record the batches trained on, not the ones fetched."""
    import lightning as L

    from outlierlab.datamodules.mlm_datamodule import MLMDataModule

    class Recorder(L.LightningModule):
        def __init__(self, vocab):
            super().__init__()
            self.emb = torch.nn.Embedding(vocab, 4)
            self.seen = []

        def training_step(self, batch, batch_idx):
            self.seen.append((batch["input_ids"].clone(), batch["labels"].clone()))
            torch.rand(7)  # the model's own RNG use (dropout ...) must not shift the masks
            return self.emb(batch["input_ids"]).mean()

        def validation_step(self, batch, batch_idx):
            torch.rand(3)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def datamodule():  # 30 blocks, 2 for validation -> 28 train blocks = 7 batches per epoch
        return MLMDataModule(max_documents=300, tokenizer={"vocab_size": 400}, block_size=32, batch_size=4,
                             limit_blocks=30, val_blocks=2, cache_dir=str(tmp_path / "cache"), num_workers=workers)

    def fit(max_steps, ckpt=None, save=None):
        dm = datamodule()
        dm.prepare_data()
        dm.setup("fit")
        module = Recorder(dm.vocab_size)
        trainer = L.Trainer(max_steps=max_steps, use_distributed_sampler=False, val_check_interval=3,
                            num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
        trainer.fit(module, datamodule=dm, ckpt_path=ckpt)
        if save:
            trainer.save_checkpoint(save)
        return module.seen

    import warnings

    straight = fit(17)
    assert len(straight) == 17
    for k in (3, 7, 10) if workers == 0 else (3,):  # workers: one mid-epoch resume (each fit starts 2 processes)  # mid-epoch, exactly at the epoch end, in the second epoch
        ckpt = str(tmp_path / f"k{k}.ckpt")
        first = fit(k, save=ckpt)
        assert torch.load(ckpt, weights_only=False)["MLMDataModule"]["batches_consumed"] == (k - 1) % 7 + 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            rest = fit(17, ckpt=ckpt)
        assert not [w for w in caught if "not resumable" in str(w.message)]
        both = first + rest
        assert len(both) == 17
        for (ia, la), (ib, lb) in zip(both, straight):
            assert torch.equal(ia, ib) and torch.equal(la, lb)


@pytest.mark.parametrize("cores, devices, accelerator, expected", [
    (2, 1, "cpu", (0, False)),     # a CPU trainer collates in its own process
    (16, 1, "cuda", (2, True)),    # one GPU: two workers, pinned batches
    (16, 8, "cuda", (1, True)),    # eight DDP processes on 16 cores: 2 cores each, one for the worker
    (4, 4, "cuda", (0, True)),     # no spare core per process: collate in it
    (16, 1, None, (0, False)),     # no trainer (a datamodule used on its own)
])
def test_auto_loader_settings_follow_the_accelerator_and_the_cores(monkeypatch, cores, devices, accelerator, expected):
    from types import SimpleNamespace

    from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator

    from outlierlab.datamodules.mlm_datamodule import loader_settings

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    trainer = None if accelerator is None else SimpleNamespace(
        accelerator={"cpu": CPUAccelerator, "cuda": CUDAAccelerator}[accelerator](), num_devices=devices)
    assert loader_settings("auto", "auto", trainer) == expected
    assert loader_settings(3, False, trainer) == (3, False)  # given values are kept


@pytest.mark.parametrize("key, value, message", [
    ("num_workers", -1, "data.num_workers must be auto or an integer >= 0"),
    ("num_workers", "two", "data.num_workers must be auto or an integer >= 0"),
    ("num_workers", 1.5, "data.num_workers must be auto or an integer >= 0"),
    ("pin_memory", "yes", "data.pin_memory must be auto, true or false"),
])
def test_bad_loader_settings_are_refused_in_one_line(key, value, message):
    from outlierlab.datamodules.mlm_datamodule import MLMDataModule

    with pytest.raises(ValueError, match=message):
        MLMDataModule(**{key: value})
