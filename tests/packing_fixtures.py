"""Pack tokenized documents into fixed-length MLM blocks without padding waste (fairseq / HF ``run_mlm`` style).

Layout of every block (``block_size`` = B tokens)::

    <s> t_1 t_2 ... t_{B-1}

where ``t`` runs through the *stream*: all documents concatenated, each followed by ``</s>``.  Position 0 ALWAYS carries
``<s>``, also mid-document: the position artefacts Luo et al. (2021) study are tied to a fixed token at position 0, as
in RoBERTa pretraining.  Only the last block is right-padded (``attention_mask`` 0), so no token is dropped:
``sum(attention_mask) - n_blocks == len(stream)``.  (``transformers``' ``group_texts`` drops every batch's remainder and
adds no ``<s>``.)

Training cuts these blocks from the memory-mapped stream (``outlierlab.datamodules.token_blocks.TokenBlocks``);
``pack_blocks`` is the in-memory definition the tests hold it to.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np


def build_stream(documents: Iterable[Iterable[int]], eos_id: int) -> np.ndarray:
    """Concatenate token-id documents, each followed by ``eos_id``, into one int32 stream."""
    parts = []
    eos = np.array([eos_id], dtype=np.int32)
    for doc in documents:
        parts.append(np.asarray(doc, dtype=np.int32))
        parts.append(eos)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def pack_blocks(stream: np.ndarray, block_size: int, bos_id: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut ``stream`` (1-d ints, ``</s>`` after each document) into blocks of ``<s>`` + the next ``block_size - 1`` (≥
    1) tokens: ``input_ids`` int32 and ``attention_mask`` int8 ``(n_blocks, block_size)``, the mask 0 on the last
    block's right padding."""
    if block_size < 2:
        raise ValueError(f"data.block_size must be >= 2 (<s> plus at least one text token), got {block_size}")
    stream = np.asarray(stream, dtype=np.int32).reshape(-1)
    body = block_size - 1
    n_blocks = -(-len(stream) // body)  # ceil
    filled = np.full(n_blocks * body, pad_id, dtype=np.int32)
    filled[: len(stream)] = stream
    input_ids = np.empty((n_blocks, block_size), dtype=np.int32)
    input_ids[:, 0] = bos_id
    input_ids[:, 1:] = filled.reshape(n_blocks, body)
    attention_mask = np.ones((n_blocks, block_size), dtype=np.int8)
    n_pad = n_blocks * body - len(stream)
    if n_pad:
        attention_mask[-1, block_size - n_pad :] = 0
    return input_ids, attention_mask
