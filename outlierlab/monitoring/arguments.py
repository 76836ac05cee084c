"""Checks of the monitors' settings, each a one-line ``TypeError``/``ValueError`` naming the argument.

The monitors used to coerce their settings with ``int()``, ``float()`` and ``bool()``, which accepted what a caller
never meant: ``every_n_steps="5"`` and ``2.7`` (recorded every 2 steps), ``vectors="no"`` (true), ``n_pairs=0``, a
bare string as ``sentences`` (its characters became the held-out batch). Settings reach the monitors from Python
calls and from Hydra configs (plain ``int``/``float``/``bool`` there, mappings as ``DictConfig``); numpy scalars
are accepted as the numbers they are.
"""

from __future__ import annotations

import numbers
import os
from typing import Any

import numpy as np

__all__ = ["count", "flag", "number", "texts", "path_like", "step", "tokenizer", "directory"]


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
    """None, or a sequence of strings as a list (one string alone is refused: its characters are not texts)."""
    if value is None:
        return None
    # a dict's keys would be the texts, and a set's order changes with the process (str hashes are salted)
    if isinstance(value, (str, bytes, dict, set, frozenset)) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} must be a list of strings (one text each), got {_got(value)[:80]}")
    out = list(value)
    bad = next((t for t in out if not isinstance(t, str)), None)
    if bad is not None:
        raise TypeError(f"{name} must be a list of strings (one text each), got an element {_got(bad)[:80]}")
    blank = [f"[{i}]" for i, t in enumerate(out) if not t.strip()]
    if blank:  # a row of padding between special tokens, measured as a sentence
        raise ValueError(f"{name} has {len(blank)} empty or blank item(s): {', '.join(blank[:8])}"
                         f"{' ...' if len(blank) > 8 else ''}; drop them")
    return out


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
    """A path (:func:`path_like`) that is not an existing file: a file there failed at the first record as
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
