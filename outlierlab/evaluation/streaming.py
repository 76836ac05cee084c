"""The one streaming pass over the evaluation sentences, shared by outliers, anisotropy and self-similarity.

Memory never grows with the number of sentences: texts are tokenized ``chunk`` at a time, every batch's
hidden states are reduced into running statistics and dropped — one layer at a time as the model produces
them (``one_pass=True``, the default: :mod:`outlierlab.evaluation.one_pass`), or all ``[L+1, B, T, d]`` at once
(``one_pass=False``, the reference):

* :class:`outlierlab.analysis.outlier_stats.OutlierAccumulator` — per-layer mean vector, argmax/argmin counts (Luo et al. 2021 §2);
* :class:`outlierlab.analysis.transforms.Whitener` — float64 Σx and Σxxᵀ, from which whiten (Su et al. 2021),
  standardize, abtt and center are all fitted, and Σ itself for IsoScore (:mod:`outlierlab.evaluation.isotropy`)
  — with one pass summed from the stored tokens after it, one layer at a time (``Whitener.fit_by_layer``);
* :class:`outlierlab.analysis.similarity.AnisotropyAccumulator` — a reservoir of one random token of each of at most
  ``n_sentences`` sentences (Ethayarajh 2019; Luo §4.1: 2000 sentences → 1000 pairs);
* :class:`outlierlab.analysis.similarity.SelfSimilarityAccumulator` — per target word, Σ of unit vectors (Ethayarajh 2019),
  and a running sum of intra-sentence similarities.

Clip needs the outlier dims and whiten needs a fitted whitener before they can be applied: **the fit** accumulates
the raw (``none``) statistics, the outlier counts that clip detects its dims from, and the whitener sums; **the
apply step** accumulates the statistics of the transforms fitted only then — from the tokens the single pass kept
(one pass, issue 39), or by re-encoding the sentences (``one_pass=False``: two passes, no disk).  Anisotropy needs
neither: the reservoir holds raw vectors and the fitted transform is applied to it afterwards (the reservoir's
choice of tokens does not depend on vector values, so this equals running the accumulator on transformed
vectors).  The apply step is skipped when no selected analysis needs it.

Words (self-similarity, intra-sentence similarity) come from :mod:`outlierlab.evaluation.words`; encoding in bounded
memory from :mod:`outlierlab.evaluation.encoding`; the transforms and their settings from :mod:`outlierlab.analysis.transform_fit`
(the whitener is guarded against fits on too few distinct vectors, :meth:`outlierlab.analysis.whitening.Whitener.check`).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor

from outlierlab.analysis.outlier_dims import detect_outlier_dims
from outlierlab.analysis.outlier_stats import OutlierAccumulator
from outlierlab.analysis.similarity import (AnisotropyAccumulator, SelfSimilarityAccumulator, anisotropy,
                                 intra_sentence_similarity)
from outlierlab.evaluation.activation_pass import ActivationObserver
from outlierlab.evaluation.one_pass import fit_from_store, layer_pass, replay
from outlierlab.datamodules.probe_data import load_position_texts
from outlierlab.analysis.transforms import FITTED, TRANSFORMS, Whitener, clip_description, clip_dims_per_layer
from outlierlab.evaluation.encoding import (Batch, EncodeLog, finish_encode_log, iter_batches,  # noqa: F401 (re-exported)
                                 progress_bar)
from outlierlab.evaluation.settings import (AnisotropySettings, DataSettings, EncoderSettings, OutliersSettings,
                                 SelfSimilaritySettings, TransformSettings, section_settings)
from outlierlab.analysis.transform_fit import FittedTransforms, WhitenSettings, given_clip_dims  # noqa: F401
from outlierlab.evaluation.words import (WORD_RE, char_span_tokens, select_words, sentence_word_counts,  # noqa: F401
                              word_occurrences, word_vectors)

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
    activations: Any = None  # outlierlab.evaluation.activation_pass.ActivationObserver of the first pass, if asked

    def anisotropy(self, name: str) -> Tensor:
        """Anisotropy per layer (Tensor[L+1], float64) of the reservoir after transform ``name``."""
        return torch.cat([anisotropy(*self.anisotropy_pairs(name, layer)) for layer in range(self.num_layers)]
                         ).to(torch.float64)

    def anisotropy_pairs(self, name: str, layer: int) -> tuple[Tensor, Tensor]:
        """One layer's anisotropy pairs after transform ``name``: two float32 ``[1, P, d']``.  The analyses
        read the reservoir this way, one layer at a time: ``[L, P, d]`` float64 copies would be ≈ 10 GB at
        70B (issue 39)."""
        if self.anisotropy_acc is None:
            raise ValueError("anisotropy was not accumulated in this pass")
        a, b = self.anisotropy_acc.pair_vectors(layer)
        tf = self.transforms.get(name, self.dim).select([layer])
        return tf(a), tf(b)

    def release_layer_state(self) -> None:
        """Drop what grows with L·d² or L·n·d — the fitted maps and Σ (``[L, d, d]``) and the anisotropy
        reservoir — once no analysis left reads them (``evaluate.py``, before WiC/STS encode their own
        sentences and fit their own maps: not both at once; issue 39; maps kept on disk delete their files).
        Clip's dims, the fit descriptions
        (CSV columns) and every accumulated statistic stay."""
        for w in {id(w): w for w in [*self.transforms.fitted.values(), self.transforms.source] if w}.values():
            w.W = w.cov = w._eig = None
            w._applied_cache = None
        self.anisotropy_acc = None

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


def _model_dtype(encoder) -> torch.dtype:
    """The 16-bit dtype of the encoder's weights (its hidden states come out in it), else float32."""
    params = getattr(getattr(encoder, "model", None), "parameters", None)
    p = next(iter(params()), None) if callable(params) else None
    return p.dtype if p is not None and p.dtype in (torch.bfloat16, torch.float16) else torch.float32


def run_sentence_pass(encoder, texts: Sequence[str], transforms: Sequence[str] = TRANSFORMS, *,
                      outlier_transforms: Sequence[str] = ("none",), need_anisotropy: bool = True,
                      need_self_sim: bool = True, need_whitener: bool = False,
                      clip_dims: Sequence[int] | None = None, whiten_k: int | None = None,
                      clip_dims_by_layer: dict | None = None, whiten: WhitenSettings | None = None,
                      outlier_method: str, outlier_threshold: float, outlier_k: float,
                      n_anisotropy_sentences: int, min_sentences: int, max_words: int | None,
                      lowercase: bool, seed: int, chunk: int, batch_size: int | None = None,
                      progress: bool = False, need_activations: bool = False,
                      need_covariance: bool = False, one_pass: bool = True) -> SentenceStats:
    """Run the fit pass (and, if needed, the apply pass) over ``texts``; see the module docstring.

    The keywords that ``configs/evaluate.yaml`` sets have no Python default (the YAML states each default once):
    pass them from a composed config with ``**pass_settings(cfg)``.

    Parameters
    ----------
    encoder : outlierlab.models.loading.FrozenEncoder (or anything with its ``tokenize``/``batches`` API)
    transforms : transforms to compare (subset of none, clip, whiten)
    outlier_transforms : transforms whose outlier statistics are wanted ("none" is always accumulated:
        clip detects its dims from it)
    need_whitener : fit the selected fitted transforms (whiten, standardize, abtt, center) even if no statistic
        here needs them (WiC/STS ``transform.fit_on=sentences``); each is always fitted when it is in
        ``transforms`` and a statistic here needs it
    need_covariance : stream the float64 covariance Σ of every layer even when no fitted transform needs it
        (``SentenceStats.transforms.source.cov``: IsoScore, :mod:`outlierlab.evaluation.isotropy`)
    clip_dims, clip_dims_by_layer : ``transform.dims`` (same dims in every layer) or ``transform.dims_by_layer``
        (per layer range, Luo et al. App. D.1), or neither to detect per layer on these sentences with
        :func:`outlierlab.analysis.outlier_dims.detect_outlier_dims` (``outlier_method``/``threshold``/``k``)
    whiten : k and the degenerate-fit guard (:class:`outlierlab.analysis.transform_fit.WhitenSettings`); ``whiten_k``
        alone is the same with the default guard
    one_pass : encode the sentences once, one layer in memory at a time, and apply the transforms fitted from
        that pass to its stored tokens (:mod:`outlierlab.evaluation.one_pass`); False = the two-pass reference
        (re-encode to apply), same results
    need_activations : also run :class:`outlierlab.evaluation.activation_pass.ActivationObserver` (kurtosis, max/median,
        inf-norm by site) along the first pass, into ``SentenceStats.activations``
    """
    texts = [t for t in texts if t.strip()]
    if len(texts) < 2:
        raise ValueError(f"need at least 2 non-empty evaluation sentences, got {len(texts)}")
    bad = [t for t in transforms if t not in TRANSFORMS]
    if bad:
        raise ValueError(f"unknown transform(s) {bad}; valid: {', '.join(TRANSFORMS)}")
    n_layers, dim = encoder.num_layers + 1, encoder.hidden_size
    wanted_stats = set(outlier_transforms) | (set(transforms) if (need_anisotropy or need_self_sim) else set())
    fitted = [t for t in transforms if t in FITTED and (need_whitener or t in wanted_stats)]
    whiten = whiten if whiten is not None else WhitenSettings(k=whiten_k)
    ft = FittedTransforms()
    if clip_dims is not None or clip_dims_by_layer:
        ft.clip_dims, source = clip_dims_per_layer(n_layers, dim, clip_dims, clip_dims_by_layer)
        ft.info["clip"] = clip_description(ft.clip_dims, source)
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
        # a reservoir no larger than the sentences it can hold: the same draws (the generator is consumed the
        # same way whatever the capacity), without [L+1, 2000, d] float32 allocated for a short text list
        st.anisotropy_acc = AnisotropyAccumulator(n_layers, dim, max(2, min(n_anisotropy_sentences, len(texts))),
                                                  seed=seed, dtype=_model_dtype(encoder))
    need_fit = bool(fitted) or need_covariance
    # two passes: the sums stream along pass 1; one pass: they are taken from the stored tokens afterwards
    whitener = whiten.new(n_layers, dim) if need_fit and not one_pass else None

    def setup(names: list[str], word_sums: bool = True) -> None:
        for name in names:
            d = ft.out_dim(name, dim)
            if name in outlier_transforms and name not in st.outliers:
                st.outliers[name] = OutlierAccumulator(n_layers, d)
            if need_self_sim:
                if word_sums:  # the replay makes its own, one layer at a time: no [L, K, d] here
                    st.self_sim[name] = SelfSimilarityAccumulator(n_layers, d, range(len(words)))
                st.intra_sum[name] = torch.zeros(n_layers, dtype=torch.float64)
                st.intra_n[name] = 0

    # pass 1: everything ready now (none, clip with given dims) + the fit sums
    now = [t for t in transforms if ft.ready(t) and t in wanted_stats]
    # what pass 2 will do: statistics of clip/whiten that need token or word vectors (anisotropy does not:
    # the fitted transform is applied to its reservoir afterwards)
    later = [t for t in transforms if not ft.ready(t) and t in wanted_stats
             and (t in outlier_transforms or need_self_sim)]
    keep_tokens = one_pass and (bool(later) or need_fit)  # the pass stores its tokens for a replay
    # with a replay, the word statistics of `now` are taken there too, one layer at a time, from the same
    # stored tokens in the same order (the same sums): no [L, K, d] float64 beside the forward (issue 39)
    words_later = list(now) if keep_tokens and need_self_sim else []
    setup(now, word_sums=not words_later)
    st.activations = ActivationObserver(encoder) if need_activations else None
    kept = None
    with st.activations or contextlib.nullcontext():
        if one_pass:  # one forward, one layer at a time; what `later` needs is stored (outlierlab.evaluation.one_pass)
            _, kept = layer_pass(encoder, texts, st, now, None, word_index, lowercase, need_self_sim,
                                 keep_tokens, batch_size, chunk, progress,
                                 "pass 1/1 (+ stored tokens)" if later or need_fit else "pass 1/1")
            if need_fit:  # from the stored tokens, one layer at a time: no (L+1)·d² sums beside the forward
                whitener = fit_from_store(whiten, kept.store, [(s, n, None) for s, n, _, _ in kept.batches],
                                          kept.devices, n_layers, dim, fitted, keep_cov=need_covariance)
        else:
            _one_pass(encoder, texts, st, now, whitener, word_index, lowercase, need_self_sim, batch_size, chunk,
                      progress, "pass 1/2 (fit)" if later else "pass 1/1")
    for acc in st.self_sim.values():  # complete after the first pass: [L, K, d] -> [L, K] (issue 39)
        acc.compact()
    try:
        _fit_and_apply(encoder, texts, st, transforms, fitted, later, whitener, whiten, kept, one_pass, setup,
                       word_index, lowercase, need_self_sim, batch_size, chunk, progress, outlier_method,
                       outlier_threshold, outlier_k, words_later)
    finally:  # a refused fit (degenerate whitening) must not leave the stored tokens behind in $TMPDIR
        if kept is not None and kept.store is not None:
            kept.store.cleanup()
    for acc in st.self_sim.values():  # the transforms fitted after the pass, compacted too
        acc.compact()
    return st


def _fit_and_apply(encoder, texts, st, transforms, fitted, later, whitener, whiten, kept, one_pass, setup,
                   word_index, lowercase, need_self_sim, batch_size, chunk, progress, outlier_method,
                   outlier_threshold, outlier_k, words_later=()) -> None:
    """Fit clip's dims and the fitted transforms from the first pass, then the statistics of ``later`` (and the
    word statistics of ``words_later``, transforms of the first pass whose words the replay takes)."""
    ft, n_layers = st.transforms, st.num_layers
    # fit clip dims and whitener from pass 1
    if "clip" in transforms and ft.clip_dims is None:
        acc = st.outliers["none"]
        ft.clip_dims = (detect_outlier_dims(acc, outlier_method, outlier_threshold, outlier_k) if acc.count
                        else [[] for _ in range(n_layers)])
        rule = (f"share >= {outlier_threshold:g}" if outlier_method == "share" else f"|mean| outside {outlier_k:g}σ")
        ft.info["clip"] = clip_description(ft.clip_dims, f"detected per layer on the {len(texts)} evaluation "
                                                         f"sentences (outlierlab.analysis.outlier_dims.detect_outlier_dims, {rule})")
    if whitener is not None:  # refuses a degenerate fit (too few distinct vectors) in one line
        ft.set_all(whiten.fit_all(whitener, fitted,
                                  f"the non-special token vectors of the {len(texts)} evaluation sentences"),
                   source=whitener.finalize(release_sums=True, keep_eigvecs=False) if whitener.W is None else whitener)
    # pass 2: the transforms fitted in pass 1
    if later:
        setup(later, word_sums=not one_pass)
    if one_pass and (later or words_later):
        replay(st, later, kept, words_now=words_later)
    elif later:
        _one_pass(encoder, texts, st, later, None, word_index, lowercase, need_self_sim, batch_size, chunk,
                  progress, "pass 2/2 (apply)")


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
        if st.activations is not None:
            st.activations.observe(h, valid, b.attention_mask, b.input_ids)
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


# -------------------------------------------------------------------------------------------- from a context
def evaluation_sentences(data: DataSettings) -> list[str]:
    """``data.files`` (one sentence per line) or the shipped *Persuasion* sentences, first ``data.max_sentences``."""
    return load_position_texts(None if data.files is None else list(data.files), data.max_sentences)


def pass_settings(cfg) -> dict[str, Any]:
    """The keywords of :func:`run_sentence_pass` that an ``evaluate.py`` config sets (sections ``outliers``,
    ``anisotropy``, ``self_similarity``, ``data.chunk`` and the top-level ``seed``), read from the composed
    config so that a direct caller and ``evaluate.py`` use the same, once-stated defaults."""
    o, a = section_settings(OutliersSettings, cfg), section_settings(AnisotropySettings, cfg)
    ss, data = section_settings(SelfSimilaritySettings, cfg), section_settings(DataSettings, cfg)
    return dict(outlier_method=o.method, outlier_threshold=o.threshold, outlier_k=o.k,
                n_anisotropy_sentences=a.n_sentences, min_sentences=ss.min_sentences, max_words=ss.max_words,
                lowercase=ss.lowercase, seed=int(cfg.seed), chunk=data.chunk)


def sentence_stats(ctx) -> SentenceStats:
    """The shared pass of an ``evaluate.py`` run (run once, kept in ``ctx.shared.sentence_stats``), configured
    from the sections of ``ctx.root_cfg`` for every selected analysis at once: outlier statistics of every
    transform when ``outliers`` is selected, the anisotropy reservoir for ``anisotropy``/``self_similarity``,
    words for ``self_similarity``, the sentence whitener also when WiC/STS use ``transform.fit_on=sentences``."""
    if ctx.shared.sentence_stats is not None:
        return ctx.shared.sentence_stats
    cfg = ctx.root_cfg
    selected = set(cfg.analyses)
    t, data = section_settings(TransformSettings, cfg), section_settings(DataSettings, cfg)
    st = run_sentence_pass(
        ctx.encoder, evaluation_sentences(data), ctx.transforms, **pass_settings(cfg),
        outlier_transforms=list(ctx.transforms) if "outliers" in selected else ["none"],
        need_anisotropy=bool(selected & {"anisotropy", "self_similarity", "isotropy"}),
        need_self_sim="self_similarity" in selected,
        need_whitener=t.fit_on == "sentences" and bool(selected & {"wic", "sts"}),
        clip_dims=None if t.dims is None else list(t.dims), clip_dims_by_layer=t.dims_by_layer,
        whiten=WhitenSettings.from_settings(t),
        batch_size=section_settings(EncoderSettings, cfg).batch_size,
        progress=bool(cfg.progress), need_activations="outliers" in selected,
        need_covariance="isotropy" in selected, one_pass=data.one_pass)
    st.settings["source"] = "data.files" if data.files else "shipped Persuasion sentences (outlierlab/datamodules/data/eval)"
    ctx.shared.sentence_stats = st
    return st


def clip_dims_for_tasks(ctx) -> tuple[list[list[int]] | None, str]:
    """Clip dims WiC/STS use: ``transform.dims``/``dims_by_layer`` or the dims detected on the evaluation
    sentences."""
    if "clip" not in ctx.transforms:
        return None, ""
    per, info = given_clip_dims(section_settings(TransformSettings, ctx.root_cfg), ctx.encoder.num_layers + 1,
                                ctx.encoder.hidden_size)
    if per is not None:
        return per, info
    st = sentence_stats(ctx)
    return st.transforms.clip_dims, st.transforms.info["clip"]
