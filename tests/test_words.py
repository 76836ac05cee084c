"""Word plans of a batch (outlierlab/evaluation/words.py): the batched plan and the gathered word vectors equal
the plain row-by-row scan and the zeros + index_add_ mean they replaced, bitwise."""

import random
from types import SimpleNamespace

import pytest
import torch

from outlierlab.evaluation.words import plan_vectors, word_plan
from sentence_pass_oracle import word_occurrences, word_vectors


def _plan_by_rows(b, word_index: dict, t_len: int, lowercase: bool = True):
    """The plain reference plan: word_occurrences (a scan of every token for every word) row by row."""
    per_row = [word_occurrences(t, o, s, lowercase) for t, o, s in zip(b.texts, b.offsets, b.special)]
    w_max = max((len(r) for r in per_row), default=0)
    if w_max == 0:
        return None
    src, dst, keys = [], [], torch.full((len(per_row), w_max), -1, dtype=torch.long)
    counts = torch.zeros(len(per_row) * w_max, dtype=torch.float32)
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


def _vectors_index_add(flat, plan, bsz):
    """plan_vectors the plain way: zeros, index_add_ of every token, divided by the counts."""
    src, dst, counts, keys, w_max = plan
    out = torch.zeros(flat.shape[0], bsz * w_max, flat.shape[-1], dtype=flat.dtype).index_add_(1, dst, flat[:, src])
    out = out / counts.clamp_min(1)[None, :, None]
    return out.reshape(flat.shape[0], bsz, w_max, flat.shape[-1]), (counts > 0).reshape(bsz, w_max), keys


def _same(a, b) -> None:
    if a is None or b is None:
        assert a is None and b is None
        return
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y), (x, y)
        else:
            assert x == y


def _batch(texts, offsets, special):
    return SimpleNamespace(texts=texts, offsets=offsets, special=special)


def _hand_batch():
    """Specials at both ends, a word split in three tokens, one token covering two words ("a-b" is one regex
    word but "x y" is two), an empty-span token, a word cut off by truncation, a repeated target word, an
    uppercase word, a row with no word at all, padding (rows shorter than t_len), an apostrophe word."""
    texts = ["The dog saw THE dog", "well-bred x y", "", "don't stop me now"]
    offsets = [[(0, 0), (0, 3), (4, 7), (8, 11), (12, 15), (16, 19), (0, 0)],
               [(0, 0), (0, 4), (4, 5), (5, 9), (10, 13), (0, 0)],
               [(0, 0), (0, 0)],
               [(0, 0), (0, 3), (3, 5), (4, 4), (6, 10), (0, 0)]]  # truncated: "me now" has no token
    special = [[1, 0, 0, 0, 0, 0, 1], [1, 0, 0, 0, 0, 1], [1, 1], [1, 0, 0, 0, 0, 1]]
    return _batch(texts, offsets, special)


@pytest.mark.parametrize("lowercase", [True, False])
def test_word_plan_equals_the_row_by_row_scan_on_hand_cases(lowercase):
    b = _hand_batch()
    index = {"dog": 0, "the": 1, "THE": 2, "x": 3, "y": 4, "don't": 5, "stop": 6, "me": 7}
    plan = word_plan(b, index, t_len=9, lowercase=lowercase)
    _same(plan, _plan_by_rows(b, index, 9, lowercase))
    src, dst, counts, keys, w_max = plan
    assert w_max == 5 and counts[:5].tolist() == [1, 1, 1, 1, 1]
    assert counts[5:8].tolist() == [3, 1, 1]  # "well-bred" = 3 tokens; "x" and "y" share token 4
    assert counts[10:15].tolist() == [0] * 5  # the empty row
    assert counts[15:20].tolist() == [2, 1, 0, 0, 0]  # "don't" = tokens 1, 2 (3 is empty, inside it), "stop"; "me now" cut
    assert src[dst == 6].tolist() == [9 + 4] and src[dst == 7].tolist() == [9 + 4]
    want_row0 = [1, 0, -1, -1, -1] if lowercase else [-1, 0, -1, 2, -1]  # a target's first occurrence only
    assert keys[0].tolist() == want_row0


def test_word_plan_none_without_words_and_equals_the_scan_on_random_batches():
    assert word_plan(_batch(["", "!!"], [[(0, 0)], [(0, 0), (0, 2), (0, 0)]], [[1], [1, 0, 1]]), {}, 4) is None
    assert word_plan(_batch(["a b"], [[(0, 0), (0, 0)]], [[1, 1]]), {}, 4) is None  # words, but no token
    rng = random.Random(5)
    vocab = ["a", "Bank", "river-bank", "don't", "it’s", "x1", "Z", "long", "word", "é", "ø"]
    index = {w.lower(): i for i, w in enumerate(vocab[::2])}
    for trial in range(60):
        texts, offsets, special = [], [], []
        for _ in range(rng.randint(1, 6)):
            text = " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 8)))
            toks = [(0, 0)]
            pos = 0
            while pos < len(text):  # random pieces, some spanning spaces, sometimes overlapping or out of order
                step = rng.randint(1, 4)
                toks.append((pos, min(len(text), pos + step)))
                if rng.random() < 0.1:
                    toks.append((max(0, pos - 2), pos + 1))
                if rng.random() < 0.1:
                    toks.append((pos + 1, pos + 1))  # an empty span, maybe inside a word: never counts
                pos += step
            if rng.random() < 0.3:
                toks = toks[:rng.randint(1, len(toks))]  # truncated
            toks.append((0, 0))
            texts.append(text)
            offsets.append(toks)
            special.append([1] + [int(rng.random() < 0.05) for _ in toks[1:-1]] + [1])
        t_len = max(len(o) for o in offsets) + rng.randint(0, 3)
        b = _batch(texts, offsets, special)
        for lowercase in (True, False):
            _same(word_plan(b, index, t_len, lowercase), _plan_by_rows(b, index, t_len, lowercase))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_plan_vectors_equal_the_index_add_mean_bitwise(dtype):
    """Single- and multi-token words, empty slots, -0.0 (0.0 + -0.0 is +0.0 in the old sum), inf, a plan whose
    slots are not in order (the plain path), several layers."""
    b = _hand_batch()
    plan = word_plan(b, {"dog": 0}, t_len=9)
    g = torch.Generator().manual_seed(4)
    flat = torch.randn(3, 4 * 9, 8, generator=g).to(dtype)
    flat[:, 1] = -0.0  # "The": a one-token word of -0.0s
    flat[:, 9 + 1, :4] = -0.0  # first token of "well-bred"
    flat[:, 9 + 2, :2] = -0.0
    flat[:, 9 + 3, 0] = -0.0
    flat[1, 3, 2] = float("inf")
    got, want = plan_vectors(flat, plan, 4), _vectors_index_add(flat, plan, 4)
    _same(got, want)
    assert torch.equal(got[0].signbit(), want[0].signbit())  # bitwise, signed zeros included
    assert not got[0][:, 0, 0].signbit().any()
    src, dst, counts, keys, w_max = plan
    perm = torch.randperm(src.numel(), generator=g)
    shuffled = (src[perm], dst[perm], counts, keys, w_max)
    got2 = plan_vectors(flat, shuffled, 4)
    assert torch.allclose(got2[0].float(), want[0].float(), atol=1e-2 if dtype == torch.bfloat16 else 1e-6)
    # word_vectors: the [L, B, T, d] form
    hidden = flat.reshape(3, 4, 9, 8)
    _same(word_vectors(hidden, b, {"dog": 0}), want)
