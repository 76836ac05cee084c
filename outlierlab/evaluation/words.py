"""Words of a text mapped to its tokens (self-similarity, intra-sentence similarity, WiC targets).

Regex words (``WORD_RE``) mapped to tokens through a fast tokenizer's character offsets; a multi-token word is the mean
of its tokens' vectors (Ethayarajh 2019 leaves the choice open; clip and whiten are affine, so transforming the mean
equals averaging the transformed tokens).
"""

from __future__ import annotations

import re
from collections import Counter
from itertools import chain
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

#: Words as in the shipped data's NOTICE (letters/digits, inner apostrophes and hyphens): ``don't``, ``well-bred``.
WORD_RE = re.compile(r"[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*")


def char_span_tokens(offsets: Sequence[tuple[int, int]], special: Sequence[int], start: int, end: int) -> list[int]:
    """Non-special tokens whose ``offsets`` span overlaps ``[start, end)``, partly too ("bank" in "riverbank")."""
    return [i for i, ((s, e), sp) in enumerate(zip(offsets, special))
            if not sp and e > s and s < end and e > start]


def select_words(texts: Sequence[str], min_sentences: int = 10, max_words: int | None = 1000, seed: int = 0,
                 lowercase: bool = True) -> list[str]:
    """Self-similarity's targets: types in ≥ ``min_sentences`` sentences (Ethayarajh 2019), sampled, sorted."""
    counts = Counter(w for t in texts for w in {w.lower() if lowercase else w for w in WORD_RE.findall(t)})
    eligible = sorted(w for w, c in counts.items() if c >= min_sentences)
    if max_words is not None and len(eligible) > max_words:
        pick = np.random.default_rng(seed).choice(len(eligible), size=int(max_words), replace=False)
        eligible = [eligible[i] for i in sorted(pick)]
    return eligible


def word_plan(b, word_index: dict, t_len: int, lowercase: bool = True):
    """Which tokens make which word slot in a batch, once for every layer: ``(src, dst, counts, keys, w_max)`` or
    None when no row has a word.  Each regex word with the non-special tokens it overlaps, in numpy for the whole
    batch; a row's words are disjoint and in order, so a token's words are found by two binary searches."""
    bsz = len(b.texts)
    row_words, row_spans = [], []
    for t in b.texts:
        ms = list(WORD_RE.finditer(t))
        row_words.append([m.group().lower() if lowercase else m.group() for m in ms])
        row_spans.append([m.span() for m in ms])
    n_words = [len(w) for w in row_words]
    n_toks = [min(len(o), len(sp)) for o, sp in zip(b.offsets, b.special)]
    if sum(n_words) == 0 or sum(n_toks) == 0:
        return None
    wspan = np.fromiter(chain.from_iterable(chain.from_iterable(row_spans)), dtype=np.int64,
                        count=2 * sum(n_words)).reshape(-1, 2)
    tspan = np.fromiter(chain.from_iterable(chain.from_iterable(o[:n] for o, n in zip(b.offsets, n_toks))),
                        dtype=np.int64, count=2 * sum(n_toks)).reshape(-1, 2)
    special = np.fromiter(chain.from_iterable(sp[:n] for sp, n in zip(b.special, n_toks)), dtype=np.int64,
                          count=sum(n_toks))
    w_row, _ = _ragged_index(n_words)
    t_row, t_pos = _ragged_index(n_toks)
    # each row's characters shifted by row * stride: the batch's words are one sorted list, no token reaches
    # another row's words
    stride = int(max(wspan.max(), tspan.max())) + 2
    ws, we = wspan[:, 0] + w_row * stride, wspan[:, 1] + w_row * stride
    ok = np.nonzero((special == 0) & (tspan[:, 1] > tspan[:, 0]))[0]  # tokens that count, in (row, position) order
    lo = np.searchsorted(we, tspan[ok, 0] + t_row[ok] * stride, side="right")  # first word ending after s
    hi = np.searchsorted(ws, tspan[ok, 1] + t_row[ok] * stride, side="left")  # first word starting at/after e
    n_pairs = np.maximum(hi - lo, 0)
    tok = np.repeat(ok, n_pairs)  # (word, token) pairs, by token
    first_pair = np.cumsum(n_pairs) - n_pairs
    word = np.repeat(lo, n_pairs) + np.arange(int(n_pairs.sum())) - np.repeat(first_pair, n_pairs)
    order = np.argsort(word, kind="stable")  # by word, then token (tokens were in order): the scan's order
    word, tok = word[order], tok[order]
    n_tok_of = np.bincount(word, minlength=len(ws))
    has = n_tok_of > 0
    kept_before = np.cumsum(has) - has  # words with tokens before each word, in the batch
    per_row = np.bincount(w_row[has], minlength=bsz)  # words with tokens per row
    new_w = kept_before - (np.cumsum(per_row) - per_row)[w_row]  # a word's slot among its row's
    w_max = int(per_row.max())
    if w_max == 0:
        return None
    src = torch.from_numpy(t_row[tok] * t_len + t_pos[tok])
    dst = torch.from_numpy(w_row[word] * w_max + new_w[word])
    counts = torch.zeros(bsz * w_max, dtype=torch.float32)
    hw = np.nonzero(has)[0]
    counts[torch.from_numpy(w_row[hw] * w_max + new_w[hw])] = torch.from_numpy(n_tok_of[hw].astype(np.float32))
    has = has.tolist()
    new_w = new_w.tolist()
    keys = np.full((bsz, w_max), -1, dtype=np.int64)
    i = 0
    for row in range(bsz):
        seen = set()
        for text_word in row_words[row]:
            if has[i]:
                k = word_index.get(text_word, -1)
                if k >= 0 and k not in seen:
                    keys[row, new_w[i]] = k
                    seen.add(k)
            i += 1
    return src, dst, counts, torch.from_numpy(keys), w_max


def _ragged_index(lengths: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(row, position in its row) of every entry of ragged rows of ``lengths``, rows one after the other."""
    n = np.asarray(lengths, dtype=np.int64)
    rows = np.repeat(np.arange(len(lengths)), n)
    return rows, np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)


def plan_vectors(flat: Tensor, plan, bsz: int) -> tuple[Tensor, Tensor, Tensor]:
    """Word vectors of a batch, the mean of each word's subwords of ``flat [L, n, d]``: ``(vectors [L, B, W, d],
    mask [B, W], keys [B, W])``, ``keys`` the target-word index of a target's FIRST occurrence in its sentence, else -1
    (Ethayarajh: one per sentence)."""
    src, dst, counts, keys, w_max = plan
    n_layers, d, dev = flat.shape[0], flat.shape[-1], flat.device
    n_slots = bsz * w_max
    if (flat.dtype not in (torch.float32, torch.float64) or dst.numel() == 0
            or bool((dst[1:] < dst[:-1]).any())):  # half precision (a float32 result) or not grouped by slot
        out = torch.zeros(n_layers, n_slots, d, dtype=flat.dtype, device=dev).index_add_(
            1, dst.to(dev), flat[:, src.to(dev)])
        out = out / counts.to(dev).clamp_min(1)[None, :, None]
        return out.reshape(n_layers, bsz, w_max, d), (counts > 0).reshape(bsz, w_max).to(dev), keys
    # The same numbers as the index_add_ above, faster: most words are one token, so gather every slot's first token
    # (``+ 0.0`` as adding to 0.0 does to -0.0), index_add_ the later ones, and divide only words of several tokens.
    first = torch.ones_like(dst, dtype=torch.bool)
    first[1:] = dst[1:] != dst[:-1]
    idx = torch.zeros(n_slots, dtype=torch.long).index_put_((dst[first],), src[first])
    out = flat.index_select(1, idx.to(dev)).add_(0.0)
    empty = (counts == 0).nonzero().flatten()
    if empty.numel():
        out.index_fill_(1, empty.to(dev), 0.0)
    rest = (~first).nonzero().flatten()
    if rest.numel():
        out.index_add_(1, dst[rest].to(dev), flat.index_select(1, src[rest].to(dev)))
    several = (counts > 1).nonzero().flatten()
    if several.numel():
        sev = several.to(dev)
        out[:, sev] /= counts[several].to(dev)[None, :, None]
    return out.reshape(n_layers, bsz, w_max, d), (counts > 0).reshape(bsz, w_max).to(dev), keys
