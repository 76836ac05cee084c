"""Checks of the monitors' settings, each a one-line ``TypeError``/``ValueError`` naming the argument.

``int()``/``float()``/``bool()`` would accept ``every_n_steps="5"`` or ``2.7``, ``vectors="no"`` (true), a bare string
as ``sentences``.  Settings come from Python calls and Hydra configs (``DictConfig`` mappings); numpy scalars are
accepted as the numbers they are.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping, Set as AbstractSet
from typing import Any

import numpy as np

__all__ = ["count", "flag", "number", "texts", "table_columns", "path_like", "step", "tokenizer", "directory"]


def _got(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def count(name: str, value: Any, minimum: int | None, optional: bool = False) -> int | None:
    """``value`` as an int >= ``minimum`` (any int where None; or None where ``optional``); bools, strings and
    floats are refused."""
    if value is None and optional:
        return None
    if not _is_int(value) or (minimum is not None and int(value) < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise (ValueError if _is_int(value) else TypeError)(
            f"{name} must be an integer{bound}{' or None' if optional else ''}, got {_got(value)}")
    return int(value)


def flag(name: str, value: Any) -> bool:
    """``value`` as a bool: True/False (or a numpy bool) only -- ``bool("no")`` is true."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {_got(value)}")
    return bool(value)


def number(name: str, value: Any, low: float, high: float, low_open: bool = True) -> float:
    """``value`` as a float in ``(low, high]`` (``[low, high]`` with ``low_open=False``); bools are refused."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        v = float(value)
        ok = (v > low if low_open else v >= low) and v <= high
    if not ok:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ValueError(f"{name} must be a number in {interval}, got {_got(value)}")
    return float(value)


def texts(name: str, value: Any) -> list[str] | None:
    """None (the shipped sentences), or the texts as a list of strings: the one check of a list of sentences (the
    monitors' ``sentences``, the API's ``texts``).

    Any sequence of strings in its order (list, tuple, generator, pandas ``Series``).  Refused in one line naming the
    offending positions: a bare string, a ``DataFrame`` (it iterates over column names; the line names the column), a
    mapping, a set (unordered), no items, a non-string item, an empty or blank one.
    """
    if value is None:
        return None
    if isinstance(value, (str, bytes)):
        short = repr(value if len(value) <= 40 else value[:37] + "...")
        raise TypeError(f"{name} is a single {type(value).__name__} ({short}): pass a list of sentences, "
                        f"e.g. {name}=[text]")
    table = table_columns(value)
    if table is not None:
        column = next((c for c in table if str(c).lower() in ("text", "texts", "sentence", "sentences")),
                      table[0] if table else "text")
        shown = ", ".join(repr(c) for c in table[:4]) + (", ..." if len(table) > 4 else "")
        raise TypeError(f"{name} is a {type(value).__name__} (columns {shown or 'none'}): pass the sentences of one "
                        f"column as a list, e.g. {name}=df[{column!r}].tolist()")
    if isinstance(value, (Mapping, AbstractSet)):
        raise TypeError(f"{name} is a {type(value).__name__}: pass a list of sentences (their order decides which "
                        "are used and what the seeded samples draw)")
    try:
        out = list(value)
    except TypeError:
        raise TypeError(f"{name} is a {type(value).__name__}: pass a list of sentences (str)") from None
    if not out:
        raise ValueError(f"{name} is empty: pass at least one non-empty sentence (or None for the shipped ones)")
    bad = [f"[{i}] {type(t).__name__}" for i, t in enumerate(out) if not isinstance(t, str)]
    if bad:
        raise TypeError(f"{name} has {len(bad)} item(s) that are not strings: {listing(bad)}; pass sentences (str)")
    blank = [f"[{i}]" for i, t in enumerate(out) if not t.strip()]
    if blank:
        raise ValueError(f"{name} has {len(blank)} empty or blank item(s): {listing(blank)}; drop them")
    return out


def table_columns(value: Any) -> list | None:
    """The column names of a table (a pandas or polars ``DataFrame``, a pyarrow ``Table``), else None.  Duck-typed,
    so no table library is imported to recognise one; a pandas ``Series`` has no columns: it is a sequence."""
    columns = getattr(value, "columns", None)
    if columns is None:
        columns = getattr(value, "column_names", None)  # a pyarrow Table names them so
    try:
        return None if columns is None else list(columns)
    except TypeError:
        return None


def listing(items: list[str], limit: int = 8) -> str:
    """The first ``limit`` items joined, and how many more: the offending positions of a long list in one line."""
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def step(value: Any) -> int:
    """A training step: an integer >= 0 (a numpy or 0-d torch integer too); ``int()`` made 1.5 step 1 and "3"
    step 3, and a negative step was recorded."""
    import operator

    try:
        s = operator.index(value)
    except TypeError:
        raise TypeError(f"step must be an integer >= 0 (the optimizer step), got {_got(value)}") from None
    if s < 0:
        raise ValueError(f"step must be an integer >= 0 (the optimizer step), got {s}")
    return int(s)


def tokenizer(value: Any) -> Any:
    """None or a tokenizer object: a name (``tokenizer="bert-base-uncased"``) failed at the first record as
    "'str' object is not callable"."""
    if isinstance(value, (str, bytes, os.PathLike)):
        raise TypeError(f"tokenizer={str(value)!r} is a name: pass the tokenizer itself, e.g. "
                        f"tokenizer=AutoTokenizer.from_pretrained({str(value)!r})")
    if value is not None and not callable(value):
        raise TypeError(f"tokenizer must be a Hugging Face tokenizer (callable) or None, got {_got(value)[:80]}")
    return value


def directory(name: str, value: Any) -> Any:
    """A path (``path_like``) that is not an existing file: a file there failed at the first record as
    "[Errno 17] File exists"."""
    value = path_like(name, value)
    if os.path.exists(os.path.expanduser(value)) and not os.path.isdir(os.path.expanduser(value)):
        raise ValueError(f"{name}={os.fspath(value)!r} is a file: pass a directory (it is made if missing)")
    return value


def path_like(name: str, value: Any, optional: bool = False) -> Any:
    """A ``str`` or ``os.PathLike`` (or None where ``optional``), unchanged."""
    if (value is None and optional) or isinstance(value, (str, os.PathLike)):
        return value
    raise TypeError(f"{name} must be a path (str or os.PathLike){' or None' if optional else ''}, got {_got(value)}")
