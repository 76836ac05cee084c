"""What encoding texts needs around the forward: the pass's log (``EncodeLog``, one truncation warning per pass), the
tokens' character offsets (``token_offsets``) and ``distinct_texts`` (repeated texts, e.g. STS pairs, encoded once).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

from outlierlab.models.encoder_inputs import report_truncation

log = logging.getLogger(__name__)


@dataclass
class EncodeLog:
    """What encoding did: sentences, tokens (incl. special), truncation, time."""

    n_texts: int = 0
    n_tokens: int = 0
    n_truncated: int = 0
    truncated_tokens: int = 0
    seconds: float = 0.0


def token_offsets(encoder, tok) -> tuple[list, list]:
    """Per text, its tokens' character offsets and special mask as ``FrozenEncoder.tokenize`` kept them."""
    if getattr(tok, "offsets", None) is None:
        tk = encoder.tokenizer
        raise ValueError(f"the tokenizer of {encoder.source.name} ({type(tk).__name__}) gives no character offsets; "
                         "word-level analyses (self_similarity, wic) need a fast tokenizer (tokenizer.json)")
    return tok.offsets, tok.special_tokens_mask


def finish_encode_log(stats: EncodeLog, what: str, notes: list[str], max_length: int) -> None:
    """One truncation line (``report_truncation``) for a whole pass, kept as a report note."""
    line = report_truncation(what, stats.n_truncated, stats.n_texts, stats.truncated_tokens, max_length)
    if line:
        notes.append(line)


def distinct_texts(texts: Sequence[str]) -> tuple[list[str], list[int]]:
    """``(unique, index)``: the distinct texts in first-seen order and each occurrence's index in ``unique``."""
    where: dict[str, int] = {}
    index = [where.setdefault(t, len(where)) for t in texts]
    return list(where), index


def encode_log_line(what: str, n_encoded: int, n_occurrences: int) -> str:
    """``"STS x: encoded 50 texts for 2450 occurrences"`` (logged, and kept as a report note)."""
    line = f"{what}: encoded {n_encoded} texts for {n_occurrences} occurrences"
    log.info(line)
    return line
