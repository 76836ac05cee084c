"""``sentences.txt.gz``: sentences of Austen's *Persuasion*, one per line, for outlier statistics,
anisotropy and self-similarity (Ethayarajh 2019; Luo et al. 2021 §4.1) and the position probe
(Luo et al. §3).

The sentence splitter is a hand-written punctuation rule: no library ships one we may use offline
without a model.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

from .common import WORD_RE, count_words

SENT_MIN_WORDS, SENT_MAX_WORDS = 8, 60
#: Abbreviations that end in "." without ending a sentence in Persuasion ("Charles Musgrove, Esq. of").
ABBREVIATIONS = frozenset({"Mr", "Mrs", "Dr", "St", "Esq", "Wm", "Capt", "Col"})
# Sentence end: run of . ! ? plus closing quotes/brackets, then whitespace, then (after an optional
# opening quote/bracket) an upper-case letter. "Indeed!" was the reply -> no split (lower case next).
_BOUNDARY = re.compile(r"([.!?]+[\"'’”)\]]*)\s+(?=[\"'‘“(\[]?[A-Z])")
_LAST_WORD = re.compile(r"([A-Za-z]+)\.$")


def split_sentences(paragraph: str) -> list[str]:
    """Split one paragraph into sentences with a simple punctuation rule.

    A sentence ends at ``.``/``!``/``?`` (plus any closing quote or bracket) followed by whitespace
    and an upper-case letter (optionally after an opening quote); a ``.`` after one of
    :data:`ABBREVIATIONS` does not end a sentence. Whitespace inside a sentence is collapsed.
    """
    paragraph = " ".join(paragraph.split())
    out, start = [], 0
    for m in _BOUNDARY.finditer(paragraph):
        head = paragraph[start : m.end(1)]
        last = _LAST_WORD.search(head)
        if m.group(1).startswith(".") and last and last.group(1) in ABBREVIATIONS:
            continue
        out.append(head.strip())
        start = m.end()
    tail = paragraph[start:].strip()
    if tail:
        out.append(tail)
    return [s for s in out if s]


def build_sentences(
    paragraphs: Sequence[str], min_words: int = SENT_MIN_WORDS, max_words: int = SENT_MAX_WORDS
) -> list[str]:
    """Sentences of ``paragraphs`` with ``min_words <= count_words <= max_words``, in text order,
    exact duplicates removed (first occurrence kept)."""
    seen: set[str] = set()
    out = []
    for para in paragraphs:
        for sent in split_sentences(para):
            if min_words <= count_words(sent) <= max_words and sent not in seen:
                seen.add(sent)
                out.append(sent)
    return out


def word_sentence_freq(sentences: Sequence[str]) -> Counter:
    """For each lower-cased word type, the number of sentences it occurs in."""
    return Counter(w for s in sentences for w in {t.lower() for t in WORD_RE.findall(s)})
