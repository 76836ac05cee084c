"""The settings classes (``run_settings``, ``analysis_settings``: one frozen class per section, the one source of
the defaults) as the nodes Hydra composes, and back: a composed section as its class.

``register_defaults`` stores them in Hydra's ConfigStore, group ``settings``; every preset of a section starts
from its node (``defaults: [/settings/<section>@_here_, _self_]``) and states only what it changes, and
``configs/evaluate.yaml`` composes ``settings/evaluate``.  The nodes are plain, not OmegaConf structured-config
schemas (OmegaConf 2.3 cannot represent ``str | dict | None`` nor merge presets onto frozen nodes: docs/design.md,
"Decisions already taken").

``load_settings`` builds a class from a composed section, refusing ``???`` and, in a section composed without its
defaults, a missing key (the saved config would not say what ran), but those of an unselected group.  No torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from omegaconf import OmegaConf

from outlierlab.configuration.analysis_settings import (AblationSettings, AnisotropySettings, AttentionSinksSettings,
                                                        FrequencySettings, FrequentTokensSettings, IsotropySettings,
                                                        OrderUseSettings, OutliersSettings, QKOutliersSettings,
                                                        QuantizationSettings, SelfSimilaritySettings, StsSettings,
                                                        WicSettings)
from outlierlab.configuration.run_settings import DataSettings, EncoderSettings, TransformSettings
from outlierlab.configuration.typed_settings import ABSENT

S = TypeVar("S")

#: The config groups whose defaults are stored as ``settings/<section>`` for every preset to start from; not
#: ``transform``, whose keys are the union of the groups a run selects.
DEFAULTS_FROM_PYTHON: tuple[type, ...] = (EncoderSettings, WicSettings, StsSettings, AblationSettings, FrequencySettings,
                                          AttentionSinksSettings, FrequentTokensSettings, QKOutliersSettings,
                                          OrderUseSettings, QuantizationSettings)
#: The transform keys every selection shares (the rest come from the transform groups selected).
TRANSFORM_GUARD = ("fit_on", "min_fit_ratio", "allow_degenerate")
#: The evaluate.yaml sections that are not config groups, stored in one node, ``settings/evaluate``.
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
    """Store every section's defaults in Hydra's ConfigStore; idempotent, before any composition."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for cls in DEFAULTS_FROM_PYTHON:  # one group, "settings": `python evaluate.py --help` lists it once
        cs.store(group="settings", name=cls.SECTION, node=defaults_node(cls), provider="outlierlab")
    guard = {k: v for k, v in defaults_node(TransformSettings).items() if k in TRANSFORM_GUARD}
    cs.store(group="settings", name="evaluate", node={**{c.SECTION: defaults_node(c) for c in EVALUATE_SECTIONS},
                                             "transform": guard}, provider="outlierlab")


def load_settings(cls: type[S], node: Any, section: str | None = None) -> S:
    """``cls`` from a config node (None: absent); a bad node is one ``ValueError`` line naming the section."""
    section = section or cls.SECTION
    if OmegaConf.is_dict(node):
        unset = [str(k) for k in node if OmegaConf.is_missing(node, k)]
        if unset:  # ``???`` in the YAML: a value only the user can give
            raise ValueError(f"{section}.{unset[0]} must be given (e.g. {section}.{unset[0]}=...)")
    values = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else (node or {})
    if not isinstance(values, Mapping):
        raise ValueError(f"{section}: expected a mapping of settings, got {type(values).__name__} {values!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    missing = [n for n, f in fields.items() if n not in values and ABSENT not in f.metadata]
    if missing and not set(values) - set(fields):  # an unknown key is named first (it may be the missing one misspelt)
        raise ValueError(f"missing key(s) {', '.join(f'{section}.{k}' for k in missing)}: {_how_to_complete(section)}")
    # an absent optional key takes its "absent" value, not the class default (the default preset's value):
    # transform=[none] has no clip dims, whatever the clip preset says
    absent = {n: f.metadata[ABSENT] for n, f in fields.items() if n not in values and ABSENT in f.metadata}
    return cls(**{str(k): v for k, v in values.items()}, **absent)


def _how_to_complete(section: str) -> str:
    """What makes a section complete: its preset starting from the class defaults, or every key stated."""
    if any(c.SECTION == section for c in DEFAULTS_FROM_PYTHON):
        return (f"a preset in configs/{section}/ starts with `defaults: [/settings/{section}@_here_, _self_]` "
                "(the class defaults), or states every key")
    if any(c.SECTION == section for c in EVALUATE_SECTIONS):
        return "configs/evaluate.yaml composes its defaults (`settings/evaluate`), or state every key"
    return "state every key"


def section_settings(cls: type[S], root_cfg: Any) -> S:
    """``load_settings`` of the section ``cls.SECTION`` of the whole evaluate config."""
    node = root_cfg.get(cls.SECTION) if root_cfg is not None and hasattr(root_cfg, "get") else None
    return load_settings(cls, node)


def given_sections(settings: Sequence[Any] | None, allowed: Sequence[type], overrides: Sequence[str]) -> dict[str, dict]:
    """Typed ``settings`` as config sections; an override of a key of a section given whole is refused."""
    if settings is None:
        return {}
    if isinstance(settings, (str, bytes)) or not isinstance(settings, Sequence):
        raise TypeError(f"settings={settings!r}: expected a list of settings objects, e.g. "
                        f"[{allowed[0].__name__}()]")
    out = {}
    for item in settings:
        if type(item) not in allowed:
            raise TypeError(f"settings: {item!r} is not a section's settings; expected one of "
                            f"{', '.join(sorted(c.__name__ for c in allowed))} (the encoder is the first argument, "
                            "the transforms are transforms=)")
        if item.SECTION in out:
            raise ValueError(f"settings: two {type(item).__name__} given; give each section once")
        out[item.SECTION] = as_node(item)
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if "." in key and key.split(".", 1)[0] in out:
            name = type(next(s for s in settings if s.SECTION == key.split(".", 1)[0])).__name__
            raise ValueError(f"overrides={override!r} sets a key of the section settings= gives whole ({name}): "
                             f"set it there, e.g. {name}({key.rsplit('.', 1)[-1]}=...)")
    return out
