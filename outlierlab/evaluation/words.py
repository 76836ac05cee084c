"""Words of a text mapped to its tokens (self-similarity, intra-sentence similarity, WiC targets).

Words are regex words of the text (:data:`WORD_RE`), mapped to tokens through a fast tokenizer's character
offsets (``return_offsets_mapping``); a word split into several subword tokens is represented by the mean
of its tokens' vectors (Ethayarajh 2019 leaves the choice open; clip and whiten are affine, so transforming
that mean equals averaging the transformed tokens).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

#: Words as in the shipped data's NOTICE (letters/digits, inner apostrophes and hyphens): ``don't``, ``well-bred``.
WORD_RE = re.compile(r"[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*")


def char_span_tokens(offsets: Sequence[tuple[int, int]], special: Sequence[int], start: int, end: int) -> list[int]:
    """Indices of the non-special tokens whose character span overlaps ``[start, end)`` (end exclusive).

    ``offsets`` are a fast tokenizer's ``offset_mapping`` of one text (character, not byte, offsets).
    A token that overlaps the span partly (``"bank"`` inside ``"riverbank"``) counts.
    """
    return [i for i, ((s, e), sp) in enumerate(zip(offsets, special))
            if not sp and e > s and s < end and e > start]


def word_occurrences(text: str, offsets: Sequence[tuple[int, int]], special: Sequence[int],
                     lowercase: bool = True) -> list[tuple[str, list[int]]]:
    """Every regex word of ``text`` (in order) with its token indices; words with no token are dropped
    (e.g. cut off by truncation).  Ethayarajh's "one occurrence per sentence" is applied by the caller."""
    out = []
    for m in WORD_RE.finditer(text):
        toks = char_span_tokens(offsets, special, m.start(), m.end())
        if toks:
            out.append((m.group().lower() if lowercase else m.group(), toks))
    return out


def sentence_word_counts(texts: Sequence[str], lowercase: bool = True) -> Counter:
    """Number of sentences each word type occurs in (text only; no tokenizer, no encoder)."""
    counts: Counter = Counter()
    for t in texts:
        counts.update({w.lower() if lowercase else w for w in WORD_RE.findall(t)})
    return counts


def select_words(texts: Sequence[str], min_sentences: int = 10, max_words: int | None = 1000, seed: int = 0,
                 lowercase: bool = True) -> list[str]:
    """Target words of self-similarity: types occurring in ≥ ``min_sentences`` sentences (Ethayarajh 2019),
    a seeded uniform sample of ``max_words`` of them when there are more (paper: 1000), sorted."""
    eligible = sorted(w for w, c in sentence_word_counts(texts, lowercase).items() if c >= min_sentences)
    if max_words is not None and len(eligible) > max_words:
        pick = np.random.default_rng(seed).choice(len(eligible), size=int(max_words), replace=False)
        eligible = [eligible[i] for i in sorted(pick)]
    return eligible


def word_plan(b, word_index: dict, t_len: int, lowercase: bool = True):
    """Which tokens make which word slot in a batch (text work only, done once per batch and reused for
    every layer): ``(src, dst, counts, keys, w_max)`` or None when no row has a word; see :func:`word_vectors`."""
    per_row = [word_occurrences(t, o, s, lowercase) for t, o, s in zip(b.texts, b.offsets, b.special)]
    w_max = max((len(r) for r in per_row), default=0)
    if w_max == 0:
        return None
    bsz = len(per_row)
    src, dst, keys = [], [], torch.full((bsz, w_max), -1, dtype=torch.long)
    counts = torch.zeros(bsz * w_max, dtype=torch.float32)
    for row, words in enumerate(per_row):
        seen = set()
        for w, (word, toks) in enumerate(words):
            slot = row * w_max + w
            src.extend(row * t_len + t for t in toks)
            dst.extend([slot] * len(toks))
            counts[slot] = len(toks)
            k = word_index.get(word, -1)
            if k >= 0 and k not in seen:
                keys[row, w] = k
                seen.add(k)
    return torch.tensor(src), torch.tensor(dst), counts, keys, w_max


def plan_vectors(flat: Tensor, plan, bsz: int) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`word_vectors` from a :func:`word_plan`: ``flat [L, n, d]`` holds the batch's token vectors (any L,
    e.g. one layer) at the indices the plan's ``src`` names (the ``[B, T]`` grid flattened, or a store's rows)."""
    src, dst, counts, keys, w_max = plan
    n_layers, d, dev = flat.shape[0], flat.shape[-1], flat.device
    out = torch.zeros(n_layers, bsz * w_max, d, dtype=flat.dtype, device=dev).index_add_(
        1, dst.to(dev), flat[:, src.to(dev)])
    out = out / counts.to(dev).clamp_min(1)[None, :, None]
    return out.reshape(n_layers, bsz, w_max, d), (counts > 0).reshape(bsz, w_max).to(dev), keys


def word_vectors(hidden: Tensor, b, word_index: dict, lowercase: bool = True
                 ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Word vectors of a batch: the mean of each word's subword tokens.

    Returns ``(vectors [L, B, W, d], mask [B, W] bool, keys [B, W] long)``: W = most words in a row;
    ``keys`` holds the target-word index of the FIRST occurrence of a target word in its sentence and -1
    elsewhere (Ethayarajh: at most one occurrence per sentence).
    """
    n_layers, bsz, t_len, d = hidden.shape
    plan = word_plan(b, word_index, t_len, lowercase)
    if plan is None:
        return None, None, None
    return plan_vectors(hidden.reshape(n_layers, bsz * t_len, d), plan, bsz)
