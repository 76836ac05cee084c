"""Typed settings of the ``evaluate.py`` analyses: one frozen dataclass per config section, built by
:func:`load_settings`.

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

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, Union

from omegaconf import OmegaConf

__all__ = ["load_settings", "section_settings", "DataSettings", "EncoderSettings", "TransformSettings",
           "OutliersSettings", "AnisotropySettings", "IsotropySettings", "SelfSimilaritySettings", "WicSettings", "StsSettings",
           "AblationSettings", "FrequencySettings", "AttentionSinksSettings", "FrequentTokensSettings",
           "QKOutliersSettings", "LAYERNORM_KINDS"]

S = TypeVar("S")

#: LayerNorm kinds a ``layernorms`` list may name (:func:`outlierlab.models.layernorms.select_layernorms`).
LAYERNORM_KINDS = ("output", "attention_output", "attention_input", "mlp_input", "embeddings", "final", "head", "all")


# ------------------------------------------------------------------------------------------- the loader
def load_settings(cls: type[S], node: Any, section: str | None = None) -> S:
    """``cls`` (a frozen settings dataclass) from a config node, checked.

    Parameters
    ----------
    cls : a dataclass with a ``SECTION`` class attribute (the config section it reads)
    node : omegaconf DictConfig, mapping, or None (an absent section: every required key is missing)
    section : the name used in error messages; default ``cls.SECTION``

    Raises
    ------
    ValueError
        One line naming the section: unknown keys (with the valid keys), missing keys, a wrong type, or a
        value out of range (the class's ``__post_init__``).  Ints are accepted where a float is declared,
        lists (ListConfig) where a tuple is declared.
    """
    section = section or cls.SECTION
    if OmegaConf.is_dict(node):
        unset = [str(k) for k in node if OmegaConf.is_missing(node, k)]
        if unset:  # ``???`` in the YAML: a value only the user can give
            raise ValueError(f"{section}.{unset[0]} must be given (e.g. {section}.{unset[0]}=...)")
    values = _plain(node)
    if not isinstance(values, Mapping):
        raise ValueError(f"{section}: expected a mapping of settings, got {type(values).__name__} {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(str(k) for k in values if k not in fields)
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(f'{section}.{k}' for k in unknown)}; "
                         f"valid keys of {section}: {', '.join(fields)}")
    missing = [n for n, f in fields.items() if n not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ValueError(f"missing key(s) {', '.join(f'{section}.{k}' for k in missing)} (the composed config "
                         f"states every default: configs/evaluate.yaml and its groups)")
    hints = typing.get_type_hints(cls)
    return cls(**{k: _coerce(v, hints[k], f"{section}.{k}") for k, v in values.items()})


def section_settings(cls: type[S], root_cfg: Any) -> S:
    """:func:`load_settings` of the section ``cls.SECTION`` of the whole evaluate config."""
    node = root_cfg.get(cls.SECTION) if root_cfg is not None and hasattr(root_cfg, "get") else None
    return load_settings(cls, node)


def _plain(node: Any) -> Any:
    if node is None:
        return {}
    if OmegaConf.is_config(node):
        return OmegaConf.to_container(node, resolve=True)
    return node


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is tuple:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict or tp is dict:
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """``value`` as type ``tp`` (see :func:`load_settings`), else a one-line ValueError naming ``where``."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ValueError:
                continue
    elif tp is Any:
        return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)  # YAML writes 3 for 3.0
    elif tp in (int, bool, str):
        if isinstance(value, tp) and (tp is bool or not isinstance(value, bool)):
            return value
    elif origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        if isinstance(value, str) and args[0] is str:
            return (value,)  # one file without brackets: data.files=a.txt
        if isinstance(value, (list, tuple)):
            return tuple(_coerce(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    elif origin is dict or tp is dict:
        if isinstance(value, Mapping):
            return dict(value)
    else:  # a declaration this loader does not know: a bug in the settings class, not in the config
        raise TypeError(f"{where}: unsupported settings type {tp!r}")
    raise ValueError(f"{where}={value!r}: expected {_type_name(tp)}, got {type(value).__name__}")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


# ------------------------------------------------------------------------------------- shared sections
@dataclass(frozen=True)
class DataSettings:
    """``data``: the evaluation sentences of the shared streaming pass (and the texts' fallback)."""

    SECTION: ClassVar[str] = "data"
    files: tuple[str, ...] | None
    max_sentences: int | None
    chunk: int

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

    def __post_init__(self) -> None:
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

    def __post_init__(self) -> None:
        super().__post_init__()
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
