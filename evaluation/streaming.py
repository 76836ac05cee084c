"""The one streaming pass over the evaluation sentences, shared by outliers, anisotropy and self-similarity.

Memory never grows with the number of sentences: texts are tokenized ``chunk`` at a time, every batch of
hidden states ``[L+1, B, T, d]`` is reduced into running statistics and dropped:

* :class:`analysis.outliers.OutlierAccumulator` — per-layer mean vector, argmax/argmin counts (Luo et al. 2021 §2);
* :class:`analysis.transforms.Whitener` — float64 Σx and Σxxᵀ (Su et al. 2021);
* :class:`analysis.similarity.AnisotropyAccumulator` — a reservoir of one random token of each of at most
  ``n_sentences`` sentences (Ethayarajh 2019; Luo §4.1: 2000 sentences → 1000 pairs);
* :class:`analysis.similarity.SelfSimilarityAccumulator` — per target word, Σ of unit vectors (Ethayarajh 2019),
  and a running sum of intra-sentence similarities.

Clip needs the outlier dims and whiten needs a fitted whitener before they can be applied, so the pass runs
twice when it must: **pass 1 (fit)** accumulates the raw (``none``) statistics, the outlier counts that clip
detects its dims from, and the whitener sums; **pass 2 (apply)** re-encodes the sentences and accumulates
the statistics of the transforms fitted in pass 1.  Anisotropy needs no second pass: the reservoir holds
raw vectors and the fitted transform is applied to it afterwards (the reservoir's choice of tokens does
not depend on vector values, so this equals running the accumulator on transformed vectors).  Pass 2 is
skipped when no selected analysis needs it.

Words (self-similarity, intra-sentence similarity) are regex words of the text, mapped to tokens through
the tokenizer's character offsets (``return_offsets_mapping``); a word split into several subword tokens
is represented by the mean of its tokens' vectors.  Clip and whiten are affine, so transforming that mean
equals averaging the transformed tokens.
"""

from __future__ import annotations

import logging
import math
import re
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple, Sequence

import numpy as np
import torch
from torch import Tensor

from analysis.outliers import OutlierAccumulator, detect_outlier_dims, valid_token_mask
from analysis.similarity import (AnisotropyAccumulator, SelfSimilarityAccumulator, anisotropy,
                                 intra_sentence_similarity)
from analysis.transforms import Whitener, clip

log = logging.getLogger(__name__)

TRANSFORMS = ("none", "clip", "whiten")
#: Words as in the shipped data's NOTICE (letters/digits, inner apostrophes and hyphens): ``don't``, ``well-bred``.
WORD_RE = re.compile(r"[A-Za-z0-9]+(?:['’-][A-Za-z0-9]+)*")


# -------------------------------------------------------------------------------------------- char spans
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


# -------------------------------------------------------------------------------------------- batching
class Batch(NamedTuple):
    """One encoded batch: ``hidden [L+1, B, T, d]`` (encoder device), ``valid [B, T]`` bool (non-special,
    non-pad, on the hidden's device), ``rows`` (index of each row in the texts given), ``texts`` (per row),
    ``offsets`` / ``special`` (per row character offsets and special-token mask, or None)."""

    hidden: Tensor
    valid: Tensor
    rows: list[int]
    texts: list[str]
    offsets: list | None
    special: list | None


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
                 offsets: bool = False, bar=None, stats: EncodeLog | None = None) -> Iterator[Batch]:
    """Encode ``texts`` ``chunk`` at a time (sorted by length inside a chunk to limit padding).

    ``offsets=True`` also returns each row's character offsets and special-token mask (fast tokenizers only).
    Truncation is counted in ``stats`` instead of warned once per chunk.
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
        for b in encoder.batches(tok, batch_size, sort_by_length=True):
            idx = b.index.tolist()
            stats.seconds += time.perf_counter() - t0
            stats.n_tokens += int(b.attention_mask.sum())
            stats.n_texts += len(idx)
            valid = valid_token_mask(b.attention_mask, b.special_tokens_mask).to(b.hidden.device)
            yield Batch(b.hidden, valid, [c0 + i for i in idx], [part[i] for i in idx],
                        None if offs is None else [offs[i] for i in idx],
                        None if special is None else [special[i] for i in idx])
            if bar is not None:
                bar.update(len(idx))
            t0 = time.perf_counter()


def _offsets(encoder, texts: list[str], tok) -> tuple[list, list]:
    tk = encoder.tokenizer
    if not getattr(tk, "is_fast", False):
        raise ValueError(f"the tokenizer of {encoder.source.name} ({type(tk).__name__}) gives no character offsets; "
                         "word-level analyses (self_similarity, wic) need a fast tokenizer (tokenizer.json)")
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
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="sent", dynamic_ncols=True)


# -------------------------------------------------------------------------------------------- transforms
@dataclass
class FittedTransforms:
    """The per-layer transforms compared side by side: ``none``, ``clip`` (Luo et al. 2021 §4: zero the
    outlier dims) and ``whiten`` (Su et al. 2021), with a line saying how each was obtained."""

    clip_dims: list[list[int]] | None = None
    whitener: Whitener | None = None
    info: dict[str, str] = field(default_factory=dict)

    def ready(self, name: str) -> bool:
        return name == "none" or (name == "clip" and self.clip_dims is not None) or \
            (name == "whiten" and self.whitener is not None and self.whitener.W is not None)

    def apply(self, name: str, x: Tensor) -> Tensor:
        """Transform vectors ``[L, ..., d]`` (every layer with its own dims / whitener)."""
        if name == "none":
            return x
        if name == "clip":
            return clip(x, self.clip_dims)
        if name == "whiten":
            return self.whitener.transform(x)
        raise ValueError(f"unknown transform {name!r}; valid: {', '.join(TRANSFORMS)}")

    def out_dim(self, name: str, dim: int) -> int:
        return int(self.whitener.W.shape[-1]) if name == "whiten" else dim


def explicit_clip_dims(dims, num_layers: int, dim: int) -> list[list[int]] | None:
    """``transform.dims=[557]`` → the same dims in every layer (checked against the hidden size)."""
    if dims is None:
        return None
    dims = [int(i) for i in dims]
    bad = [i for i in dims if not 0 <= i < dim]
    if bad:
        raise ValueError(f"transform.dims {bad} out of range for hidden size {dim}")
    return [list(dims) for _ in range(num_layers)]


def clip_description(dims: list[list[int]], source: str) -> str:
    per = "; ".join(f"L{i}: {','.join(map(str, d)) or '-'}" for i, d in enumerate(dims))
    return f"{source} ({per})"


# -------------------------------------------------------------------------------------------- the pass
@dataclass
class SentenceStats:
    """Everything the sentence analyses read; built by :func:`run_sentence_pass`."""

    num_layers: int  # L+1 (embedding output + every layer)
    dim: int
    n_sentences: int
    transforms: FittedTransforms
    outliers: dict[str, OutlierAccumulator] = field(default_factory=dict)
    anisotropy_acc: AnisotropyAccumulator | None = None
    self_sim: dict[str, SelfSimilarityAccumulator] = field(default_factory=dict)
    intra_sum: dict[str, Tensor] = field(default_factory=dict)
    intra_n: dict[str, int] = field(default_factory=dict)
    words: list[str] = field(default_factory=list)
    passes: list[EncodeLog] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    def anisotropy(self, name: str) -> Tensor:
        """Anisotropy per layer (Tensor[L+1], float64) of the reservoir after transform ``name``."""
        if self.anisotropy_acc is None:
            raise ValueError("anisotropy was not accumulated in this pass")
        a, b = self.anisotropy_acc.pair_vectors()
        return anisotropy(self.transforms.apply(name, a), self.transforms.apply(name, b)).to(torch.float64)

    def intra_sentence(self, name: str) -> Tensor:
        """Mean intra-sentence similarity per layer (raw, not adjusted), Tensor[L+1] float64."""
        return self.intra_sum[name] / max(1, self.intra_n[name])

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.passes)

    @property
    def tokens_per_s(self) -> float:
        n = sum(p.n_tokens for p in self.passes)
        return n / self.seconds if self.seconds > 0 else math.nan


def run_sentence_pass(encoder, texts: Sequence[str], transforms: Sequence[str] = TRANSFORMS, *,
                      outlier_transforms: Sequence[str] = ("none",), need_anisotropy: bool = True,
                      need_self_sim: bool = True, need_whitener: bool = False,
                      clip_dims: Sequence[int] | None = None, whiten_k: int | None = None,
                      outlier_method: str = "share", outlier_threshold: float = 0.25, outlier_k: float = 3.0,
                      n_anisotropy_sentences: int = 2000, min_sentences: int = 10, max_words: int | None = 1000,
                      lowercase: bool = True, seed: int = 0, batch_size: int | None = None, chunk: int = 1024,
                      progress: bool = False) -> SentenceStats:
    """Run the fit pass (and, if needed, the apply pass) over ``texts``; see the module docstring.

    Parameters
    ----------
    encoder : models.loading.FrozenEncoder (or anything with its ``tokenize``/``batches`` API)
    transforms : transforms to compare (subset of none, clip, whiten)
    outlier_transforms : transforms whose outlier statistics are wanted ("none" is always accumulated:
        clip detects its dims from it)
    need_whitener : fit the whitener even if no statistic here needs it (WiC/STS ``transform.fit_on=sentences``);
        it is always fitted when "whiten" is in ``transforms`` and a statistic here needs it
    clip_dims : ``transform.dims`` (same dims in every layer), or None to detect per layer on these sentences
        with :func:`analysis.outliers.detect_outlier_dims` (``outlier_method``/``threshold``/``k``)
    """
    texts = [t for t in texts if t.strip()]
    if len(texts) < 2:
        raise ValueError(f"need at least 2 non-empty evaluation sentences, got {len(texts)}")
    bad = [t for t in transforms if t not in TRANSFORMS]
    if bad:
        raise ValueError(f"unknown transform(s) {bad}; valid: {', '.join(TRANSFORMS)}")
    n_layers, dim = encoder.num_layers + 1, encoder.hidden_size
    wanted_stats = set(outlier_transforms) | (set(transforms) if (need_anisotropy or need_self_sim) else set())
    need_whitener = "whiten" in transforms and (need_whitener or "whiten" in wanted_stats)
    ft = FittedTransforms(clip_dims=explicit_clip_dims(clip_dims, n_layers, dim))
    if ft.clip_dims is not None:
        ft.info["clip"] = clip_description(ft.clip_dims, "given (transform.dims)")
    words = select_words(texts, min_sentences, max_words, seed, lowercase) if need_self_sim else []
    word_index = {w: i for i, w in enumerate(words)}
    if need_self_sim and not words:
        raise ValueError(f"no word occurs in >= {min_sentences} of the {len(texts)} sentences: use more sentences "
                         "(data.max_sentences) or lower self_similarity.min_sentences")
    st = SentenceStats(n_layers, dim, len(texts), ft, words=words, settings={
        "n_anisotropy_sentences": n_anisotropy_sentences, "min_sentences": min_sentences, "max_words": max_words,
        "outlier_method": outlier_method, "outlier_threshold": outlier_threshold, "outlier_k": outlier_k,
        "seed": seed, "lowercase": lowercase})
    st.outliers["none"] = OutlierAccumulator(n_layers, dim)
    if need_anisotropy or need_self_sim:
        st.anisotropy_acc = AnisotropyAccumulator(n_layers, dim, n_anisotropy_sentences, seed=seed)
    whitener = Whitener(n_layers, dim, k=whiten_k) if need_whitener else None

    def setup(names: list[str]) -> None:
        for name in names:
            d = ft.out_dim(name, dim)
            if name in outlier_transforms and name not in st.outliers:
                st.outliers[name] = OutlierAccumulator(n_layers, d)
            if need_self_sim:
                st.self_sim[name] = SelfSimilarityAccumulator(n_layers, d, range(len(words)))
                st.intra_sum[name] = torch.zeros(n_layers, dtype=torch.float64)
                st.intra_n[name] = 0

    # pass 1: everything ready now (none, clip with given dims) + the fit sums
    now = [t for t in transforms if ft.ready(t) and t in wanted_stats]
    # what pass 2 will do: statistics of clip/whiten that need token or word vectors (anisotropy does not:
    # the fitted transform is applied to its reservoir afterwards)
    later = [t for t in transforms if not ft.ready(t) and t in wanted_stats
             and (t in outlier_transforms or need_self_sim)]
    setup(now)
    _one_pass(encoder, texts, st, now, whitener, word_index, lowercase, need_self_sim, batch_size, chunk,
              progress, "pass 1/2 (fit)" if later else "pass 1/1")
    # fit clip dims and whitener from pass 1
    if "clip" in transforms and ft.clip_dims is None:
        acc = st.outliers["none"]
        ft.clip_dims = (detect_outlier_dims(acc, outlier_method, outlier_threshold, outlier_k) if acc.count
                        else [[] for _ in range(n_layers)])
        rule = (f"share >= {outlier_threshold:g}" if outlier_method == "share" else f"|mean| outside {outlier_k:g}σ")
        ft.info["clip"] = clip_description(ft.clip_dims, f"detected per layer on the {len(texts)} evaluation "
                                                         f"sentences (analysis.outliers.detect_outlier_dims, {rule})")
    if whitener is not None:
        whitener.finalize()
        ft.whitener = whitener
        ft.info["whiten"] = (f"fit on the {whitener.n} non-special token vectors of the {len(texts)} evaluation "
                             f"sentences (Su et al. 2021; k={whiten_k or 'all'})")
    # pass 2: the transforms fitted in pass 1
    if later:
        setup(later)
        _one_pass(encoder, texts, st, later, None, word_index, lowercase, need_self_sim, batch_size, chunk,
                  progress, "pass 2/2 (apply)")
    return st


def _one_pass(encoder, texts, st: SentenceStats, names: list[str], whitener: Whitener | None, word_index: dict,
              lowercase: bool, need_words: bool, batch_size, chunk, progress: bool, desc: str) -> None:
    log_ = EncodeLog()
    bar = progress_bar(len(texts), f"{desc} {encoder.source.name if hasattr(encoder, 'source') else ''}", progress)
    first = not st.passes
    try:
        for b in iter_batches(encoder, texts, batch_size, chunk, offsets=need_words and bool(names), bar=bar,
                              stats=log_):
            _consume(b, st, names, whitener, word_index, lowercase, first)
    finally:
        if bar is not None:
            bar.close()
    if first:
        finish_encode_log(log_, desc, st.notes)
    st.passes.append(log_)


def _consume(b: Batch, st: SentenceStats, names: list[str], whitener: Whitener | None, word_index: dict,
             lowercase: bool, first: bool) -> None:
    h, valid = b.hidden, b.valid
    tokens = h[:, valid]  # [L, N, d] non-special, non-pad tokens
    if first:
        st.outliers["none"].update(tokens)
        if whitener is not None:
            whitener.partial_fit(tokens)
        if st.anisotropy_acc is not None:
            sid = torch.arange(valid.shape[0], device=valid.device)[:, None].expand_as(valid)[valid]
            st.anisotropy_acc.update(tokens, sid)
    ft = st.transforms
    for name in names:
        if name != "none" and name in st.outliers:
            st.outliers[name].update(ft.apply(name, tokens))
    if not names or not st.self_sim:
        return
    wv, mask, keys = word_vectors(h, b, word_index, lowercase)
    if wv is None:
        return
    has_words = mask.any(1)
    flat_keys = keys.flatten()
    target = (flat_keys >= 0).nonzero().flatten()
    for name in names:
        if name not in st.self_sim:
            continue
        tv = ft.apply(name, wv)  # [L, B, W, d']
        if has_words.any():
            intra = intra_sentence_similarity(tv[:, has_words], mask=mask[has_words])  # [L, B']
            st.intra_sum[name] += intra.sum(1).cpu()
            st.intra_n[name] += int(has_words.sum())
        if target.numel():
            flat = tv.reshape(tv.shape[0], -1, tv.shape[-1])
            st.self_sim[name].update(flat[:, target.to(flat.device)], flat_keys[target])


def word_vectors(hidden: Tensor, b: Batch, word_index: dict, lowercase: bool = True
                 ) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Word vectors of a batch: the mean of each word's subword tokens.

    Returns ``(vectors [L, B, W, d], mask [B, W] bool, keys [B, W] long)``: W = most words in a row;
    ``keys`` holds the target-word index of the FIRST occurrence of a target word in its sentence and -1
    elsewhere (Ethayarajh: at most one occurrence per sentence).
    """
    n_layers, bsz, t_len, d = hidden.shape
    per_row = [word_occurrences(t, o, s, lowercase) for t, o, s in zip(b.texts, b.offsets, b.special)]
    w_max = max((len(r) for r in per_row), default=0)
    if w_max == 0:
        return None, None, None
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
    dev = hidden.device
    src_t, dst_t = torch.tensor(src, device=dev), torch.tensor(dst, device=dev)
    flat = hidden.reshape(n_layers, bsz * t_len, d)
    out = torch.zeros(n_layers, bsz * w_max, d, dtype=hidden.dtype, device=dev).index_add_(1, dst_t, flat[:, src_t])
    out = out / counts.to(dev).clamp_min(1)[None, :, None]
    return out.reshape(n_layers, bsz, w_max, d), (counts > 0).reshape(bsz, w_max).to(dev), keys



# -------------------------------------------------------------------------------------------- from a context
def _get(node, key: str, default=None):
    if node is None:
        return default
    value = node.get(key, default) if hasattr(node, "get") else getattr(node, key, default)
    return default if value is None and default is not None else value


def evaluation_sentences(data_cfg) -> list[str]:
    """``data.files`` (one sentence per line) or the shipped *Persuasion* sentences, first ``data.max_sentences``."""
    from datamodules.probe_data import load_position_texts

    files = _get(data_cfg, "files")
    files = [str(f) for f in files] if files is not None and not isinstance(files, str) else files
    return load_position_texts(files, _get(data_cfg, "max_sentences"))


def sentence_stats(ctx) -> SentenceStats:
    """The shared pass of an ``evaluate.py`` run (run once, cached in ``ctx.shared``), configured from
    ``ctx.root_cfg`` for every selected analysis at once: outlier statistics of every transform when
    ``outliers`` is selected, the anisotropy reservoir for ``anisotropy``/``self_similarity``, words for
    ``self_similarity``, the sentence whitener also when WiC/STS use ``transform.fit_on=sentences``."""
    if "sentence_stats" in ctx.shared:
        return ctx.shared["sentence_stats"]
    cfg = ctx.root_cfg
    selected = set(cfg.analyses)
    tcfg, ocfg = cfg.get("transform"), cfg.get("outliers")
    acfg, scfg = cfg.get("anisotropy"), cfg.get("self_similarity")
    texts = evaluation_sentences(cfg.get("data"))
    fit_on = str(_get(tcfg, "fit_on", "eval"))
    st = run_sentence_pass(
        ctx.encoder, texts, ctx.transforms,
        outlier_transforms=list(ctx.transforms) if "outliers" in selected else ["none"],
        need_anisotropy=bool(selected & {"anisotropy", "self_similarity"}),
        need_self_sim="self_similarity" in selected,
        need_whitener=fit_on == "sentences" and bool(selected & {"wic", "sts"}),
        clip_dims=_get(tcfg, "dims"), whiten_k=_get(tcfg, "k"),
        outlier_method=str(_get(ocfg, "method", "share")), outlier_threshold=float(_get(ocfg, "threshold", 0.25)),
        outlier_k=float(_get(ocfg, "k", 3.0)),
        n_anisotropy_sentences=int(_get(acfg, "n_sentences", 2000)),
        min_sentences=int(_get(scfg, "min_sentences", 10)), max_words=_get(scfg, "max_words", 1000),
        lowercase=bool(_get(scfg, "lowercase", True)), seed=int(ctx.seed),
        batch_size=_get(cfg.get("encoder"), "batch_size"), chunk=int(_get(cfg.get("data"), "chunk", 1024)),
        progress=bool(cfg.get("progress", False)))
    source = "data.files" if _get(cfg.get("data"), "files") else "shipped Persuasion sentences (datamodules/data/eval)"
    st.settings["source"] = source
    ctx.shared["sentence_stats"] = st
    return st


def clip_dims_for_tasks(ctx) -> tuple[list[list[int]] | None, str]:
    """Clip dims WiC/STS use: ``transform.dims`` or the dims detected on the evaluation sentences."""
    if "clip" not in ctx.transforms:
        return None, ""
    dims = _get(ctx.root_cfg.get("transform"), "dims")
    n_layers, dim = ctx.encoder.num_layers + 1, ctx.encoder.hidden_size
    if dims is not None:
        per = explicit_clip_dims(dims, n_layers, dim)
        return per, clip_description(per, "given (transform.dims)")
    st = sentence_stats(ctx)
    return st.transforms.clip_dims, st.transforms.info["clip"]
