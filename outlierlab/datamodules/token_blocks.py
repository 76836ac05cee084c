"""MLM blocks cut from the memory-mapped token stream when they are read: nothing is packed or stored per block.

Block ``i`` of size ``B`` is ``<s>`` followed by stream tokens ``[i (B-1), (i+1) (B-1))`` -- RoBERTa's FULL-SENTENCES
packing with ``<s>`` at position 0, as Luo et al. (2021) study it; the reference is
``pack_blocks`` of tests/packing_fixtures.py.  Only the last block is short: right-padded, its attention mask derived.
Every process maps the same ``token_cache`` file, and the OS keeps one copy in its page cache.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from .token_cache import open_tokens


class TokenBlocks:
    """Fixed-size ``<s>``-led blocks over a token file (``path`` with ``tokens.bin``; ``meta`` its ``meta.json``), read
    on demand; ``block_size`` ≥ 2 includes ``<s>``; ``limit``: the first blocks only.  The memory map is opened lazily
    per process and dropped when pickled, so the stream is never copied."""

    def __init__(self, path: Path, meta: dict[str, Any], block_size: int, bos_id: int, pad_id: int,
                 limit: int | None = None) -> None:
        if block_size < 2:
            raise ValueError(f"data.block_size must be >= 2 (<s> plus at least one text token), got {block_size}")
        self.path, self.meta, self.block_size = Path(path), meta, int(block_size)
        self.bos_id, self.pad_id = int(bos_id), int(pad_id)
        self.n_tokens = int(meta["tokens"])
        n = -(-self.n_tokens // (self.block_size - 1))  # ceil: no stream token is dropped
        self.n_blocks = n if limit is None else min(n, int(limit))
        self._stream: np.ndarray | None = None

    @property
    def stream(self) -> np.ndarray:
        if self._stream is None:
            self._stream = open_tokens(self.path, self.meta)
        return self._stream

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_stream": None}

    def __len__(self) -> int:
        return self.n_blocks

    def block(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids int32 [B], attention_mask int8 [B])`` of block ``i``."""
        if not 0 <= i < self.n_blocks:
            raise IndexError(f"block {i} out of range ({self.n_blocks} blocks)")
        body = self.block_size - 1
        part = self.stream[i * body : (i + 1) * body]
        ids = np.full(self.block_size, self.pad_id, dtype=np.int32)
        ids[0] = self.bos_id
        ids[1 : 1 + len(part)] = part
        mask = np.zeros(self.block_size, dtype=np.int8)
        mask[: 1 + len(part)] = 1
        return ids, mask

    def arrays(self, rows=None) -> tuple[np.ndarray, np.ndarray]:
        """``(input_ids, attention_mask)`` of ``rows`` (default all blocks) stacked in memory: for inspection and
        tests on small corpora -- it holds ``rows x block_size x 5`` bytes."""
        rows = range(self.n_blocks) if rows is None else rows
        pairs = [self.block(int(r)) for r in rows]
        if not pairs:
            return np.zeros((0, self.block_size), np.int32), np.zeros((0, self.block_size), np.int8)
        return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])

    @property
    def pad_tokens(self) -> int:
        """Right padding of the stream's final block (0 if it is full or cut off by ``limit``)."""
        body = self.block_size - 1
        last = -(-self.n_tokens // body) - 1
        return body - (self.n_tokens - last * body) if 0 <= last < self.n_blocks else 0

    def real_tokens(self, rows: np.ndarray) -> int:
        """Non-padding tokens of ``rows`` (``<s>`` included), from the counts alone: no token is read."""
        rows = np.asarray(rows)
        last = -(-self.n_tokens // (self.block_size - 1)) - 1  # the only block that can be padded
        return len(rows) * self.block_size - (self.pad_tokens if (rows == last).any() else 0)


class BlockDataset(Dataset):
    """Blocks ``rows`` of a ``TokenBlocks``; items carry their global block index for mask seeding."""

    def __init__(self, blocks: TokenBlocks, rows: np.ndarray) -> None:
        self.blocks, self.rows = blocks, rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        r = int(self.rows[i])
        ids, mask = self.blocks.block(r)
        return {"index": r, "input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}

    def real_tokens(self) -> int:
        """Non-padding tokens in these rows: what one epoch over this split trains on."""
        return self.blocks.real_tokens(self.rows)


class ResumableDataLoader(DataLoader):
    """A DataLoader Lightning recognises as resumable.  The data position lives in ``MLMDataModule.state_dict`` (applied
    to the sampler), so these methods are no-ops that stop Lightning's warning."""

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass
