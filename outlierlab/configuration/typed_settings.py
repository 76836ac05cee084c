"""Strictly typed settings classes whose every refusal is one line naming ``section.key``.

``settings_class`` makes a class with a ``SECTION`` name and annotated fields a frozen, strict pydantic dataclass: a
wrong type, a value outside its declared range or choices, or an unknown key is refused when built, as one
``ValueError`` line (``outliers.threshold must be <= 1, got 2``); ``__post_init__`` checks several keys with
``require``.  A list is taken where a tuple is declared, and one name without brackets (``data.files=a.txt``) as a
one-item list.  No heavy imports: the entry points validate before torch loads.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Annotated, Any, TypeVar, Union

import pydantic
import pydantic.dataclasses

__all__ = ["settings_class", "require", "optional", "as_int", "ABSENT", "Names", "Ints", "Floats", "AtLeast0",
           "AtLeast1", "AtLeast2", "Positive", "Share", "Probability"]

S = TypeVar("S")


def require(ok: bool, message: str) -> None:
    """Raise ``ValueError(message)`` unless ``ok`` (the checks of a class's ``__post_init__``)."""
    if not ok:
        raise ValueError(message)


def as_int(value: Any, key: str) -> int:
    """``value`` as an int, or one line naming ``key`` (a bool, a string or a fraction is refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise ValueError(f"{key} must be an integer, got {value!r}")
    return int(value)


#: ``dataclasses.field`` metadata key marking a key the composed config may lack (its group not selected, e.g.
#: ``transform.dims`` without the clip group): ``settings_store.load_settings`` then passes ``metadata[ABSENT]``.
ABSENT = "absent"


def optional(default: Any, absent: Any = None) -> Any:
    """A key the composed config may lack (group not selected): its ``default`` and its ``absent`` value."""
    return dataclasses.field(default=default, metadata={ABSENT: absent})


def _as_tuple(value: Any) -> Any:
    """A list (YAML's sequences) where a tuple is declared; anything else is left to the type check."""
    return tuple(value) if isinstance(value, list) else value


def _as_names(value: Any) -> Any:
    """One name without brackets (``data.files=a.txt``, ``ablation.layernorms=output``) as a one-item list."""
    return (value,) if isinstance(value, str) else _as_tuple(value)


# the tuple fields' types: what a config writes as a list is checked item by item
Names = Annotated[tuple[str, ...], pydantic.BeforeValidator(_as_names)]
Ints = Annotated[tuple[int, ...], pydantic.BeforeValidator(_as_tuple)]
Floats = Annotated[tuple[float, ...], pydantic.BeforeValidator(_as_tuple)]

# value ranges, declared on the fields (pydantic checks them; :func:`_one_line` words a refusal as
# ``section.key must be >= 1, got 0``)
AtLeast0 = Annotated[int, pydantic.Field(ge=0)]
AtLeast1 = Annotated[int, pydantic.Field(ge=1)]
AtLeast2 = Annotated[int, pydantic.Field(ge=2)]
Positive = Annotated[float, pydantic.Field(gt=0)]
Share = Annotated[float, pydantic.Field(gt=0, le=1)]  # (0, 1]
Probability = Annotated[float, pydantic.Field(gt=0, lt=1)]  # (0, 1)

# strict: no str -> number, float -> int or bool -> int coercion (an int is still a valid float: YAML writes 3 for 3.0)
_STRICT = pydantic.ConfigDict(strict=True, extra="forbid")


def settings_class(cls: type[S]) -> type[S]:
    """``cls`` as a frozen, strictly typed pydantic dataclass whose every refusal is one ``ValueError`` line."""
    cls = pydantic.dataclasses.dataclass(frozen=True, config=_STRICT)(cls)
    validated_init = cls.__init__

    @functools.wraps(validated_init)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        keys = {f.name for f in dataclasses.fields(cls) if f.init}
        if len(args) == 1 and not kwargs and isinstance(args[0], dict) and args[0] and set(args[0]) <= keys:
            # a section as a dict, given positionally, would read as a bad value of the first key
            raise TypeError(f"{cls.__name__} takes the keys as keywords, not a dict: {cls.__name__}(**{args[0]!r})")
        try:
            validated_init(self, *args, **kwargs)
        except pydantic.ValidationError as e:
            raise ValueError(_one_line(type(self), e)) from None

    cls.__init__ = __init__
    return cls


def _one_line(cls: type, error: pydantic.ValidationError) -> str:
    """pydantic's report of ``cls``'s first fault (or of every unknown key) as one line naming ``section.key``."""
    section, faults = cls.SECTION, error.errors(include_url=False)
    keys = [f.name for f in dataclasses.fields(cls) if f.init]
    unknown = [str(f["loc"][0]) for f in faults if f["type"] == "unexpected_keyword_argument"]
    if unknown:
        return (f"unknown key(s) {', '.join(f'{section}.{k}' for k in unknown)}; valid keys of {section}: "
                f"{', '.join(keys)}")
    fault = faults[0]
    if fault["type"] == "unexpected_positional_argument":  # loc is the argument's index, past the last field
        extra = sum(f["type"] == "unexpected_positional_argument" for f in faults)
        return (f"{section} takes at most {len(keys)} positional values ({', '.join(keys)}), got "
                f"{len(keys) + extra}; name them, e.g. {cls.__name__}({keys[0]}=...)")
    if not fault["loc"]:  # a check of __post_init__ (between keys, or a list's items): its message names the key
        return fault["msg"].removeprefix("Value error, ")
    name = keys[fault["loc"][0]] if isinstance(fault["loc"][0], int) else str(fault["loc"][0])  # positional
    hint = typing.get_type_hints(cls)[name]
    index = next((i for i in fault["loc"][1:] if isinstance(i, int)), None)
    where = f"{section}.{name}" if index is None else f"{section}.{name}[{index}]"
    if index is not None:  # an item of a list: its own type (of the tuple, or of the tuple in ``tuple | None``)
        members = typing.get_args(hint) if typing.get_origin(hint) in (Union, types.UnionType) else (hint,)
        hint = typing.get_args(next(a for a in members if typing.get_origin(a) is tuple))[0]
    value = fault["input"]
    bound = next((f"{op} {fault['ctx'][key]:g}" for key, op in _BOUNDS.items() if key in fault.get("ctx", {})), None)
    if bound is not None:  # out of the range its type declares: the bound it broke
        nullable = " or null" if type(None) in typing.get_args(hint) else ""
        return f"{where} must be {bound}{nullable}, got {value!r}"
    if fault["type"] == "literal_error":
        return f"{where} must be {fault['ctx']['expected']}, got {value!r}"
    return f"{where}={value!r}: expected {_type_name(hint)}, got {type(value).__name__}"


_BOUNDS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


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
