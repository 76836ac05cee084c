"""Typed settings of the ``evaluate.py`` analyses: one frozen dataclass per config section, built by
:func:`load_settings`.

The loader itself (:func:`load_settings`, type coercion) is :mod:`outlierlab.evaluation.settings_loader`.

Defaults are stated twice, on purpose, and kept equal by ``tests/test_settings_defaults.py``:

* in each class here, so ``OutliersSettings()`` (or ``OutliersSettings(threshold=0.4)``) builds from Python
  without composing any YAML;
* in the composed YAML (``configs/evaluate.yaml`` and its groups: ``configs/wic/``, ``configs/ablation/``
  ...), which keeps the comments saying why each value is what it is, and which ``evaluate.py`` reads.

A class's defaults are those of the DEFAULT composed config, ``compose("evaluate")``.  Where a section is a
preset group, that is the default preset's values (``encoder=all_minilm_l6_v2``, ``transform=[none,clip,
whiten]``, ``wic=wordnet``, ``sts=none``), said in the class docstring; another preset is chosen by composing
it (``wic=superglue``), not by this class.  To change a default, change both the YAML and the class; the test
fails on either alone.

:func:`load_settings` still requires every key in the config, though the class has a default: a key missing
from a composed section is a typo or a drift, and filling it with the default PRESET's value would silently
mix presets (a ``wic=superglue`` run with the wordnet splits).  The only keys that may be absent are those
whose group may be unselected (``transform.dims`` without the clip group) or that older configs lack
(``data.one_pass``), declared with :func:`_optional`: absent, they take their "absent" value (None, or
``one_pass=True``), not the default preset's.  :func:`load_settings` also refuses unknown keys (listing the
valid ones) and wrong types in one line naming the section; each class checks its value ranges in
``__post_init__`` (so ``OutliersSettings(threshold=2)`` fails as the YAML would).  ``evaluate.py`` builds every
selected section before any model is loaded, so a bad setting fails in seconds.

They are not registered in Hydra's ConfigStore as structured-config schemas: OmegaConf 2.3 cannot represent
every field, would validate before this loader with other messages and without its coercions, and cannot merge
presets onto frozen nodes -- measured, with the details, in docs/design.md ("Decisions already taken").

Kept free of heavy imports (no torch): ``evaluate.py`` validates with it before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from outlierlab.evaluation.settings_loader import ABSENT
from outlierlab.evaluation.settings_loader import check as _check
from outlierlab.evaluation.settings_loader import load_settings, section_settings

__all__ = ["load_settings", "section_settings", "DataSettings", "EncoderSettings", "TransformSettings",
           "OutliersSettings", "AnisotropySettings", "IsotropySettings", "SelfSimilaritySettings", "WicSettings", "StsSettings",
           "AblationSettings", "FrequencySettings", "AttentionSinksSettings", "FrequentTokensSettings",
           "QKOutliersSettings", "OrderUseSettings", "LAYERNORM_KINDS"]

#: LayerNorm kinds a ``layernorms`` list may name (:func:`outlierlab.models.layernorms.select_layernorms`).
LAYERNORM_KINDS = ("output", "attention_output", "attention_input", "mlp_input", "attention_update", "mlp_update",
                   "embeddings", "final", "head", "all")


#: ``encoder.dtype`` values (auto = the checkpoint's own dtype) and the ``encoder.device_map`` strings
#: accelerate accepts (a mapping ``{module: device}`` also works).
ENCODER_DTYPES = ("auto", "bfloat16", "float16", "float32")
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def _optional(default, absent=None):
    """A key the composed config may lack (its group not selected, or an older config): ``default`` is the
    default composed config's value, ``absent`` what :func:`load_settings` passes when the key is missing."""
    return field(default=default, metadata={ABSENT: absent})


# ------------------------------------------------------------------------------------- shared sections
@dataclass(frozen=True)
class DataSettings:
    """``data``: the evaluation sentences of the shared streaming pass (and the texts' fallback)."""

    SECTION: ClassVar[str] = "data"
    files: tuple[str, ...] | None = None
    max_sentences: int | None = 2000
    chunk: int = 1024
    one_pass: bool = _optional(True, absent=True)  # absent in older configs: the one-pass default

    def __post_init__(self) -> None:
        n = self.max_sentences
        _check(n is None or n >= 2, f"data.max_sentences must be >= 2 or null, got {n}")
        _check(self.chunk >= 1, f"data.chunk must be >= 1, got {self.chunk}")


@dataclass(frozen=True)
class EncoderSettings:
    """``encoder`` (``configs/encoder/``): which encoder ``evaluate.py`` loads and how it batches.

    Defaults: the default preset, ``encoder=all_minilm_l6_v2`` (``configs/encoder/all_minilm_l6_v2.yaml``);
    another preset (``encoder=bert_base_uncased``) changes several keys at once, so compose it rather than
    overriding this class's name_or_path alone."""

    SECTION: ClassVar[str] = "encoder"
    name_or_path: str = "all-minilm-l6-v2"
    max_length: int | None = None
    on_overflow: str = "warn"
    device: str = "auto"
    batch_size: int = 32
    dtype: str = "float32"  # auto (the checkpoint's own) | bfloat16 | float16 | float32
    device_map: str | dict | None = None  # null (one device) | auto | {module: device} (accelerate)
    revision: str | None = None  # a hub revision (branch, tag, commit: Pythia's step1000)

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
    selected (then None); ``min_fit_ratio`` and ``allow_degenerate`` guard every fitted transform
    (evaluate.yaml).

    Defaults: the default group list, ``transform=[none,clip,whiten]`` (``configs/transform/``), so ``use``
    names those three and ``abtt_d`` is None (abtt not selected)."""

    SECTION: ClassVar[str] = "transform"
    # a factory: a dict default would be shared by every instance (dataclasses refuse it)
    use: dict = field(default_factory=lambda: {"none": True, "clip": True, "whiten": True})
    fit_on: str = "eval"
    dims: tuple[int, ...] | None = _optional(None)
    dims_by_layer: dict | None = _optional(None)
    k: int | None = _optional(None)
    min_fit_ratio: float | None = _optional(2.0)
    allow_degenerate: bool | None = _optional(False)
    abtt_d: int | None = _optional(None)

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
    method: str = "share"
    threshold: float = 0.25
    k: float = 3.0
    top_k: int = 5
    position_k: float = 3.0

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
    n_sentences: int = 2000
    rogue_k: tuple[int, ...] = (1, 3, 5)
    rogue_list: int = 5

    def __post_init__(self) -> None:
        _check(self.n_sentences >= 2, f"anisotropy.n_sentences must be >= 2 (one pair), got {self.n_sentences}")
        _check(bool(self.rogue_k) and all(k >= 1 for k in self.rogue_k),
               f"anisotropy.rogue_k must list ks >= 1, got {list(self.rogue_k)}")
        _check(self.rogue_list >= 1, f"anisotropy.rogue_list must be >= 1, got {self.rogue_list}")


@dataclass(frozen=True)
class IsotropySettings:
    """``isotropy``: IsoScore* shrinkage (Rudman & Eickhoff 2023)."""

    SECTION: ClassVar[str] = "isotropy"
    zeta: float = 0.75

    def __post_init__(self) -> None:
        _check(0.0 <= self.zeta <= 1.0, f"isotropy.zeta must be in [0, 1], got {self.zeta}")


@dataclass(frozen=True)
class SelfSimilaritySettings:
    """``self_similarity``: which words are target words."""

    SECTION: ClassVar[str] = "self_similarity"
    min_sentences: int = 10
    max_words: int | None = 1000
    lowercase: bool = True

    def __post_init__(self) -> None:
        _check(self.min_sentences >= 1, f"self_similarity.min_sentences must be >= 1, got {self.min_sentences}")
        _check(self.max_words is None or self.max_words >= 1,
               f"self_similarity.max_words must be >= 1 or null, got {self.max_words}")


# --------------------------------------------------------------------------------------- the tasks
@dataclass(frozen=True)
class WicSettings:
    """``wic`` (``configs/wic/``): the pairs, the splits to choose and report on, the threshold sweep.

    Defaults: the default preset, ``wic=wordnet`` (``configs/wic/wordnet.yaml``, the shipped pairs);
    ``wic=superglue`` changes source and splits together."""

    SECTION: ClassVar[str] = "wic"
    source: str = "wordnet"
    split: str | None = "train"
    report_split: str | None = "test"
    files: tuple[str, ...] | None = None
    max_pairs: int | None = None
    thresholds: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # Luo et al. §4.2
    hub_path: str = "aps/super_glue"
    hub_name: str = "wic"

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
    """``sts`` (``configs/sts/``): hub data sets and/or local files, the split, the sub-set column.

    Defaults: the default preset, ``sts=none`` (``configs/sts/none.yaml``): no data set, so STS is skipped
    (no STS data can be shipped); ``sts=paper`` lists Luo et al.'s."""

    SECTION: ClassVar[str] = "sts"
    datasets: tuple[str, ...] = ()
    files: tuple[str, ...] | None = None
    split: str = "test"
    max_pairs: int | None = None
    subset_field: str | None = "genre"

    def __post_init__(self) -> None:
        _check(self.max_pairs is None or self.max_pairs >= 2, f"sts.max_pairs must be >= 2 or null, got {self.max_pairs}")


# ------------------------------------------------------------------ the LayerNorm-outlier analyses
@dataclass(frozen=True)
class _TextSettings:
    """Keys every LayerNorm-outlier analysis has: its own texts (else ``data.files``) and how many (each
    subclass restates ``max_sentences`` with its own preset's default)."""

    SECTION: ClassVar[str] = ""
    files: tuple[str, ...] | None = None
    max_sentences: int | None = None

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
    max_sentences: int | None = 600
    layernorms: tuple[str, ...] | None = None
    outlier_dims: tuple[int, ...] | None = None
    dims: tuple[int, ...] = ()
    n_random: int = 5
    seed: int | None = None
    mlm_probability: float = 0.15
    pack: bool = True
    max_length: int = 128
    batch_size: int = 16
    example: str | None = "She opened the door and walked slowly into the {mask}."
    top_k: int = 5

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
    max_sentences: int | None = 1000
    counts_from: str = "auto"
    count_files: tuple[str, ...] | None = None
    dims: tuple[int, ...] | None = None
    max_dims: int = 8
    value: str = "magnitude"
    share_threshold: float = 0.25
    min_occurrences: int = 1
    plot_layers: tuple[int, ...] | None = None

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
    max_sentences: int | None = 200
    max_length: int = 128
    batch_size: int = 16
    mlm_probability: float = 0.15
    threshold: float = 0.1
    seed: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(0 < self.mlm_probability < 1, f"order_use.mlm_probability must be in (0, 1), got {self.mlm_probability}")
        _check(self.max_length >= 4 and self.batch_size >= 1,
               f"order_use.max_length (>= 4) and batch_size (>= 1) out of range: {self.max_length}, {self.batch_size}")


@dataclass(frozen=True)
class AttentionSinksSettings(_TextSettings):
    """``attention_sinks`` (``configs/attention_sinks/default.yaml``): attention mass on special tokens."""

    SECTION: ClassVar[str] = "attention_sinks"
    max_sentences: int | None = 200
    layernorms: tuple[str, ...] | None = None
    dims: tuple[int, ...] | None = None
    max_length: int = 128
    batch_size: int = 16
    sink_threshold: float = 0.3
    n_random: int = 1
    seed: int | None = None

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
    max_sentences: int | None = 600
    counts_from: str = "auto"
    count_files: tuple[str, ...] | None = None
    percentile: float = 99.0
    share_threshold: float = 0.25
    n_random: int = 5
    seed: int | None = None
    min_count: int = 1
    mlm_probability: float = 0.15
    pack: bool = True
    max_length: int = 128
    batch_size: int = 16
    positions: str = "late"
    late_position: int = 100

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
    max_sentences: int | None = 1000
    k: float = 3.0
    max_cycles: float = 1.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(self.k > 0, f"qk_outliers.k must be > 0, got {self.k}")
        _check(self.max_cycles > 0, f"qk_outliers.max_cycles must be > 0, got {self.max_cycles}")
