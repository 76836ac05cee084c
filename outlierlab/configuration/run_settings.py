"""Typed settings of an ``evaluate.py`` run's own sections: the sentences (``data``), the encoder and the transforms.
Frozen, strictly typed classes (``outlierlab.configuration.typed_settings``), the one source of the defaults that
Hydra composes (``outlierlab.configuration.settings_store``); each key is explained by the comment above its field.
No heavy imports (no torch)."""

from __future__ import annotations

from dataclasses import field
from typing import ClassVar, Literal

from outlierlab.configuration.typed_settings import (AtLeast0, AtLeast1, AtLeast2, Ints, Names, Positive, optional,
                                                     require, settings_class)

__all__ = ["DataSettings", "EncoderSettings", "TransformSettings", "DEVICE_MAPS"]

#: The ``encoder.device_map`` strings accelerate accepts (a mapping ``{module: device}`` also works).
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


@settings_class
class DataSettings:
    """``data``: the evaluation sentences of the shared streaming pass (and the texts' fallback)."""

    SECTION: ClassVar[str] = "data"
    #: [a.txt, b.txt.gz]: one sentence per line; null = shipped Persuasion sentences
    files: Names | None = None
    #: first N in file order; null = all (shipped: 2703)
    max_sentences: AtLeast2 | None = 2000
    #: sentences tokenized at a time (bounds memory; results do not depend on it)
    chunk: AtLeast1 = 1024
    #: keep the tokens on disk for the later passes (false: encode twice)
    one_pass: bool = True


@settings_class
class EncoderSettings:
    """``encoder`` (``configs/encoder/``): which encoder ``evaluate.py`` loads and how it batches.

    Defaults: ``encoder=all_minilm_l6_v2``; another preset changes several keys at once, so compose it rather
    than overriding ``name_or_path`` alone."""

    SECTION: ClassVar[str] = "encoder"
    name_or_path: str = "all-minilm-l6-v2"
    #: null = the model's maximum (512)
    max_length: AtLeast2 | None = None
    #: longer sequences: warn (truncate, count) | error (one-line failure)
    on_overflow: Literal["warn", "error"] = "warn"
    #: auto = cuda if available
    device: str = "auto"
    batch_size: AtLeast1 = 32
    #: auto = the checkpoint's own
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "float32"
    device_map: str | dict | None = None  # null (one device) | auto | {module: device} (accelerate)
    revision: str | None = None  # a hub revision (branch, tag, commit: Pythia's step1000)

    def __post_init__(self) -> None:
        require(self.device_map is None or isinstance(self.device_map, dict) or self.device_map in DEVICE_MAPS,
               f"encoder.device_map must be null, a mapping or one of {', '.join(DEVICE_MAPS)}, "
               f"got {self.device_map!r}")


@settings_class
class TransformSettings:
    """``transform``: which transforms are compared and how they are fitted.  ``dims``/``dims_by_layer`` (clip),
    ``k`` (whiten) and ``abtt_d`` (abtt) are None when their group is not selected (default:
    ``transform=[none,clip,whiten]``); ``min_fit_ratio`` and ``allow_degenerate`` guard every fitted transform."""

    SECTION: ClassVar[str] = "transform"
    # a factory: a dict default would be shared by every instance (dataclasses refuse it)
    use: dict = field(default_factory=lambda: {"none": True, "clip": True, "whiten": True})
    fit_on: str = "eval"
    dims: Ints | None = optional(None)
    dims_by_layer: dict | None = optional(None)
    k: AtLeast1 | None = optional(None)
    min_fit_ratio: Positive | None = optional(2.0)
    allow_degenerate: bool | None = optional(False)
    abtt_d: AtLeast0 | None = optional(None)

