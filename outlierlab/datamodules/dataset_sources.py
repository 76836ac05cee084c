"""Loading labelled data through ``datasets``: a hub id or local files, with one-line errors.

Shared by probe.py's classifier tasks and evaluate.py's WiC/STS sets. Offline (``HF_HUB_OFFLINE`` or hub
unreachable) a hub id is served from the local datasets cache or fails at once, instead of after ~40 s
of network retries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import datasets

from outlierlab.datamodules.corpus import _go_offline, hub_is_offline


def load_hub(path: str, name: str | None = None, split: str | None = None, advice: str = ""):
    """``datasets.load_dataset(path, name, split=split)``; any failure becomes one line ending in ``advice``."""
    offline = hub_is_offline()
    if offline:
        _go_offline(datasets)
    what = repr(path + (f" ({name})" if name else "")) + (f" split {split!r}" if split else "")
    try:
        return datasets.load_dataset(path, name, split=split)
    except Exception as e:  # network, unknown name/split, ... -> one line; the cause stays chained
        if offline:
            raise ConnectionError(f"cannot load hub dataset {what}: not in the local datasets cache and the hub "
                                  f"is unreachable (offline); {advice}") from e
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise ConnectionError(f"loading hub dataset {what} failed ({type(e).__name__}: {first}); {advice}") from e


def file_builder(files: Sequence[str], what: str) -> tuple[str, dict]:
    """The ``datasets`` builder and options for local ``.csv``/``.tsv``/``.json``/``.jsonl`` files (``.gz`` ok)."""
    exts = {f.lower().removesuffix(".gz").rsplit(".", 1)[-1] for f in files}
    if exts <= {"csv"}:
        return "csv", {}
    if exts <= {"tsv"}:
        return "csv", {"delimiter": "\t"}
    if exts <= {"json", "jsonl"}:
        return "json", {}
    raise ValueError(f"{what} files must all be .csv, .tsv or .json/.jsonl (optionally .gz), got {sorted(exts)}")


def existing_files(files, what: str) -> list[str]:
    """``files`` (one path or a list) as expanded strings; a missing one is a one-line FileNotFoundError."""
    out = [str(Path(str(f)).expanduser()) for f in ([files] if isinstance(files, str) else list(files))]
    for f in out:
        if not Path(f).is_file():
            raise FileNotFoundError(f"{what} file not found: {f}")
    return out


def load_local(files, required: Sequence[str], what: str):
    """Rows of local files (one ``train`` split) that must hold the ``required`` columns."""
    files = existing_files(files, what)
    builder, kw = file_builder(files, what)
    ds = datasets.load_dataset(builder, data_files=files, split="train", **kw)
    missing = [c for c in required if c not in ds.column_names]
    if missing:
        raise ValueError(f"{what} files {files} lack column(s) {missing} (columns: {ds.column_names})")
    return ds
