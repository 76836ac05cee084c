"""A synthetic task whose answer depends on word order only: ``data=order_task``.

Each block is ``<s>`` and ``block_size - 1`` symbols drawn uniformly from ``num_symbols`` ids.  At *copy positions* the
symbol equals the one ``offset`` places to its left; a masked LM sees them as ``<mask>`` and predicts them, a causal LM
predicts them as next tokens (loss on those positions only).  No source is itself a copy position, so the answer is
always an unmasked token.

A bag-of-words model can at best spread its prediction over the block's symbols (about ln(distinct symbols) nats), while
any model attending to offset ``-offset`` solves it; a scheme whose path to attention is broken stays at the
bag-of-words loss (docs/order_use.md).  A diagnostic, not language.  Blocks are generated from ``(seed, split, index)``:
no files, and a resumed run sees exactly the batches of an uninterrupted one.
"""

from __future__ import annotations

import lightning as L
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

__all__ = ["OrderTaskDataModule", "OrderTaskBlocks", "order_task_tokenizer", "make_block"]

_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>"]  # RoBERTa's ids 0..3; <mask> is the last id, as in RoBERTa


def order_task_tokenizer(num_symbols: int, max_len: int):
    """A word-level tokenizer over ``s0 .. s{num_symbols-1}`` with RoBERTa's special tokens, so that a model trained
    on the task exports, probes and evaluates like any other run (``<s> ... </s>`` post-processing)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_SPECIALS)}
    vocab.update({f"s{i}": len(_SPECIALS) + i for i in range(num_symbols)})
    vocab["<mask>"] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", mask_token="<mask>", cls_token="<s>", sep_token="</s>",
                                   model_max_length=max_len)


def make_block(generator: torch.Generator, block_size: int, num_symbols: int, offset: int, copy_rate: float,
               mask_id: int | None) -> dict[str, Tensor]:
    """One block: ``input_ids`` (with ``<mask>`` at the copy positions when ``mask_id`` is given: the masked
    objective) and ``labels`` (the copied symbol at copy positions, -100 elsewhere)."""
    ids = torch.randint(len(_SPECIALS), len(_SPECIALS) + num_symbols, (block_size,), generator=generator)
    ids[0] = 0  # <s>
    copy = torch.rand(block_size, generator=generator) < copy_rate
    copy[: 1 + offset] = False  # the source must be a symbol, not <s> or outside the block
    for i in range(1 + offset, block_size):  # left to right: a copy position's source is never a copy position
        if copy[i] and copy[i - offset]:
            copy[i] = False
    ids = torch.where(copy, ids.roll(offset), ids)
    labels = torch.where(copy, ids, torch.full_like(ids, -100))
    if mask_id is not None:
        ids = torch.where(copy, torch.full_like(ids, mask_id), ids)
    return {"input_ids": ids, "labels": labels}


class OrderTaskBlocks(Dataset):
    """``length`` blocks of the order task; block ``i`` of a split is drawn from its own seeded generator."""

    def __init__(self, length: int, seed: int, split: int, block_size: int, num_symbols: int, offset: int,
                 copy_rate: float, mask_id: int | None) -> None:
        self.length, self.seed, self.split = int(length), int(seed), int(split)
        self.kwargs = dict(block_size=block_size, num_symbols=num_symbols, offset=offset, copy_rate=copy_rate,
                           mask_id=mask_id)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        g = torch.Generator().manual_seed((self.seed * 1_000_003 + self.split * 7_919 + int(index)) % 2**63)
        return make_block(g, **self.kwargs)


class OrderTaskDataModule(L.LightningDataModule):
    """The order task as train/validation dataloaders, with the interface train.py reads from any data module
    (``tokenizer``, ``block_size``, ``batch_size``, ``stats``).

    num_symbols : distinct symbols (200: a bag-of-words model sits near ln(~55 distinct symbols per block) nats).
    block_size : tokens per block, ``<s>`` included (64); offset : the copy distance (2). copy_rate : share of positions
    drawn as copies before the no-chained-copies rule (0.15, BERT's masking rate). objective : ``mlm`` (copies are
    ``<mask>`` and predicted) or ``clm`` (predicted as next tokens, unmasked). train_blocks, val_blocks : blocks per
    epoch (generated on the fly) and in the fixed validation split.
    """

    def __init__(self, num_symbols: int = 200, block_size: int = 64, offset: int = 2, copy_rate: float = 0.15,
                 objective: str = "mlm", batch_size: int = 32, train_blocks: int = 320_000, val_blocks: int = 256,
                 seed: int = 0, num_workers: int = 0, **ignored) -> None:
        super().__init__()
        if objective not in ("mlm", "clm"):
            raise ValueError(f"data.objective={objective!r}: the order task knows mlm and clm")
        if not 1 <= int(offset) < int(block_size) - 1:
            raise ValueError(f"data.offset={offset} must lie in 1..block_size-2={int(block_size) - 2}")
        if int(num_symbols) < 2 or not 0.0 < float(copy_rate) < 1.0:
            raise ValueError("data.num_symbols must be >= 2 and data.copy_rate in (0, 1)")
        self.num_symbols, self.block_size, self.offset = int(num_symbols), int(block_size), int(offset)
        self.copy_rate, self.objective, self.batch_size = float(copy_rate), objective, int(batch_size)
        self.train_blocks, self.val_blocks, self.seed = int(train_blocks), int(val_blocks), int(seed)
        self.num_workers = int(num_workers)
        self.tokenizer = order_task_tokenizer(self.num_symbols, self.block_size)
        self.stats = {"train_blocks": self.train_blocks, "train_tokens": self.train_blocks * self.block_size}

    def _blocks(self, split: int, length: int) -> OrderTaskBlocks:
        mask_id = self.tokenizer.mask_token_id if self.objective == "mlm" else None
        return OrderTaskBlocks(length, self.seed, split, self.block_size, self.num_symbols, self.offset,
                               self.copy_rate, mask_id)

    def train_dataloader(self) -> DataLoader:
        # Lightning reseeds this generator's sampler from the global seed; resume restores its position.
        return DataLoader(self._blocks(0, self.train_blocks), batch_size=self.batch_size, shuffle=True,
                          num_workers=self.num_workers, drop_last=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self._blocks(1, self.val_blocks), batch_size=self.batch_size, shuffle=False,
                          num_workers=self.num_workers)
