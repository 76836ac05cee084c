"""The loader behind :mod:`outlierlab.evaluation.settings`: a config section -> one frozen dataclass.

:func:`load_settings` refuses unknown keys (listing the valid ones), missing keys and wrong types in one line
naming the section; values are coerced to the declared field types (``tuple[int, ...]``, ``float | None``, ...).
Every key must be in the section: a composed config has them all (Hydra composes the classes' defaults under every
preset, :func:`outlierlab.evaluation.settings_store.register_defaults`), and a hand-written mapping that lacks one is a
typo, refused by name rather than filled in here; only fields marked with :data:`ABSENT` metadata may be missing,
and then take that "absent" value.
The per-section classes, their ranges and the YAML they mirror live in :mod:`outlierlab.evaluation.settings`.
Kept free of heavy imports (no torch).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, Union

from omegaconf import OmegaConf

__all__ = ["load_settings", "section_settings", "check", "ABSENT"]

#: ``dataclasses.field`` metadata key marking a key the composed config may lack (its group not selected, e.g.
#: ``transform.dims`` without the clip group): the loader then passes ``metadata[ABSENT]`` (None: "absent").
#: Every other key must be in the section: the composed config has it (the classes' defaults are composed under
#: every preset), so one missing is a typo in a hand-written mapping, refused by name.
ABSENT = "absent"

S = TypeVar("S")


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
    missing = [n for n, f in fields.items() if n not in values and ABSENT not in f.metadata]
    if missing:
        raise ValueError(f"missing key(s) {', '.join(f'{section}.{k}' for k in missing)}: {_how_to_complete(section)}")
    hints = typing.get_type_hints(cls)
    # an absent optional key takes its "absent" value, not the class default (the default preset's value):
    # transform=[none] has no clip dims, whatever the clip preset says
    absent = {n: f.metadata[ABSENT] for n, f in fields.items() if n not in values}
    return cls(**{k: _coerce(v, hints[k], f"{section}.{k}") for k, v in values.items()}, **absent)


def _how_to_complete(section: str) -> str:
    """What makes a section complete: its preset starting from the class defaults, or every key stated."""
    from outlierlab.evaluation.settings_store import DEFAULTS_FROM_PYTHON, EVALUATE_SECTIONS  # lazy: imports this module

    if any(c.SECTION == section for c in DEFAULTS_FROM_PYTHON):
        return (f"a preset in configs/{section}/ starts with `defaults: [/settings/{section}@_here_, _self_]` "
                "(the class defaults), or states every key")
    if any(c.SECTION == section for c in EVALUATE_SECTIONS):
        return "configs/evaluate.yaml composes its defaults (`settings/evaluate`), or state every key"
    return "state every key"


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


def check(ok: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``ok`` (the settings classes' range checks)."""
    if not ok:
        raise ValueError(message)

