"""Pack tokenized documents into fixed-length MLM blocks without padding waste (fairseq / HF ``run_mlm`` style).

Layout of every block (``block_size`` = B tokens)::

    <s> t_1 t_2 ... t_{B-1}

where ``t`` runs through the *stream*: all documents concatenated, each followed by ``</s>``.  So position 0
ALWAYS carries ``<s>`` -- also when a block starts in the middle of a document.  This is deliberate: the
position artefacts Luo et al. (2021) study (an outlier-laden first position, position information
recoverable from every layer) are tied to a fixed token at position 0, as in RoBERTa pretraining; a block
that started with an arbitrary mid-sentence token would change that experiment.

Only the last block can be short: it is right-padded with ``<pad>`` (``attention_mask`` 0) so that no stream
token is dropped.  Hence ``sum(attention_mask) - n_blocks == len(stream)`` exactly.

Why by hand: ``transformers``' ``group_texts`` recipe drops the remainder of every ``map`` batch and adds no
``<s>``; this is ~15 lines of numpy and is exact over the whole stream.

Training does not hold packed blocks: ``outlierlab.datamodules.token_blocks.TokenBlocks`` cuts exactly these
blocks from the memory-mapped token stream when they are read.  ``pack_blocks`` is the in-memory definition
of the layout (the reference the tests hold the memory-mapped blocks to) for streams that fit in memory.
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
    """Cut ``stream`` into blocks of ``<s>`` + the next ``block_size - 1`` stream tokens.

    Parameters
    ----------
    stream : 1-d int array
        Concatenated documents with ``</s>`` after each (see ``build_stream``).
    block_size : int
        Tokens per block including the leading ``<s>``; must be >= 2.
    bos_id, pad_id : int
        Ids of ``<s>`` and ``<pad>``.

    Returns
    -------
    input_ids : int32 array (n_blocks, block_size)
    attention_mask : int8 array (n_blocks, block_size)
        1 for ``<s>`` and stream tokens, 0 for the right padding of the last block.
    """
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
