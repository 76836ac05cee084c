"""Two CPU DDP ranks (gloo) share one memory-mapped token file and see disjoint batches.

A real Lightning DDP run (``strategy="ddp_fork"``: the ranks are forked from the test process, so they start in
a second) with a one-parameter model: what is tested is the data each rank reads.  Rank 0 builds the cache in
``prepare_data`` (Lightning calls it on local rank 0 only); rank 1 meets the finished file in ``setup``.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

pytestmark = pytest.mark.slow


def test_two_ddp_ranks_map_one_token_file_and_see_disjoint_batches(tmp_path):
    import lightning as L

    from outlierlab.datamodules.mlm_datamodule import MLMDataModule

    class Recording(MLMDataModule):
        """Writes, per rank, the block indices its collator saw and the file its blocks are mapped from."""

        def setup(self, stage=None):
            super().setup(stage)
            if hasattr(self, "seen"):  # setup runs again inside trainer.fit: wrap once
                return
            inner, self.seen = self.collator, []

            def collate(examples):
                self.seen.append([int(e["index"]) for e in examples])
                return inner(examples)

            self.collator = collate

        def dump(self, rank):
            stream = self.train_dataset.blocks.stream
            (tmp_path / f"rank{rank}.json").write_text(json.dumps({
                "batches": self.seen, "built": not self.cache_hits["blocks"], "mapped": str(stream.filename),
                "memmap": type(stream).__name__, "pid": os.getpid(), "train": self.train_dataset.rows.tolist()}))

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, _):
            assert set(batch) == {"input_ids", "attention_mask", "labels"}
            return (self.w * batch["input_ids"].float().mean()).sum() ** 2

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

        def on_train_end(self):
            self.trainer.datamodule.dump(self.global_rank)

    dm = Recording(max_documents=400, tokenizer={"vocab_size": 500}, block_size=32, batch_size=4, val_blocks=2,
                   cache_dir=str(tmp_path / "cache"), num_proc=1)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_fork", max_steps=5, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=False, limit_val_batches=0)
    trainer.fit(Tiny(), datamodule=dm)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0]["pid"] != ranks[1]["pid"]
    # one token file, memory-mapped by both ranks; built once (by rank 0, in prepare_data)
    assert ranks[0]["mapped"] == ranks[1]["mapped"] and {r["memmap"] for r in ranks} == {"memmap"}
    assert [r["built"] for r in ranks] == [True, False]
    assert len(list((tmp_path / "cache" / "tokens").glob("*/tokens.bin"))) == 1
    # five batches each, of disjoint blocks, all from the training split
    a, b = ([i for batch in r["batches"] for i in batch] for r in ranks)
    assert len(ranks[0]["batches"]) == len(ranks[1]["batches"]) == 5 and len(a) == len(b) == 20
    assert not set(a) & set(b) and set(a) | set(b) <= set(ranks[0]["train"])
