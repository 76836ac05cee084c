"""The two-pass reference of the shared sentence pass — kept only as a test oracle.

No stream, no per-layer state, no token store: every batch's hidden states of ALL layers at once
(``[L+1, B, T, d]``) go into ``L+1``-layer accumulators, the transforms are fitted from the first encoding's
sums, and the sentences are encoded a second time to apply them.  Written the plain way on purpose, so that the
engine (:mod:`outlierlab.evaluation.sentence_stream`, :func:`outlierlab.evaluation.sentence_pass.run_sentence_pass`) is
checked against something that shares none of its machinery except the accumulators themselves.  Beside it, the
plain word-to-token scan (:func:`word_occurrences`) that the batched word plan of
:mod:`outlierlab.evaluation.words` is compared with, and the stacked mean pooling (:func:`mean_pool`) that STS's
layer-by-layer sentence vectors are.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from outlierlab.metrics.outlier_dims import detect_outlier_dims
from outlierlab.metrics.outlier_stats import OutlierAccumulator
from outlierlab.metrics.similarity import (AnisotropyAccumulator, SelfSimilarityAccumulator,
                                            intra_sentence_similarity)
from outlierlab.metrics.transforms import FITTED, clip_dims_per_layer
from outlierlab.evaluation.encoding import token_offsets
from outlierlab.metrics.transform_fit import FittedTransforms, WhitenSettings
from outlierlab.configuration.run_settings import TransformSettings
from outlierlab.evaluation.words import WORD_RE, char_span_tokens, plan_vectors, select_words, word_plan


def oracle_pass(encoder, texts, transforms, *, outliers, anisotropy, self_similarity, data,
                transform: TransformSettings = TransformSettings(), seed, batch_size) -> dict:
    """Outlier counts, word statistics and the raw anisotropy reservoir of every transform in ``transforms``
    (the settings as :func:`outlierlab.evaluation.sentence_pass.run_sentence_pass` takes them)."""
    texts = [t for t in texts if t.strip()]
    n_layers, dim = encoder.num_layers + 1, encoder.hidden_size
    whiten, lowercase, chunk = WhitenSettings.from_settings(transform), self_similarity.lowercase, data.chunk
    ft = FittedTransforms()
    if transform.dims is not None:
        ft.clip_dims, _ = clip_dims_per_layer(n_layers, dim, transform.dims, None)
    words = select_words(texts, self_similarity.min_sentences, self_similarity.max_words, seed, lowercase)
    index = {w: i for i, w in enumerate(words)}
    out = {"outliers": {}, "self_sim": {}, "intra_sum": {}, "intra_n": {}, "transforms": ft, "words": words}
    params = next(encoder.model.parameters())
    reservoir = AnisotropyAccumulator(n_layers, dim, max(2, min(anisotropy.n_sentences, len(texts))), seed=seed,
                                      dtype=params.dtype if params.dtype != torch.float32 else torch.float32)
    sums = whiten.new(n_layers, dim)

    def consume(names, first: bool) -> None:
        for t in names:
            out["outliers"][t] = OutlierAccumulator(n_layers, ft.out_dim(t, dim))
            out["self_sim"][t] = SelfSimilarityAccumulator(n_layers, ft.out_dim(t, dim), range(len(words)))
            out["intra_sum"][t], out["intra_n"][t] = torch.zeros(n_layers, dtype=torch.float64), 0
        for b in padded_batches(encoder, texts, batch_size, chunk):
            tokens = b.hidden[:, b.valid].float()  # [L+1, N, d]
            if first:
                sid = torch.arange(b.valid.shape[0])[:, None].expand_as(b.valid)[b.valid]
                reservoir.update(tokens, sid)
                sums.partial_fit(tokens)
            wv, mask, keys = word_vectors(b.hidden.float(), b, index, lowercase)
            for t in names:
                out["outliers"][t].update(ft.apply(t, tokens))
                if wv is None:
                    continue
                tv = ft.apply(t, wv)  # [L+1, B, W, d']
                has = mask.any(1)
                if has.any():
                    out["intra_sum"][t] += intra_sentence_similarity(tv[:, has], mask=mask[has]).sum(1)
                    out["intra_n"][t] += int(has.sum())
                target = (keys.flatten() >= 0).nonzero().flatten()
                if target.numel():
                    flat = tv.reshape(n_layers, -1, tv.shape[-1])
                    out["self_sim"][t].update(flat[:, target], keys.flatten()[target])

    now = [t for t in transforms if ft.ready(t)]
    consume(now, first=True)
    if "clip" in transforms and ft.clip_dims is None:
        ft.clip_dims = detect_outlier_dims(out["outliers"]["none"], outliers.method, outliers.threshold, outliers.k)
    fitted = [t for t in transforms if t in FITTED]
    if fitted:
        ft.set_all(whiten.fit_all(sums, fitted, "oracle"))
    consume([t for t in transforms if t not in now], first=False)
    out["anisotropy"] = reservoir
    return out


def padded_batches(encoder, texts, batch_size=None, chunk=1024):
    """Every batch's stacked hidden states ``[L+1, B, T, d]`` with its valid-token mask, rows, texts and token
    offsets: the whole-batch view the stream never builds, tokenized and sorted as the stream does."""
    from types import SimpleNamespace

    from outlierlab.metrics.outlier_stats import valid_token_mask

    for c0 in range(0, len(texts), chunk):
        part = list(texts[c0:c0 + chunk])
        tok = encoder.tokenize(part)
        offs, special = token_offsets(encoder, tok)
        for b in encoder.batches(tok, batch_size, sort_by_length=True):
            idx = b.index.tolist()
            yield SimpleNamespace(hidden=b.hidden, valid=valid_token_mask(b.attention_mask, b.special_tokens_mask),
                                  rows=[c0 + i for i in idx], texts=[part[i] for i in idx],
                                  offsets=[offs[i] for i in idx], special=[special[i] for i in idx])


def word_occurrences(text: str, offsets: Sequence[tuple[int, int]], special: Sequence[int],
                     lowercase: bool = True) -> list[tuple[str, list[int]]]:
    """Every regex word of ``text`` (in order) with its token indices; words with no token are dropped
    (e.g. cut off by truncation): the plain scan that :func:`outlierlab.evaluation.words.word_plan` does for a whole
    batch at once.  Ethayarajh's "one occurrence per sentence" is applied by the caller."""
    out = []
    for m in WORD_RE.finditer(text):
        toks = char_span_tokens(offsets, special, m.start(), m.end())
        if toks:
            out.append((m.group().lower() if lowercase else m.group(), toks))
    return out


def word_vectors(hidden: Tensor, b, word_index: dict, lowercase: bool = True
                 ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Word vectors of a batch of ``[L, B, T, d]`` hidden states (all layers at once, as this oracle holds them): the
    mean of each word's subword tokens (:func:`outlierlab.evaluation.words.plan_vectors` on the batch's plan).

    Returns ``(vectors [L, B, W, d], mask [B, W] bool, keys [B, W] long)``: W = most words in a row;
    ``keys`` holds the target-word index of the FIRST occurrence of a target word in its sentence and -1
    elsewhere (Ethayarajh: at most one occurrence per sentence).
    """
    n_layers, bsz, t_len, d = hidden.shape
    plan = word_plan(b, word_index, t_len, lowercase)
    if plan is None:
        return None, None, None
    return plan_vectors(hidden.reshape(n_layers, bsz * t_len, d), plan, bsz)


def mean_pool(hidden: Tensor, mask: Tensor) -> Tensor:
    r"""Mean of the valid token vectors of each sentence, for all layers at once: [L, B, T, d] -> [L, B, d].

    .. math:: \bar s_{l,b} = \frac{\sum_t m_{b,t}\, h_{l,b,t}}{\sum_t m_{b,t}}

    ``mask`` [B, T]: tokens to include (attention mask, optionally minus special tokens).  At least float32.
    """
    if hidden.ndim != 4 or tuple(hidden.shape[1:3]) != tuple(mask.shape):
        raise ValueError(f"mean_pool expects hidden [L, B, T, d] and mask [B, T]; got {tuple(hidden.shape)} "
                         f"and {tuple(mask.shape)}.")
    h = hidden.to(torch.promote_types(hidden.dtype, torch.float32))
    m = mask.to(h.device, h.dtype)
    n = m.sum(-1)
    if (n == 0).any():
        raise ValueError("mean_pool: a sentence has no valid token (all-zero mask row).")
    return torch.einsum("lbtd,bt->lbd", h, m) / n[None, :, None]
