"""Typed settings of the ``evaluate.py`` analyses: one frozen, strictly typed class per section
(``outlierlab.configuration.typed_settings``), the one source of the defaults.

Every preset starts from a section's defaults and states only what it changes, so ``OutliersSettings()`` builds from
Python and equals the composed default config.  A wrong type, a value out of range or an unknown key is refused when
the object is built, in one ``ValueError`` line naming ``section.key``.  No heavy imports (no torch).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

import pydantic

from outlierlab.configuration.typed_settings import (AtLeast0, AtLeast1, AtLeast2, Floats, Ints, Names, Positive,
                                                     Probability, Share, require, settings_class)

__all__ = ["OutliersSettings", "AnisotropySettings", "IsotropySettings", "SelfSimilaritySettings", "WicSettings",
           "StsSettings", "AblationSettings", "FrequencySettings", "AttentionSinksSettings", "FrequentTokensSettings",
           "QKOutliersSettings", "OrderUseSettings", "QuantizationSettings", "LAYERNORM_KINDS"]

#: LayerNorm kinds a ``layernorms`` list may name (:func:`outlierlab.models.layernorms.select_layernorms`).
LAYERNORM_KINDS = ("output", "attention_output", "attention_input", "mlp_input", "attention_update", "mlp_update",
                   "embeddings", "final", "head", "all")

CountsFrom = Literal["auto", "pretraining", "eval", "files"]


# ----------------------------------------------------------------------------- the sentence analyses
@settings_class
class OutliersSettings:
    """``outliers``: the activation outlier rule (also what clip removes) and the position-table σ rule."""

    SECTION: ClassVar[str] = "outliers"
    #: share (Luo §2: share of tokens with their argmax/argmin on the dim) | sigma
    method: Literal["share", "sigma"] = "share"
    threshold: Share = 0.25
    k: Positive = 3.0
    #: dims listed per layer by |mean|
    top_k: AtLeast1 = 5
    #: σ rule on the mean position vector (Luo Figs. 3-4) LayerNorm weights: the ln_rule group
    #: (configs/ln_rule/kovaleva.yaml)
    position_k: Positive = 3.0


@settings_class
class AnisotropySettings:
    """``anisotropy``: sentences sampled for the cross-sentence token pairs; the rogue-dimension columns
    (Timkey & van Schijndel 2021): the k of the top-k shares and rankings, and how many dims are listed."""

    SECTION: ClassVar[str] = "anisotropy"
    #: one random token per sentence, paired -> n_sentences/2 pairs (paper: 2000 -> 1000)
    n_sentences: AtLeast2 = 2000
    #: Timkey & van Schijndel 2021: share of the anisotropy held by the top k dims, and r²/Spearman between the pair
    #: cosines with all dims and without the top k
    rogue_k: Ints = (1, 3, 5)
    #: dims listed per layer with CC_i and share (every dim: anisotropy_contributions.csv)
    rogue_list: AtLeast1 = 5

    def __post_init__(self) -> None:
        require(bool(self.rogue_k) and all(k >= 1 for k in self.rogue_k),
               f"anisotropy.rogue_k must list ks >= 1, got {list(self.rogue_k)}")


@settings_class
class IsotropySettings:
    """``isotropy``: IsoScore* shrinkage (Rudman & Eickhoff 2023)."""

    SECTION: ClassVar[str] = "isotropy"
    #: IsoScore* (Rudman & Eickhoff 2023): the anisotropy tokens' covariance shrunk toward that covariance, (1-zeta)
    #: C + zeta C0 (zeta as in their analysis.py); 0 = IsoScore of the sample
    zeta: Annotated[float, pydantic.Field(ge=0, le=1)] = 0.75


@settings_class
class SelfSimilaritySettings:
    """``self_similarity``: which words are target words."""

    SECTION: ClassVar[str] = "self_similarity"
    #: a word counts if it occurs in >= this many sentences (Ethayarajh 2019)
    min_sentences: AtLeast1 = 10
    #: seeded sample when more words qualify (paper: 1000)
    max_words: AtLeast1 | None = 1000
    lowercase: bool = True


# --------------------------------------------------------------------------------------- the tasks
@settings_class
class WicSettings:
    """``wic`` (``configs/wic/``): the pairs, the splits to choose and report on, the threshold sweep.

    Defaults: ``wic=wordnet`` (the shipped pairs); ``wic=superglue`` changes source and splits together."""

    SECTION: ClassVar[str] = "wic"
    source: str = "wordnet"
    #: train | dev | test — the sweep (and the choice of layer/threshold) runs here, as the paper's
    split: str | None = "train"
    #: honest protocol: accuracy at the threshold chosen on `split`; null = sweep only
    report_split: str | None = "test"
    #: [pairs.jsonl|csv|tsv]: sentence1, sentence2, start1, end1, start2, end2, label (+ split)
    files: Names | None = None
    #: first N pairs; null = all
    max_pairs: AtLeast1 | None = None
    thresholds: Floats = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # Luo et al. §4.2
    hub_path: str = "aps/super_glue"
    hub_name: str = "wic"

    def __post_init__(self) -> None:
        require(bool(self.files) or self.source in ("wordnet", "superglue"),
               f"unknown wic.source {self.source!r}; choose wordnet, superglue, or give wic.files=[...]")
        require(bool(self.thresholds), "wic.thresholds is empty")
        # threshold chosen on wic.split, accuracy reported on report_split: the two must differ
        require(not self.report_split or str(self.report_split) != str(self.split or ""),
               f"wic.report_split={self.report_split!r} equals wic.split: choose on one split, report on another "
               "(or wic.report_split=null for the paper's sweep only)")


@settings_class
class StsSettings:
    """``sts`` (``configs/sts/``): hub data sets and/or local files, the split, the sub-set column.

    Defaults: ``sts=none`` (no STS data can be shipped: skipped); ``sts=paper`` lists Luo et al.'s."""

    SECTION: ClassVar[str] = "sts"
    #: short names (see outlierlab/evaluation/analyses/sts.py HUB) or any hub id with sentence1/sentence2/score
    datasets: Names = ()
    #: [a.csv, b.tsv, c.jsonl]: ONE data set per file, columns sentence1, sentence2, score
    files: Names | None = None
    split: str = "test"
    #: first N pairs per dataset; null = all
    max_pairs: AtLeast2 | None = None
    #: column naming each pair's sub-set/genre (SentEval reports STS12-16 per sub-set and their mean): rows per sub-
    #: set + 'mean' when the data have it; null or absent column = pooled only
    subset_field: str | None = "genre"


# ------------------------------------------------------------------ the LayerNorm-outlier analyses
@settings_class
class _TextSettings:
    """Keys every LayerNorm-outlier analysis has: its own texts (else ``data.files``) and how many."""

    SECTION: ClassVar[str] = ""
    files: Names | None = None
    max_sentences: AtLeast1 | None = None


@settings_class
class _BatchSettings(_TextSettings):
    """The texts as the batches a model scores, and the seed of what is drawn at random."""

    #: tokens per sequence incl. special tokens (capped by the model)
    max_length: AtLeast2 = 128
    batch_size: AtLeast1 = 16
    #: masking and random draws; null = the global seed
    seed: int | None = None


@settings_class
class _MaskedSettings(_BatchSettings):
    """Scored as the ablation is: masked (or next-token) loss on the texts, packed into running text."""

    #: evaluation masking: this share of non-special tokens -> <mask> (no 80/10/10)
    mlm_probability: Probability = 0.15
    #: join consecutive sentences into sequences of <= max_length tokens (pretraining-like context)
    pack: bool = True


@settings_class
class _CountedSettings(_TextSettings):
    """Where the token frequencies come from (the frequency and frequent_tokens analyses)."""

    #: auto: our runs -> their pretraining corpus (run config.yaml), other models -> the evaluated text | pretraining
    #: (required) | eval | files (count_files)
    counts_from: CountsFrom = "auto"
    #: [a.txt, b.txt.gz] for counts_from=files
    count_files: Names | None = None

    def __post_init__(self) -> None:
        require(self.counts_from != "files" or bool(self.count_files),
               f"{self.SECTION}.counts_from=files needs {self.SECTION}.count_files=[a.txt,...]")


def _check_layernorms(section: str, kinds: tuple[str, ...] | None) -> None:
    require(kinds is None or (bool(kinds) and set(kinds) <= set(LAYERNORM_KINDS)),
           f"{section}.layernorms={list(kinds or [])}: choose from {sorted(LAYERNORM_KINDS)}")


@settings_class
class AblationSettings(_MaskedSettings):
    """``ablation`` (``configs/ablation/default.yaml``): Kovaleva et al.'s masked-LM ablation."""

    SECTION: ClassVar[str] = "ablation"
    #: first N sentences (~1 min for a tiny model on 2 CPU cores per condition set); null = all
    max_sentences: AtLeast1 | None = 600
    #: LayerNorms whose gain AND bias are zeroed; null = those the rule judges (ln_rule.layernorms) or a list of:
    #: output | attention_output | embeddings | head | all
    layernorms: Names | None = None
    #: override the detected outlier dims, e.g. [308, 381]
    outlier_dims: Ints | None = None
    #: your own dims, reported as a separate condition
    dims: Ints = ()
    #: zero only in the chosen LayerNorms of these layers (numbered as outliers.csv: 1 = the first block, 0 = the
    #: embeddings' norm; the final norm belongs to none), e.g. [1] -- where a dim is read; null = every layer
    layers: Ints | None = None
    #: random control draws (same count as the outlier dims, never including them nor `dims`)
    n_random: AtLeast0 = 5
    #: how a disabled dim is set at the norms' output: zero (Kovaleva et al. 2021: gain and bias zeroed) | mean (its
    #: mean over the scored tokens in the intact model: Sun et al. 2024's set-to-mean); the table's `mode` column
    mode: str = "zero"
    #: fill-in-the-blank shown per condition
    example: str | None = "She opened the door and walked slowly into the {mask}."
    top_k: AtLeast1 = 5

    def __post_init__(self) -> None:
        _check_layernorms("ablation", self.layernorms)
        # a str checked here rather than a Literal: OmegaConf's structured configs (test_settings_defaults) take no
        # Literal, and this class is the one that test merges
        require(self.mode in ("zero", "mean"), f"ablation.mode must be zero or mean, got {self.mode!r}")
        require(not self.example or "{mask}" in self.example,
               f"ablation.example must contain the placeholder {{mask}}: {self.example!r}")


@settings_class
class QuantizationSettings(_MaskedSettings):
    """``quantization``: the W8A8 cost of outliers (Bondarenko et al. 2023; Dettmers et al. 2022, LLM.int8())."""

    SECTION: ClassVar[str] = "quantization"
    #: first N sentences (the ablation's texts by default, so the two analyses score the same tokens); null = all
    max_sentences: AtLeast1 | None = 600
    #: bits of weights (per output channel) and inputs (per tensor), symmetric absmax: 8 = W8A8
    bits: int = 8
    #: w8a8_keep: this many largest-|x| input dims of every quantized input stay in full precision; 0 = no such row
    keep: AtLeast0 = 4
    #: also one block quantized at a time (where the damage comes from)
    per_layer: bool = True

    def __post_init__(self) -> None:
        require(2 <= self.bits <= 16, f"quantization.bits must be between 2 and 16, got {self.bits}")


@settings_class
class FrequencySettings(_CountedSettings):
    """``frequency`` (``configs/frequency/default.yaml``): Puccetti et al.'s frequency correlation."""

    SECTION: ClassVar[str] = "frequency"
    max_sentences: AtLeast1 | None = 1000
    #: null: LayerNorm outlier dims (detect: below), else activation outliers; or e.g. [308, 381]
    dims: Ints | None = None
    #: at most this many dims (strongest first) (LayerNorm outlier dims: the one rule, configs/ln_rule)
    max_dims: AtLeast1 = 8
    #: magnitude: mean |h| of the dim per token type (Puccetti et al.) | signed: mean h
    value: Literal["magnitude", "signed"] = "magnitude"
    #: activation-outlier fallback (Luo et al. argmax/argmin share)
    share_threshold: Share = 0.25
    #: token types seen fewer times in the evaluated text are left out
    min_occurrences: AtLeast1 = 1
    #: hidden-state layers of the scatter (0 = embeddings); null = [middle, last]
    plot_layers: Ints | None = None


@settings_class
class OrderUseSettings(_BatchSettings):
    """``order_use`` (``configs/order_use/default.yaml``): permuted-token loss minus intact loss, attention locality."""

    SECTION: ClassVar[str] = "order_use"
    max_sentences: AtLeast1 | None = 200
    #: masked LMs: sentences packed into running-text pieces of this many tokens
    max_length: Annotated[int, pydantic.Field(ge=4)] = 128
    #: masked LMs: share of tokens masked (all behind the mask token), seeded
    mlm_probability: Probability = 0.15
    #: below this: "the model does not use token order yet"
    threshold: float = 0.1


@settings_class
class AttentionSinksSettings(_BatchSettings):
    """``attention_sinks`` (``configs/attention_sinks/default.yaml``): attention mass on special tokens."""

    SECTION: ClassVar[str] = "attention_sinks"
    max_sentences: AtLeast1 | None = 200
    #: where the outlier dims are disabled (as ablation.layernorms; null = the LayerNorms the one rule judges,
    #: configs/ln_rule)
    layernorms: Names | None = None
    #: null: the detected outlier dims; or e.g. [308, 381]
    dims: Ints | None = None
    #: Gu et al. 2025: a sink head puts mean attention > 0.3 on <s> (</s>)
    sink_threshold: Probability = 0.3
    #: control: as many random dims disabled (never the outlier dims), mean over draws; 0 = none
    n_random: AtLeast0 = 1

    def __post_init__(self) -> None:
        _check_layernorms("attention_sinks", self.layernorms)


@settings_class
class FrequentTokensSettings(_MaskedSettings, _CountedSettings):
    """``frequent_tokens`` (``configs/frequent_tokens/default.yaml``): Macocco et al. 2025's heuristic."""

    SECTION: ClassVar[str] = "frequent_tokens"
    max_sentences: AtLeast1 | None = 600
    #: Macocco et al.: median |h_d| above this percentile of all |h| (and of |W| rows)
    percentile: Annotated[float, pydantic.Field(gt=0, lt=100)] = 99.0
    #: Luo et al.'s argmax/argmin share rule on h
    share_threshold: Share = 0.25
    #: random-dim control draws: as many dims as each rule found, never those nor either Macocco set (last-layer,
    #: unembedding outliers); they draw 5
    n_random: AtLeast0 = 5
    #: tokens counted fewer times are not in the corpus list (left out of every Spearman)
    min_count: AtLeast1 = 1
    #: decoders: late = Macocco et al.'s one position per sequence (token late_position, scored against the next);
    #: every = every next-token position (ours before)
    positions: Literal["late", "every"] = "late"
    #: 0-based token index (special tokens counted); shorter sequences are left out
    late_position: AtLeast0 = 100


@settings_class
class QKOutliersSettings(_TextSettings):
    """``qk_outliers`` (``configs/qk_outliers/default.yaml``): Jonasson 2025's query/key features."""

    SECTION: ClassVar[str] = "qk_outliers"
    #: first N sentences; null = data.max_sentences
    max_sentences: AtLeast1 | None = 1000
    #: outlier dim of a head: max |.| more than k sigma above the mean over that head's dims
    k: Positive = 3.0
    #: partial-cycle bound: a pair turning fewer times than this over the context can carry a rotary offset feature
    #: (Jonasson 2025)
    max_cycles: Positive = 1.0
