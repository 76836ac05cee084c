"""Packed MLM blocks on disk: build once per (corpus, tokenizer, block size), load, and serve as a Dataset.

The layout (Liu et al. 2019, RoBERTa's FULL-SENTENCES packing, with ``<s>`` at position 0 of every block as
Luo et al. 2021 study it) is made by :func:`outlierlab.datamodules.packing.pack_blocks`; this module owns the cache:
``<cache_dir>/blocks/b<block_size>-<hash>`` saved with ``datasets.Dataset.save_to_disk`` plus ``meta.json``
(corpus and token counts), written to a temporary name and renamed, so a crash never leaves a half cache.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Callable

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from filelock import FileLock
from torch.utils.data import DataLoader, Dataset

from .packing import pack_blocks
from .tokenizer import tokenizer_fingerprint

log = logging.getLogger(__name__)

PACKING_VERSION = "bos-stream-eos-v1"  # bump when the block layout changes, to invalidate caches


def blocks_cache_path(cache_dir: Path, corpus_id: str, tokenizer, block_size: int) -> Path:
    """Where the blocks of this (corpus, tokenizer, block size) live; the hash keys all three."""
    key = json.dumps({"v": PACKING_VERSION, "corpus": corpus_id, "tok": tokenizer_fingerprint(tokenizer),
                      "block_size": block_size}, sort_keys=True)
    return cache_dir / "blocks" / f"b{block_size}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def ensure_blocks(path: Path, build: Callable[[Path], None]) -> bool:
    """Run ``build(path)`` unless ``path`` holds finished blocks; one process builds, others wait.

    Returns
    -------
    bool
        True if this call built the blocks.
    """
    if (path / "meta.json").is_file():
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if (path / "meta.json").is_file():  # another process built them while we waited
            return False
        build(path)
        return True


def build_blocks(texts: list[str], tok, ids: dict, path: Path, block_size: int, meta: dict[str, Any]) -> None:
    """Tokenise ``texts`` (``</s>`` after each document), pack into blocks and save them at ``path``.

    ``meta`` (corpus identity, source) is stored in ``meta.json`` together with the counts.
    """
    eos = ids["eos"]

    def tokenize(batch: dict) -> dict:
        enc = tok(batch["text"], add_special_tokens=False, verbose=False)["input_ids"]
        return {"input_ids": [e + [eos] for e in enc]}

    docs = datasets.Dataset.from_dict({"text": texts})
    tokenized = docs.map(tokenize, batched=True, batch_size=1000, remove_columns=["text"],
                         desc="tokenize", keep_in_memory=True)
    stream = pc.list_flatten(tokenized.data.column("input_ids")).to_numpy().astype(np.int32)
    input_ids, attention_mask = pack_blocks(stream, block_size, ids["bos"], ids["pad"])
    table = pa.table({
        "input_ids": pa.FixedSizeListArray.from_arrays(pa.array(input_ids.reshape(-1)), block_size),
        "attention_mask": pa.FixedSizeListArray.from_arrays(pa.array(attention_mask.reshape(-1)), block_size),
    })
    meta = {**meta, "documents": len(texts), "characters": sum(len(t) for t in texts),
            "stream_tokens": int(len(stream)), "blocks": int(len(input_ids)), "block_size": block_size,
            "pad_tokens": int((attention_mask == 0).sum()), "vocab_size": len(tok),
            "tokenizer": str(getattr(tok, "name_or_path", "")) or "bpe", "special_ids": ids}
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    datasets.Dataset(table).save_to_disk(str(tmp))
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    if path.exists():  # a broken earlier attempt
        shutil.rmtree(path)
    os.replace(tmp, path)
    log.info("packed %d documents -> %d blocks of %d tokens in %s", len(texts), len(input_ids), block_size, path)


def load_blocks(path: Path, block_size: int, limit: int | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(input_ids, attention_mask, meta)`` of saved blocks, arrays of shape ``(n_blocks, block_size)``."""
    table = datasets.load_from_disk(str(path)).data
    input_ids = table.column("input_ids").combine_chunks().flatten().to_numpy().reshape(-1, block_size)
    attention_mask = table.column("attention_mask").combine_chunks().flatten().to_numpy().reshape(-1, block_size)
    if limit is not None:
        input_ids, attention_mask = input_ids[:limit], attention_mask[:limit]
    return input_ids, attention_mask, json.loads((path / "meta.json").read_text())


class BlockDataset(Dataset):
    """Rows ``rows`` of the packed block table; items carry their global block index for mask seeding."""

    def __init__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: np.ndarray) -> None:
        self.input_ids, self.attention_mask, self.rows = input_ids, attention_mask, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        r = int(self.rows[i])
        return {"index": r, "input_ids": self.input_ids[r], "attention_mask": self.attention_mask[r]}

    def real_tokens(self) -> int:
        """Non-padding tokens in these rows: what one epoch over this split trains on."""
        return int(self.attention_mask[torch.from_numpy(np.asarray(self.rows, dtype=np.int64))].sum())


class ResumableDataLoader(DataLoader):
    """A DataLoader Lightning recognises as resumable (it has ``state_dict``/``load_state_dict``).

    The data position itself lives in :meth:`MLMDataModule.state_dict` (applied to the sampler before the
    loader is built), so these are no-ops; they only stop Lightning from warning that a mid-epoch resume
    is unreliable.
    """

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass
