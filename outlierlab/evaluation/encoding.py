"""Encoding texts with a frozen encoder in bounded memory, each distinct text once.

:func:`iter_batches` tokenizes ``chunk`` texts at a time and yields batches of hidden states
``[L+1, B, T, d]``; :func:`distinct_texts` maps repeated texts (an STS file built from 50 documents has
1,225 pairs but 50 texts) to one encoding each, and :func:`encode_log_line` says how many were encoded.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import dataclass
from functools import partial
from typing import Callable, Iterator, NamedTuple, Sequence

from torch import Tensor

from outlierlab.analysis.outlier_stats import valid_token_mask
from outlierlab.utils.progress import progress_bar as make_bar

log = logging.getLogger(__name__)


class Batch(NamedTuple):
    """One encoded batch: ``hidden [L+1, B, T, d]`` (encoder device), ``valid [B, T]`` bool (non-special,
    non-pad, on the hidden's device), ``rows`` (index of each row in the texts given), ``texts`` (per row),
    ``offsets`` / ``special`` (per row character offsets and special-token mask, or None),
    ``attention_mask`` / ``input_ids`` ([B, T], on the hidden's device)."""

    hidden: Tensor
    valid: Tensor
    rows: list[int]
    texts: list[str]
    offsets: list | None
    special: list | None
    attention_mask: Tensor | None = None
    input_ids: Tensor | None = None
    layers: Callable | None = None  # layerwise=True: layers(fn) runs the forward, fn(layer, [B, T, d]) per layer


@dataclass
class EncodeLog:
    """What encoding did: sentences, tokens (incl. special), truncation, time."""

    n_texts: int = 0
    n_tokens: int = 0
    n_truncated: int = 0
    truncated_tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.n_tokens / self.seconds if self.seconds > 0 else math.nan


def iter_batches(encoder, texts: Sequence[str], batch_size: int | None = None, chunk: int = 1024,
                 offsets: bool = False, bar=None, stats: EncodeLog | None = None,
                 layerwise: bool = False) -> Iterator[Batch]:
    """Encode ``texts`` ``chunk`` at a time (sorted by length inside a chunk to limit padding).

    ``offsets=True`` also returns each row's character offsets and special-token mask (fast tokenizers only).
    Truncation is counted in ``stats`` instead of warned once per chunk.  ``layerwise=True``: ``hidden`` is
    None and ``layers(fn)`` runs the batch's forward one layer at a time (its time is counted when called).
    """
    chunk = max(1, int(chunk))
    stats = stats if stats is not None else EncodeLog()
    for c0 in range(0, len(texts), chunk):
        part = list(texts[c0:c0 + chunk])
        with warnings.catch_warnings():  # encoder.tokenize warns per call; we count and warn once at the end
            warnings.filterwarnings("ignore", message=".*were longer than max_length.*")
            tok = encoder.tokenize(part)
        stats.n_truncated += tok.n_truncated
        stats.truncated_tokens += tok.truncated_tokens
        offs = special = None
        if offsets:
            offs, special = _offsets(encoder, part, tok)
        t0 = time.perf_counter()
        kw = {"layerwise": True} if layerwise else {}
        for b in encoder.batches(tok, batch_size, sort_by_length=True, **kw):
            idx = b.index.tolist()
            stats.seconds += time.perf_counter() - t0
            stats.n_tokens += int(b.attention_mask.sum())
            stats.n_texts += len(idx)
            dev = b.hidden.device if b.hidden is not None else b.attention_mask.device
            valid = valid_token_mask(b.attention_mask, b.special_tokens_mask).to(dev)
            layers = None
            if layerwise:
                layers = partial(_timed, b.layers, stats)
            yield Batch(b.hidden, valid, [c0 + i for i in idx], [part[i] for i in idx],
                        None if offs is None else [offs[i] for i in idx],
                        None if special is None else [special[i] for i in idx],
                        b.attention_mask.to(dev), b.input_ids.to(dev), layers)
            if bar is not None:
                bar.update(len(idx))
            t0 = time.perf_counter()


def _timed(run, stats: EncodeLog, fn) -> None:
    t0 = time.perf_counter()
    run(fn)
    stats.seconds += time.perf_counter() - t0


def _offsets(encoder, texts: list[str], tok) -> tuple[list, list]:
    tk = encoder.tokenizer
    if not getattr(tk, "is_fast", False):
        raise ValueError(f"the tokenizer of {encoder.source.name} ({type(tk).__name__}) gives no character offsets; "
                         "word-level analyses (self_similarity, wic) need a fast tokenizer (tokenizer.json)")
    if getattr(tok, "offsets", None) is not None:  # FrozenEncoder.tokenize kept them: no second tokenizer call
        return tok.offsets, tok.special_tokens_mask
    enc = tk(texts, add_special_tokens=True, truncation=True, max_length=encoder.max_length,
             return_offsets_mapping=True, return_special_tokens_mask=True)
    if enc["input_ids"] != tok.input_ids:  # same call as encoder.tokenize: a mismatch would misalign words
        raise ValueError("tokenizer offsets do not match the encoded token ids")
    return enc["offset_mapping"], enc["special_tokens_mask"]


def finish_encode_log(stats: EncodeLog, what: str, notes: list[str]) -> None:
    """One truncation warning (and report note) for a whole pass."""
    if stats.n_truncated:
        msg = (f"{what}: {stats.n_truncated} texts were longer than the encoder accepts and were truncated "
               f"({stats.truncated_tokens} tokens dropped)")
        log.warning(msg)
        notes.append(msg)


def progress_bar(total: int, desc: str, enabled: bool):
    """tqdm on a terminal; plain ``[evaluate] ...`` lines with ETA in a log file (outlierlab.utils.progress)."""
    return make_bar(total, f"[evaluate] {desc}", enabled, unit="sentences")


def distinct_texts(texts: Sequence[str]) -> tuple[list[str], list[int]]:
    """``(unique, index)``: the distinct texts in first-seen order and, per occurrence, its index in ``unique``.

    Encoding is deterministic (eval mode, no dropout), so encoding each distinct text once and reusing its
    vectors gives exactly what encoding every occurrence would.
    """
    where: dict[str, int] = {}
    index = [where.setdefault(t, len(where)) for t in texts]
    return list(where), index


def encode_log_line(what: str, n_encoded: int, n_occurrences: int) -> str:
    """``"STS x: encoded 50 texts for 2450 occurrences"`` (logged, and kept as a report note)."""
    line = f"{what}: encoded {n_encoded} texts for {n_occurrences} occurrences"
    log.info(line)
    return line
