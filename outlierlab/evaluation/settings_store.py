"""The settings classes' defaults as the nodes Hydra composes (``outlierlab.evaluation.settings``: one frozen
dataclass per section, the one source of the defaults).

``register_defaults`` stores them in Hydra's ConfigStore, group ``settings``; every preset of a section starts
from its node (``defaults: [/settings/<section>@_here_, _self_]``) and states only what it changes, and
``configs/evaluate.yaml`` composes ``settings/evaluate``.  Kept free of heavy imports (no torch).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from outlierlab.evaluation.settings import (AblationSettings, AnisotropySettings, AttentionSinksSettings, DataSettings,
                                            EncoderSettings, FrequencySettings, FrequentTokensSettings,
                                            IsotropySettings, OrderUseSettings, OutliersSettings, QKOutliersSettings,
                                            QuantizationSettings,
                                            SelfSimilaritySettings, StsSettings, TransformSettings, WicSettings)

#: The sections whose defaults Hydra composes from the classes above: each is stored in Hydra's ConfigStore as
#: ``settings/<section>`` (:func:`register_defaults`), and every preset of the section (``configs/wic/superglue.yaml``,
#: ``configs/encoder/bert_base_uncased.yaml``) starts from it and states only what it changes.  ``transform`` is not
#: among them: its keys are the union of the transform groups a run selects (``transform=[none,clip]``), so its
#: defaults are that selection, not one node.
DEFAULTS_FROM_PYTHON: tuple[type, ...] = (EncoderSettings, WicSettings, StsSettings, AblationSettings, FrequencySettings,
                                          AttentionSinksSettings, FrequentTokensSettings, QKOutliersSettings,
                                          OrderUseSettings, QuantizationSettings)
#: The transform keys every selection shares (the rest come from the transform groups selected).
TRANSFORM_GUARD = ("fit_on", "min_fit_ratio", "allow_degenerate")
#: The evaluate.yaml sections that are not config groups: one stored node, ``settings/evaluate``, holds them all
#: (with :data:`TRANSFORM_GUARD`).
EVALUATE_SECTIONS: tuple[type, ...] = (DataSettings, OutliersSettings, AnisotropySettings, IsotropySettings,
                                       SelfSimilaritySettings)


#: Keys every preset of its section states itself: in the stored node they are ``???`` (required), because merging a
#: preset's ``???`` onto a value keeps the value (OmegaConf), so ``encoder=run`` could not require a path otherwise.
PRESET_STATES: dict[str, tuple[str, ...]] = {"encoder": ("name_or_path",)}


def as_node(settings: Any) -> dict:
    """A settings object as plain config values (tuples as lists): its section of a composed config."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(settings).items()}


def defaults_node(cls: type) -> dict:
    """``cls``'s defaults as the node Hydra composes for its section; ``PRESET_STATES`` keys are ``???``."""
    required = PRESET_STATES.get(cls.SECTION, ())
    return {k: "???" if k in required else v for k, v in as_node(cls()).items()}


def register_defaults() -> None:
    """Store every section's defaults in Hydra's ConfigStore (idempotent; run before any config is composed: the
    entry points and ``outlierlab.jobs.startup.compose_config`` do).

    Plain nodes, not OmegaConf structured-config schemas: the classes stay the one validator (pydantic, strict:
    one line per fault, ``data.files=a.txt`` read as a list, frozen values), for the reasons measured in
    docs/design.md ("Decisions already taken")."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for cls in DEFAULTS_FROM_PYTHON:  # one group, "settings": `python evaluate.py --help` lists it once
        cs.store(group="settings", name=cls.SECTION, node=defaults_node(cls), provider="outlierlab")
    guard = {k: v for k, v in defaults_node(TransformSettings).items() if k in TRANSFORM_GUARD}
    cs.store(group="settings", name="evaluate", node={**{c.SECTION: defaults_node(c) for c in EVALUATE_SECTIONS},
                                             "transform": guard}, provider="outlierlab")
