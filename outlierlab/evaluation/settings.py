"""Typed settings of the ``evaluate.py`` analyses: one frozen dataclass per config section, built by
:func:`load_settings`.

The loader itself (:func:`load_settings`, type coercion) is :mod:`outlierlab.evaluation.settings_loader`.
The composed YAML (``configs/evaluate.yaml`` and its groups: ``configs/wic/``, ``configs/ablation/`` ...) is
the ONE place a default value is stated.  A class here declares each key's name and type only, so a
changed YAML default flows through without code restating it.  The only fields with a default are keys
that may be absent from the composed config (e.g. ``transform.dims`` when the clip group is not
selected): their default is ``None``, meaning "absent".

:func:`load_settings` refuses unknown keys (listing the valid ones), missing keys and wrong types in one
line naming the section; each class checks its value ranges in ``__post_init__``.  ``evaluate.py`` builds
every selected section before any model is loaded, so a bad setting fails in seconds.

Kept free of heavy imports (no torch): ``evaluate.py`` validates with it before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from outlierlab.evaluation.settings_loader import check as _check
from outlierlab.evaluation.settings_loader import load_settings, section_settings

__all__ = ["load_settings", "section_settings", "DataSettings", "EncoderSettings", "TransformSettings",
           "OutliersSettings", "AnisotropySettings", "IsotropySettings", "SelfSimilaritySettings", "WicSettings", "StsSettings",
           "AblationSettings", "FrequencySettings", "AttentionSinksSettings", "FrequentTokensSettings",
           "QKOutliersSettings", "LAYERNORM_KINDS"]

#: LayerNorm kinds a ``layernorms`` list may name (:func:`outlierlab.models.layernorms.select_layernorms`).
LAYERNORM_KINDS = ("output", "attention_output", "attention_input", "mlp_input", "attention_update", "mlp_update",
                   "embeddings", "final", "head", "all")


#: ``encoder.dtype`` values (auto = the checkpoint's own dtype) and the ``encoder.device_map`` strings
#: accelerate accepts (a mapping ``{module: device}`` also works).
ENCODER_DTYPES = ("auto", "bfloat16", "float16", "float32")
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


# ------------------------------------------------------------------------------------- shared sections
@dataclass(frozen=True)
class DataSettings:
    """``data``: the evaluation sentences of the shared streaming pass (and the texts' fallback)."""

    SECTION: ClassVar[str] = "data"
    files: tuple[str, ...] | None
    max_sentences: int | None
    chunk: int
    one_pass: bool = True  # absent in older configs: the one-pass default

    def __post_init__(self) -> None:
        n = self.max_sentences
        _check(n is None or n >= 2, f"data.max_sentences must be >= 2 or null, got {n}")
        _check(self.chunk >= 1, f"data.chunk must be >= 1, got {self.chunk}")


@dataclass(frozen=True)
class EncoderSettings:
    """``encoder``: which encoder ``evaluate.py`` loads and how it batches."""

    SECTION: ClassVar[str] = "encoder"
    name_or_path: str
    max_length: int | None
    on_overflow: str
    device: str
    batch_size: int
    dtype: str  # auto (the checkpoint's own) | bfloat16 | float16 | float32
    device_map: str | dict | None  # null (one device) | auto | {module: device} (accelerate)
    revision: str | None  # a hub revision (branch, tag, commit: Pythia's step1000)

    def __post_init__(self) -> None:
        _check(self.dtype in ENCODER_DTYPES,
               f"encoder.dtype must be one of {', '.join(ENCODER_DTYPES)}, got {self.dtype!r}")
        _check(self.device_map is None or isinstance(self.device_map, dict) or self.device_map in DEVICE_MAPS,
               f"encoder.device_map must be null, a mapping or one of {', '.join(DEVICE_MAPS)}, "
               f"got {self.device_map!r}")
        _check(self.on_overflow in ("warn", "error"),
               f"encoder.on_overflow must be warn or error, got {self.on_overflow!r}")
        _check(self.batch_size >= 1, f"encoder.batch_size must be >= 1, got {self.batch_size}")
        _check(self.max_length is None or self.max_length >= 2,
               f"encoder.max_length must be >= 2 or null, got {self.max_length}")


@dataclass(frozen=True)
class TransformSettings:
    """``transform``: which transforms are compared and how they are fitted.  ``dims``, ``dims_by_layer``
    (clip group), ``k`` (whiten group) and ``abtt_d`` (abtt group) are absent when their group is not
    selected; ``min_fit_ratio`` and ``allow_degenerate`` guard every fitted transform (evaluate.yaml)."""

    SECTION: ClassVar[str] = "transform"
    use: dict
    fit_on: str
    dims: tuple[int, ...] | None = None
    dims_by_layer: dict | None = None
    k: int | None = None
    min_fit_ratio: float | None = None
    allow_degenerate: bool | None = None
    abtt_d: int | None = None

    def __post_init__(self) -> None:
        _check(self.k is None or self.k >= 1, f"transform.k must be >= 1 or null, got {self.k}")
        _check(self.abtt_d is None or self.abtt_d >= 0, f"transform.abtt_d must be >= 0 or null, got {self.abtt_d}")
        _check(self.min_fit_ratio is None or self.min_fit_ratio > 0,
               f"transform.min_fit_ratio must be > 0, got {self.min_fit_ratio}")


# ----------------------------------------------------------------------------- the sentence analyses
@dataclass(frozen=True)
class OutliersSettings:
    """``outliers``: the activation outlier rule (also what clip removes) and the position-table σ rule."""

    SECTION: ClassVar[str] = "outliers"
    method: str
    threshold: float
    k: float
    top_k: int
    position_k: float

    def __post_init__(self) -> None:
        _check(self.method in ("share", "sigma"), f"outliers.method must be share or sigma, got {self.method!r}")
        _check(0 < self.threshold <= 1, f"outliers.threshold must be in (0, 1], got {self.threshold}")
        _check(self.k > 0, f"outliers.k must be > 0, got {self.k}")
        _check(self.top_k >= 1, f"outliers.top_k must be >= 1, got {self.top_k}")
        _check(self.position_k > 0, f"outliers.position_k must be > 0, got {self.position_k}")


@dataclass(frozen=True)
class AnisotropySettings:
    """``anisotropy``: sentences sampled for the cross-sentence token pairs; the rogue-dimension columns
    (Timkey & van Schijndel 2021): the k of the top-k shares and rankings, and how many dims are listed."""

    SECTION: ClassVar[str] = "anisotropy"
    n_sentences: int
    rogue_k: tuple[int, ...]
    rogue_list: int

    def __post_init__(self) -> None:
        _check(self.n_sentences >= 2, f"anisotropy.n_sentences must be >= 2 (one pair), got {self.n_sentences}")
        _check(bool(self.rogue_k) and all(k >= 1 for k in self.rogue_k),
               f"anisotropy.rogue_k must list ks >= 1, got {list(self.rogue_k)}")
        _check(self.rogue_list >= 1, f"anisotropy.rogue_list must be >= 1, got {self.rogue_list}")


@dataclass(frozen=True)
class IsotropySettings:
    """``isotropy``: IsoScore* shrinkage (Rudman & Eickhoff 2023)."""

    SECTION: ClassVar[str] = "isotropy"
    zeta: float

    def __post_init__(self) -> None:
        _check(0.0 <= self.zeta <= 1.0, f"isotropy.zeta must be in [0, 1], got {self.zeta}")


@dataclass(frozen=True)
class SelfSimilaritySettings:
    """``self_similarity``: which words are target words."""

    SECTION: ClassVar[str] = "self_similarity"
    min_sentences: int
    max_words: int | None
    lowercase: bool

    def __post_init__(self) -> None:
        _check(self.min_sentences >= 1, f"self_similarity.min_sentences must be >= 1, got {self.min_sentences}")
        _check(self.max_words is None or self.max_words >= 1,
               f"self_similarity.max_words must be >= 1 or null, got {self.max_words}")


# --------------------------------------------------------------------------------------- the tasks
@dataclass(frozen=True)
class WicSettings:
    """``wic`` (``configs/wic/``): the pairs, the splits to choose and report on, the threshold sweep."""

    SECTION: ClassVar[str] = "wic"
    source: str
    split: str | None
    report_split: str | None
    files: tuple[str, ...] | None
    max_pairs: int | None
    thresholds: tuple[float, ...]
    hub_path: str
    hub_name: str

    def __post_init__(self) -> None:
        _check(bool(self.files) or self.source in ("wordnet", "superglue"),
               f"unknown wic.source {self.source!r}; choose wordnet, superglue, or give wic.files=[...]")
        _check(self.max_pairs is None or self.max_pairs >= 1, f"wic.max_pairs must be >= 1 or null, got {self.max_pairs}")
        _check(bool(self.thresholds), "wic.thresholds is empty")
        # threshold chosen on wic.split, accuracy reported on report_split: the two must differ
        _check(not self.report_split or str(self.report_split) != str(self.split or ""),
               f"wic.report_split={self.report_split!r} equals wic.split: choose on one split, report on another "
               "(or wic.report_split=null for the paper's sweep only)")


@dataclass(frozen=True)
class StsSettings:
    """``sts`` (``configs/sts/``): hub data sets and/or local files, the split, the sub-set column."""

    SECTION: ClassVar[str] = "sts"
    datasets: tuple[str, ...]
    files: tuple[str, ...] | None
    split: str
    max_pairs: int | None
    subset_field: str | None

    def __post_init__(self) -> None:
        _check(self.max_pairs is None or self.max_pairs >= 2, f"sts.max_pairs must be >= 2 or null, got {self.max_pairs}")


# ------------------------------------------------------------------ the LayerNorm-outlier analyses
@dataclass(frozen=True)
class _TextSettings:
    """Keys every LayerNorm-outlier analysis has: its own texts (else ``data.files``) and how many."""

    SECTION: ClassVar[str] = ""
    files: tuple[str, ...] | None
    max_sentences: int | None

    def __post_init__(self) -> None:
        n = self.max_sentences
        _check(n is None or n >= 1, f"{self.SECTION}.max_sentences must be >= 1 or null, got {n}")


def _check_layernorms(section: str, kinds: tuple[str, ...] | None) -> None:
    _check(kinds is None or (bool(kinds) and set(kinds) <= set(LAYERNORM_KINDS)),
           f"{section}.layernorms={list(kinds or [])}: choose from {sorted(LAYERNORM_KINDS)}")


@dataclass(frozen=True)
class AblationSettings(_TextSettings):
    """``ablation`` (``configs/ablation/default.yaml``): Kovaleva et al.'s masked-LM ablation."""

    SECTION: ClassVar[str] = "ablation"
    layernorms: tuple[str, ...] | None
    outlier_dims: tuple[int, ...] | None
    dims: tuple[int, ...]
    n_random: int
    seed: int | None
    mlm_probability: float
    pack: bool
    max_length: int
    batch_size: int
    example: str | None
    top_k: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_layernorms("ablation", self.layernorms)
        _check(0 < self.mlm_probability < 1, f"ablation.mlm_probability must be in (0, 1), got {self.mlm_probability}")
        _check(self.n_random >= 0, "ablation.n_random must be >= 0")
        _check(not self.example or "{mask}" in self.example,
               f"ablation.example must contain the placeholder {{mask}}: {self.example!r}")
        _check(self.max_length >= 2 and self.batch_size >= 1 and self.top_k >= 1,
               f"ablation.max_length (>= 2), batch_size and top_k (>= 1) out of range: "
               f"{self.max_length}, {self.batch_size}, {self.top_k}")


FREQUENCY_MODES = ("auto", "pretraining", "eval", "files")


@dataclass(frozen=True)
class FrequencySettings(_TextSettings):
    """``frequency`` (``configs/frequency/default.yaml``): Puccetti et al.'s frequency correlation."""

    SECTION: ClassVar[str] = "frequency"
    counts_from: str
    count_files: tuple[str, ...] | None
    dims: tuple[int, ...] | None
    max_dims: int
    value: str
    share_threshold: float
    min_occurrences: int
    plot_layers: tuple[int, ...] | None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.counts_from in FREQUENCY_MODES,
               f"frequency.counts_from must be one of {', '.join(FREQUENCY_MODES)}; got {self.counts_from!r}")
        _check(self.value in ("magnitude", "signed"),
               f"frequency.value must be magnitude or signed; got {self.value!r}")
        _check(self.counts_from != "files" or bool(self.count_files),
               "frequency.counts_from=files needs frequency.count_files=[a.txt,...]")
        _check(self.max_dims >= 1, f"frequency.max_dims must be >= 1, got {self.max_dims}")
        _check(0 < self.share_threshold <= 1, f"frequency.share_threshold must be in (0, 1], got {self.share_threshold}")
        _check(self.min_occurrences >= 1, f"frequency.min_occurrences must be >= 1, got {self.min_occurrences}")


@dataclass(frozen=True)
class OrderUseSettings(_TextSettings):
    """``order_use`` (``configs/order_use/default.yaml``): permuted-token loss minus intact loss, attention locality."""

    SECTION: ClassVar[str] = "order_use"
    max_length: int
    batch_size: int
    mlm_probability: float
    threshold: float
    seed: int | None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(0 < self.mlm_probability < 1, f"order_use.mlm_probability must be in (0, 1), got {self.mlm_probability}")
        _check(self.max_length >= 4 and self.batch_size >= 1,
               f"order_use.max_length (>= 4) and batch_size (>= 1) out of range: {self.max_length}, {self.batch_size}")


@dataclass(frozen=True)
class AttentionSinksSettings(_TextSettings):
    """``attention_sinks`` (``configs/attention_sinks/default.yaml``): attention mass on special tokens."""

    SECTION: ClassVar[str] = "attention_sinks"
    layernorms: tuple[str, ...] | None
    dims: tuple[int, ...] | None
    max_length: int
    batch_size: int
    sink_threshold: float
    n_random: int
    seed: int | None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_layernorms("attention_sinks", self.layernorms)
        _check(0 < self.sink_threshold < 1, f"attention_sinks.sink_threshold must be in (0, 1), got {self.sink_threshold}")
        _check(self.n_random >= 0, f"attention_sinks.n_random must be >= 0, got {self.n_random}")
        _check(self.max_length >= 2 and self.batch_size >= 1,
               f"attention_sinks.max_length (>= 2) and batch_size (>= 1) out of range: {self.max_length}, "
               f"{self.batch_size}")


@dataclass(frozen=True)
class FrequentTokensSettings(_TextSettings):
    """``frequent_tokens`` (``configs/frequent_tokens/default.yaml``): Macocco et al. 2025's heuristic."""

    SECTION: ClassVar[str] = "frequent_tokens"
    counts_from: str
    count_files: tuple[str, ...] | None
    percentile: float
    share_threshold: float
    n_random: int
    seed: int | None
    min_count: int
    mlm_probability: float
    pack: bool
    max_length: int
    batch_size: int
    positions: str
    late_position: int

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.positions in ("late", "every"),
               f"frequent_tokens.positions must be late (Macocco et al.) or every; got {self.positions!r}")
        _check(self.late_position >= 0, f"frequent_tokens.late_position must be >= 0, got {self.late_position}")
        _check(self.counts_from in FREQUENCY_MODES,
               f"frequent_tokens.counts_from must be one of {', '.join(FREQUENCY_MODES)}; got {self.counts_from!r}")
        _check(self.counts_from != "files" or bool(self.count_files),
               "frequent_tokens.counts_from=files needs frequent_tokens.count_files=[a.txt,...]")
        _check(0 < self.percentile < 100, f"frequent_tokens.percentile must be in (0, 100), got {self.percentile}")
        _check(0 < self.share_threshold <= 1,
               f"frequent_tokens.share_threshold must be in (0, 1], got {self.share_threshold}")
        _check(self.n_random >= 0 and self.min_count >= 1,
               f"frequent_tokens.n_random (>= 0) and min_count (>= 1) out of range: {self.n_random}, {self.min_count}")
        _check(0 < self.mlm_probability < 1,
               f"frequent_tokens.mlm_probability must be in (0, 1), got {self.mlm_probability}")
        _check(self.max_length >= 2 and self.batch_size >= 1,
               f"frequent_tokens.max_length (>= 2) and batch_size (>= 1) out of range: {self.max_length}, "
               f"{self.batch_size}")


@dataclass(frozen=True)
class QKOutliersSettings(_TextSettings):
    """``qk_outliers`` (``configs/qk_outliers/default.yaml``): Jonasson 2025's query/key features."""

    SECTION: ClassVar[str] = "qk_outliers"
    k: float
    max_cycles: float

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.k > 0, f"qk_outliers.k must be > 0, got {self.k}")
        _check(self.max_cycles > 0, f"qk_outliers.max_cycles must be > 0, got {self.max_cycles}")
