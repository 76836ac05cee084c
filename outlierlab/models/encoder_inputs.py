"""Texts to a frozen encoder's inputs (``outlierlab.models.loading.FrozenEncoder``): token ids truncated to the
model's length with what truncation removed counted (``Tokenized``), padded batches, and what one encoded batch
holds (``EncodedBatch``)."""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import torch
from torch import Tensor

log = logging.getLogger(__name__)


class EncodedBatch(NamedTuple):
    """One batch of ``FrozenEncoder.encode``.

    hidden : Tensor[L+1, B, T, d] float32 (embedding output + every layer)
    attention_mask, special_tokens_mask, input_ids : Tensor[B, T] (int64; padding has attention 0)
    index : Tensor[B] position of each row in the ``texts`` given to ``FrozenEncoder.encode``
    layers : with ``batches(layerwise=True)``: ``layers(fn)`` runs the forward and feeds ``fn(layer, [B, T, d])``
        one layer at a time (``hidden`` is then None)
    """

    hidden: Tensor | None
    attention_mask: Tensor
    special_tokens_mask: Tensor
    input_ids: Tensor
    index: Tensor
    layers: Callable | None = None


@dataclass
class Tokenized:
    """Unpadded token ids of many texts (after truncation) and what truncation removed."""

    input_ids: list[list[int]]
    special_tokens_mask: list[list[int]]
    n_truncated: int = 0  # sequences longer than max_length
    truncated_tokens: int = 0  # tokens removed by truncation
    offsets: list[list[tuple[int, int]]] | None = None  # character span of each token (fast tokenizers)

    @property
    def lengths(self) -> list[int]:
        return [len(x) for x in self.input_ids]


def tokenizer_fingerprint(tok) -> str:
    """A short hash of what defines the tokenizer (its vocabulary, rules and special tokens): a key of cached features."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()
    else:  # slow tokenizer: the vocabulary and the special tokens define it
        text = json.dumps(sorted(tok.get_vocab().items()))
    text += json.dumps([type(tok).__name__, tok.all_special_tokens, getattr(tok, "do_lower_case", None)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def report_truncation(what: str, n_truncated: int, n_texts: int, truncated_tokens: int, max_length: int) -> str | None:
    """The one line that says what truncation removed, the same for every pass (evaluate's stream, probe's features,
    a direct ``FrozenEncoder.tokenize``): logged as a warning and returned (for a report's notes); None when nothing
    was truncated."""
    if not n_truncated:
        return None
    line = (f"{what}: {n_truncated} of {n_texts} texts were longer than max_length={max_length} tokens and were truncated "
            f"({truncated_tokens} tokens dropped)")
    log.warning(line)
    return line


def tokenize_texts(tokenizer, texts: Sequence[str], max_length: int, on_overflow: str, report: bool = True) -> Tokenized:
    """Token ids (with special tokens) of every text, truncated to ``max_length``.

    One tokenizer call over all texts (ids, special-token mask and, with a fast tokenizer, character
    offsets); only the texts found longer than ``max_length`` are tokenized again, with truncation — the
    same ids as truncating every text, at a third of the tokenizer's time.  ``report``: say what truncation removed
    (``report_truncation``); a pass that tokenizes in chunks passes False and reports once for all of them.
    """
    texts = list(texts)
    fast = bool(getattr(tokenizer, "is_fast", False))
    kw = dict(add_special_tokens=True, return_special_tokens_mask=True, return_offsets_mapping=fast)
    enc = tokenizer(texts, truncation=False, verbose=False, **kw)
    ids, special = enc["input_ids"], enc["special_tokens_mask"]
    offsets = enc["offset_mapping"] if fast else None
    over = [i for i, row in enumerate(ids) if len(row) > max_length]
    if over and on_overflow == "error":
        raise ValueError(f"{len(over)} of {len(texts)} texts exceed max_length={max_length} tokens "
                         f"(first: #{over[0]}, {len(ids[over[0]])} tokens); shorten them or set "
                         "encoder.on_overflow=warn to truncate")
    cut = 0
    if over:
        short = tokenizer([texts[i] for i in over], truncation=True, max_length=max_length, **kw)
        for j, i in enumerate(over):
            cut += len(ids[i]) - len(short["input_ids"][j])
            ids[i], special[i] = short["input_ids"][j], short["special_tokens_mask"][j]
            if fast:
                offsets[i] = short["offset_mapping"][j]
        if report:
            report_truncation("tokenize", len(over), len(texts), cut, max_length)
    offsets = [[tuple(o) for o in row] for row in offsets] if fast else None
    return Tokenized(ids, special, len(over), cut, offsets)


def padded(tokenized: Tokenized, rows: list[int], pad_id: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(input_ids, attention_mask, special_tokens_mask)`` ``[B, T]`` of ``rows``, right-padded to the longest;
    padding counts as special (the Hugging Face convention)."""
    t = max(len(tokenized.input_ids[i]) for i in rows)
    ids = torch.full((len(rows), t), pad_id, dtype=torch.long)
    attn = torch.zeros(len(rows), t, dtype=torch.long)
    special = torch.ones(len(rows), t, dtype=torch.long)
    for b, i in enumerate(rows):
        n = len(tokenized.input_ids[i])
        ids[b, :n] = torch.tensor(tokenized.input_ids[i])
        attn[b, :n] = 1
        special[b, :n] = torch.tensor(tokenized.special_tokens_mask[i])
    return ids, attn, special
