"""The shared pass over the evaluation sentences: outliers, anisotropy, isotropy and self-similarity subscribe their
statistics to one ``LayerStream``.

Memory never grows with the sentences: texts are tokenized ``chunk`` at a time and each layer of each batch is reduced
as produced.  The subscribers: ``OutlierCounts`` (Luo et al. 2021 §2; the raw ones give clip its dims),
``AnisotropyReservoir`` (Ethayarajh 2019; Luo §4.1), ``WordSimilarity`` (Ethayarajh 2019) and ``ActivationObserver``.

Clip's dims and the fitted maps need a fit before they apply, so the pass is two loops with **the fit** between: the
forward feeds the raw statistics and stores the tokens, the maps are summed from them layer by layer, and the replay
feeds the fitted transforms.  No replay when nothing needs it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import Tensor

from outlierlab.metrics.layer_accumulators import layer_views, stack_layers
from outlierlab.metrics.outlier_dims import detect_outlier_dims
from outlierlab.metrics.outlier_stats import OutlierAccumulator
from outlierlab.metrics.similarity import (AnisotropyAccumulator, SelfSimilarityAccumulator, anisotropy,
                                            intra_sentence_similarity)
from outlierlab.metrics.transforms import (FITTED, TRANSFORMS, DegenerateWhiteningError, Whitener, clip_description,
                                            clip_dims_per_layer)
from outlierlab.datamodules.probe_data import load_position_texts
from outlierlab.evaluation.encoding import EncodeLog
from outlierlab.configuration.run_settings import DataSettings, EncoderSettings, TransformSettings
from outlierlab.configuration.analysis_settings import OutliersSettings, SelfSimilaritySettings
from outlierlab.configuration.settings_store import section_settings
from outlierlab.evaluation.sentence_stream import Consumer, LayerStream, StreamBatch, WordVectors
from outlierlab.metrics.transform_fit import FittedTransforms, WhitenSettings, given_clip_dims
from outlierlab.evaluation.words import select_words

# -------------------------------------------------------------------------------------------- the pass
@dataclass
class SentenceStats:
    """What the shared pass itself knows: fitted transforms, raw outlier counts, target words, the encoding."""

    num_layers: int  # L+1 (embedding output + every layer)
    dim: int
    n_sentences: int
    transforms: FittedTransforms
    outliers: dict[str, OutlierAccumulator] = field(default_factory=dict)  # the raw ("none") counts: clip's dims
    words: list[str] = field(default_factory=list)
    passes: list[EncodeLog] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    def release_layer_state(self) -> None:
        """Drop the fitted maps and Σ (``[L, d, d]``) once no analysis reads them; clip's dims stay."""
        for w in {id(w): w for w in [*self.transforms.fitted.values(), self.transforms.source] if w}.values():
            w.release_maps()

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


# ------------------------------------------------------------------------------ what the pass subscribes
class OutlierCounts(Consumer):
    """Luo et al. 2021 §2: per-layer mean vector and argmax/argmin counts after ``transform``."""

    def __init__(self, transform: str, num_layers: int) -> None:
        self.transform, self.layers, self.key = transform, [None] * num_layers, ("outlier_counts", transform)

    def update(self, layer: int, vectors: Tensor, batch: StreamBatch) -> None:
        if self.layers[layer] is None:  # d' is known only now: whiten with k < d
            self.layers[layer] = OutlierAccumulator(1, vectors.shape[-1])
        self.layers[layer].update(vectors)

    def result(self, dim: int | None = None) -> OutlierAccumulator:
        """The layers stacked; a layer that saw no token is empty, of width ``dim`` (default: the others' ``d'``)."""
        dim = next((a.sum.shape[-1] for a in self.layers if a is not None), dim)
        return stack_layers([a if a is not None else OutlierAccumulator(1, dim) for a in self.layers])


class AnisotropyReservoir(Consumer):
    """Ethayarajh 2019; Luo §4.1: a random raw token of each of at most ``capacity`` sentences per layer."""

    def __init__(self, capacity: int, seed: int) -> None:
        self.capacity, self.seed, self.key = capacity, seed, ("anisotropy_reservoir", capacity, seed)
        self.full: AnisotropyAccumulator | None = None
        self.stacked: AnisotropyAccumulator | None = None

    def start(self, stream: LayerStream) -> None:
        if self.full is None:  # no larger than the sentences it can hold: the same draws (the generator is consumed
            # the same way whatever the capacity) without [L+1, 2000, d] allocated for a short text list
            cap = max(2, min(self.capacity, len(stream.texts)))
            self.full = AnisotropyAccumulator(stream.num_layers, stream.dim, cap, seed=self.seed,
                                              dtype=_model_dtype(stream.encoder))
            self.views = layer_views(self.full)  # rows of one [L, capacity, d] tensor, filled in place

    def update(self, layer: int, vectors: Tensor, batch: StreamBatch) -> None:
        self.views[layer].update(vectors, batch.sentence_ids.to(vectors.device))
        self.stacked = None

    def result(self) -> AnisotropyAccumulator:
        if self.full is None:
            raise ValueError("the anisotropy reservoir was not fed: subscribe it to a sentence pass first")
        if self.stacked is None:  # once: every layer x transform of three analyses reads it
            self.stacked = stack_layers(self.views, base=self.full)
        return self.stacked

    def pairs(self, transforms: FittedTransforms, name: str, layer: int) -> tuple[Tensor, Tensor]:
        """One layer's anisotropy pairs after ``name``, two float32 ``[1, P, d']`` (all layers: ≈ 10 GB at 70B)."""
        a, b = self.result().pair_vectors(layer)
        return tuple(transforms.get(name, self.full.vectors.shape[-1]).select([layer])(x) for x in (a, b))

    def anisotropy(self, transforms: FittedTransforms, name: str) -> Tensor:
        """Anisotropy per layer (Tensor[L+1], float64) of the reservoir after transform ``name``."""
        return torch.cat([anisotropy(*self.pairs(transforms, name, layer)) for layer in range(self.full.num_layers)]
                         ).to(torch.float64)


class WordSimilarity(Consumer):
    """Ethayarajh 2019: per target word the sum of its unit vectors (self-similarity) and per sentence the mean
    similarity of its words (intra-sentence), after ``transform``; each layer's sums kept as squared norms."""

    words = True

    def __init__(self, transform: str) -> None:
        self.transform, self.key = transform, ("word_similarity", transform)
        self.layers: list[SelfSimilarityAccumulator | None] | None = None

    def start(self, stream: LayerStream) -> None:
        if self.layers is None:  # fed by one stream at a time; a second one adds to what it has
            self.n_words, self.dim = len(stream.word_index), stream.dim
            self.layers = [None] * stream.num_layers
            self.intra_sum = torch.zeros(stream.num_layers, dtype=torch.float64)
            self.intra_n = 0

    def update(self, layer: int, words: WordVectors, batch: StreamBatch) -> None:
        if self.layers[layer] is None:
            self.layers[layer] = SelfSimilarityAccumulator(1, words.vectors.shape[-1], range(self.n_words))
        has_words = words.mask.any(1)
        if has_words.any():  # every sentence with words (the common case): no boolean-index copy
            x, m = ((words.vectors, words.mask) if bool(has_words.all())
                    else (words.vectors[:, has_words], words.mask[has_words]))
            self.intra_sum[layer] += intra_sentence_similarity(x, mask=m).sum(1).cpu()[0]
        if layer == 0:
            self.intra_n += batch.n_with_words()
        keys = words.keys.flatten()
        target = (keys >= 0).nonzero().flatten()
        if target.numel():
            rows = words.vectors.reshape(1, -1, words.vectors.shape[-1])
            self.layers[layer].update(rows[:, target.to(rows.device)], keys[target])

    def end_layer(self, layer: int) -> None:
        if self.layers[layer] is not None:
            self.layers[layer].compact()

    def result(self) -> SelfSimilarityAccumulator:
        """The layers stacked; a layer that saw no target word is empty (of the width the others had)."""
        if self.layers is None:
            raise ValueError(f"word similarity ({self.transform}) was not fed: subscribe it to a sentence pass first")
        dim = next((a.dim for a in self.layers if a is not None), self.dim)
        return stack_layers([a if a is not None else SelfSimilarityAccumulator(1, dim, range(self.n_words)).compact()
                             for a in self.layers])

    def intra_sentence(self) -> Tensor:
        """Mean intra-sentence similarity per layer (raw, not adjusted), Tensor[L+1] float64."""
        return self.intra_sum / max(1, self.intra_n)


class WhitenerSums(Consumer):
    """Σx and Σxxᵀ (float64) streamed along the forward, only without a token store (``data.one_pass=false``)."""

    def __init__(self, whitener: Whitener) -> None:
        self.full, self.views = whitener, layer_views(whitener)

    def update(self, layer: int, vectors: Tensor, batch: StreamBatch) -> None:
        self.views[layer].partial_fit(vectors)

    def result(self) -> Whitener:
        return stack_layers(self.views, base=self.full)


# -------------------------------------------------------------------------------------------- the pass
def run_sentence_pass(encoder, texts: Sequence[str], transforms: Sequence[str] = TRANSFORMS, *,
                      outliers: OutliersSettings = OutliersSettings(),
                      self_similarity: SelfSimilaritySettings = SelfSimilaritySettings(),
                      data: DataSettings = DataSettings(), transform: TransformSettings = TransformSettings(),
                      seed: int = 0, batch_size: int | None = None, progress: bool = False,
                      need_whitener: bool = False, need_covariance: bool = False,
                      consumers: Sequence[Consumer] = ()) -> SentenceStats:
    """The shared pass over ``texts``; settings are evaluate.yaml's sections as typed classes
    (``**pass_settings(cfg)``).  ``outliers``: the rule clip detects its dims with (Luo et al. App. D.1) unless
    ``transform.dims`` is set; ``need_whitener``: fit the maps even if no consumer reads them; ``need_covariance``:
    keep every layer's Σ (IsoScore); ``consumers``: fed in the forward when their transform is ready, else in the
    replay."""
    texts, extra = _checked(texts, transforms, consumers)
    n_layers, dim = encoder.num_layers + 1, encoder.hidden_size
    ss = self_similarity
    need_words = any(c.words for c in extra)
    fitted = [t for t in transforms if t in FITTED and (need_whitener or t in {c.transform for c in extra})]
    whiten = WhitenSettings.from_settings(transform)
    ft = FittedTransforms()
    if transform.dims is not None or transform.dims_by_layer:
        ft.clip_dims, source = clip_dims_per_layer(n_layers, dim, transform.dims, transform.dims_by_layer)
        ft.info["clip"] = clip_description(ft.clip_dims, source)
    words = select_words(texts, ss.min_sentences, ss.max_words, seed, ss.lowercase) if need_words else []
    if need_words and not words:
        raise ValueError(f"no word occurs in >= {ss.min_sentences} of the {len(texts)} sentences: use more sentences "
                         "(data.max_sentences) or lower self_similarity.min_sentences")
    st = SentenceStats(n_layers, dim, len(texts), ft, words=words,  # what the report sections say
                       settings=dict(min_sentences=ss.min_sentences, max_words=ss.max_words, seed=seed))
    raw = next((c for c in extra if c.key == ("outlier_counts", "none")), None) or OutlierCounts("none", n_layers)
    consumers = list(dict.fromkeys([raw, *extra]))
    must_fit = bool(fitted) or need_covariance
    after_fit = [c for c in consumers if not ft.ready(c.transform)]
    keep = data.one_pass and (bool(after_fit) or must_fit)
    if keep:  # with a replay, every word statistic is taken there, one layer at a time: no [L, K, d] float64
        after_fit += [c for c in consumers if c.words and c not in after_fit]  # beside the forward
    sums = WhitenerSums(whiten.new(n_layers, dim)) if must_fit and not keep else None
    stream = LayerStream(encoder, texts, batch_size=batch_size, chunk=data.chunk, lowercase=ss.lowercase,
                         word_index={w: i for i, w in enumerate(words)} if need_words else None,
                         keep_tokens=keep, progress=progress)
    desc = "pass 1/1 (+ stored tokens)" if keep else "pass 1/2 (fit)" if after_fit else "pass 1/1"
    try:
        stream.forward([c for c in consumers if c not in after_fit] + ([sums] if sums else []), ft, desc)
        st.outliers["none"] = raw.result(dim)
        _fit(st, transforms, fitted, whiten, stream, sums, need_covariance, outliers)
        stream.replay(after_fit, ft)
    finally:  # a refused fit (degenerate whitening) must not leave the stored tokens behind in $TMPDIR
        stream.close()
    st.passes, st.notes = stream.logs, stream.notes
    return st


def _checked(texts: Sequence[str], transforms: Sequence[str], consumers: Sequence[Consumer]
             ) -> tuple[list[str], list[Consumer]]:
    """The non-empty texts (at least 2) and the extra subscribers, every transform known and computed."""
    texts = [t for t in texts if t.strip()]
    if len(texts) < 2:
        raise ValueError(f"need at least 2 non-empty evaluation sentences, got {len(texts)}")
    bad = [t for t in transforms if t not in TRANSFORMS]
    if bad:
        raise ValueError(f"unknown transform(s) {bad}; valid: {', '.join(TRANSFORMS)}")
    missing = sorted({c.transform for c in consumers} - {"none", *transforms})
    if missing:
        raise ValueError(f"a subscriber of the sentence stream wants transform(s) {missing}, which this run does not "
                         f"compute: add them to transform=[...] (now {', '.join(transforms)})")
    return texts, list(consumers)


def _fit(st: SentenceStats, transforms, fitted, whiten: WhitenSettings, stream: LayerStream, sums, need_covariance,
         rule: OutliersSettings) -> None:
    """The phase between the two loops: clip's dims from the raw counts, the maps from the stored tokens."""
    ft, n_texts = st.transforms, len(stream.texts)
    if "clip" in transforms and ft.clip_dims is None:
        acc = st.outliers["none"]
        ft.clip_dims = (detect_outlier_dims(acc, rule.method, rule.threshold, rule.k) if acc.count
                        else [[] for _ in range(st.num_layers)])
        how = f"share >= {rule.threshold:g}" if rule.method == "share" else f"|mean| outside {rule.k:g}σ"
        ft.info["clip"] = clip_description(ft.clip_dims, f"detected per layer on the {n_texts} evaluation "
                                           f"sentences (outlierlab.metrics.outlier_dims.detect_outlier_dims, {how})")
    if not fitted and not need_covariance:
        return
    if sums is not None:
        whitener = sums.result()
    else:  # from the stored tokens, one layer at a time: no (L+1)·d² sums beside the forward
        whitener = stream.fit(whiten, fitted, keep_cov=need_covariance)
    # refuses a degenerate fit (too few distinct vectors) in one line
    try:
        fits = whiten.fit_all(whitener, fitted, f"the non-special token vectors of the {n_texts} evaluation sentences")
    except DegenerateWhiteningError as e:
        e.texts = n_texts  # the vectors' sentences: a caller can then say how many sentences such a fit needs
        raise
    ft.set_all(fits, source=whitener.finalize(release_sums=True, keep_eigvecs=False) if whitener.W is None else whitener)

# -------------------------------------------------------------------------------------------- from a context
def pass_settings(cfg) -> dict[str, Any]:
    """``run_sentence_pass``'s settings keywords from a composed ``evaluate.py`` config."""
    return dict(outliers=section_settings(OutliersSettings, cfg),
                self_similarity=section_settings(SelfSimilaritySettings, cfg), data=section_settings(DataSettings, cfg),
                transform=section_settings(TransformSettings, cfg), seed=int(cfg.seed))


#: What an analysis may ask the shared pass's fit for (its module's ``SENTENCE_PASS``); the pass fits the union.
PASS_NEEDS = {"covariance": "Σ of every layer (IsoScore)",
              "fitted_maps": "the fitted transforms, applied after the pass (to the anisotropy reservoir) or by WiC/STS"}


def pass_needs(module, ctx) -> set[str]:
    """What ``module`` (an analysis) reads from the shared pass: its ``SENTENCE_PASS``, checked."""
    needs = getattr(module, "SENTENCE_PASS", ())
    needs = set(needs(ctx) if callable(needs) else needs)
    unknown = sorted(needs - set(PASS_NEEDS))
    if unknown:
        raise ValueError(f"{getattr(module, '__name__', module)}.SENTENCE_PASS names {unknown}; valid: "
                         f"{', '.join(PASS_NEEDS)}")
    return needs


def sentence_stats(ctx) -> SentenceStats:
    """The shared pass of an ``evaluate.py`` run (once), configured for every selected analysis."""
    if ctx.shared.sentence_stats is not None:
        return ctx.shared.sentence_stats
    cfg, needs = ctx.root_cfg, ctx.shared.needs
    settings = dict(outliers=ctx.settings(OutliersSettings), self_similarity=ctx.settings(SelfSimilaritySettings),
                    data=ctx.settings(DataSettings), transform=ctx.settings(TransformSettings), seed=ctx.seed)
    data, given = settings["data"], ctx.shared.texts
    # else data.files (one sentence per line) or the shipped Persuasion sentences, first data.max_sentences
    texts = given if given is not None else load_position_texts(None if data.files is None else list(data.files),
                                                                data.max_sentences)
    st = run_sentence_pass(
        ctx.encoder, texts, ctx.transforms, **settings,
        need_whitener="fitted_maps" in needs, batch_size=ctx.settings(EncoderSettings).batch_size,
        progress=bool(cfg.progress),
        need_covariance="covariance" in needs, consumers=ctx.shared.consumers)
    st.settings["source"] = ("the texts given" if given is not None else "data.files" if data.files
                             else "shipped Persuasion sentences (outlierlab/datamodules/data/eval)")
    ctx.shared.sentence_stats = st
    return st


def task_transforms(ctx) -> FittedTransforms:
    """The transforms of an analysis encoding its own texts (WiC, STS), clip's dims ready; maps its own."""
    ft = FittedTransforms()
    if "clip" not in ctx.transforms:
        return ft
    per, info = given_clip_dims(ctx.settings(TransformSettings), ctx.encoder.num_layers + 1,
                                ctx.encoder.hidden_size)
    if per is None:
        st = sentence_stats(ctx)
        per, info = st.transforms.clip_dims, st.transforms.info["clip"]
    ft.clip_dims, ft.info["clip"] = per, info
    return ft


def borrow_fitted_maps(ctx, ft: FittedTransforms, names) -> None:
    """Put the sentence pass's fitted maps ``names`` into ``ft`` (``transform.fit_on=sentences``)."""
    st = sentence_stats(ctx)
    for name in names:
        ft.set_whitener(st.transforms.fitted[name], st.transforms.fits[name])


def fit_on_sentences(ctx) -> set[str]:
    """WiC's and STS's ``SENTENCE_PASS``: the fitted maps with ``transform.fit_on=sentences``, else nothing."""
    return {"fitted_maps"} if ctx.settings(TransformSettings).fit_on == "sentences" else set()
