"""One validation of every user data file, run by the entry points before any model is loaded.

Plain Python (csv, json, gzip), so a bad file fails in a second with one line naming the file and the fault.
Inputs: ``data.files`` (train.py ``data=files``: one document per line; probe.py, evaluate.py: one sentence per
line), ``task.files`` (probe.py ``task=local``: CSV/TSV/JSON(L) with text/label columns), ``wic.files``
(evaluate.py: sentence1, sentence2, start1, end1, start2, end2, label), ``sts.files`` (evaluate.py: sentence1,
sentence2, score) and ``encoder.name_or_path`` (probe.py, evaluate.py: run dir, checkpoint, model dir).

Faults (``DataFileError``): missing or empty file; header without rows; missing column (existing ones listed); a
wrong-typed value (row and column named); non-UTF-8 bytes (line named); a split too small after carving (sizes and
setting); a truncated gzip.  Fewer than 30 STS pairs is a warning.
"""

from __future__ import annotations

import csv
import difflib
import gzip
import io
import json
import math
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from .corpus import corpus_paths, read_memo, stat_memo, write_memo

__all__ = ["DataFileError", "MissingDataFileError", "read_lines", "read_table", "validate_inputs",
           "FEW_STS_PAIRS"]

FEW_STS_PAIRS = 30  # below this a Spearman ρ's 95% interval is wider than ±0.35: valid, but weak
_TRUE = {"t", "true", "1", "yes", "y"}
_FALSE = {"f", "false", "0", "no", "n"}


class DataFileError(ValueError):
    """A user data file that cannot be used; the message is one line naming the file and what to fix."""


class MissingDataFileError(DataFileError, FileNotFoundError):
    """A data file (or model path) that does not exist."""


def _fail(key: str, path, what: str) -> DataFileError:
    return DataFileError(f"{key}: {path}: {what}")


# ------------------------------------------------------------------------------------------------ reading
def read_lines(path: str | Path, key: str) -> list[str]:
    """Every line of a text file (``.gz`` decompressed), decoded as UTF-8; one-line errors for a missing,
    empty, non-UTF-8 (line number) or truncated/corrupt gzip file."""
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise MissingDataFileError(f"{key}: file not found: {path}")
    try:
        raw = gzip.decompress(p.read_bytes()) if p.name.endswith(".gz") else p.read_bytes()
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
        raise _unreadable(key, path, e) from None
    if not raw.strip():
        raise _fail(key, path, "the file is empty")
    return [_utf8(line, i, key, path).removesuffix("\r") for i, line in enumerate(raw.split(b"\n"), 1)]


def _utf8(line: bytes, i: int, key: str, path) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _fail(key, path, f"line {i} is not UTF-8 (byte {line[e.start]:#x} at column {e.start + 1}); "
                               "re-save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


def _unreadable(key: str, path, e: Exception) -> DataFileError:
    if isinstance(e, EOFError):
        return _fail(key, path, "the gzip file is truncated (incomplete download or copy?): recompress or re-copy it")
    return _fail(key, path, f"not a valid gzip file ({e}); drop the .gz suffix if it is plain text")


def count_text_lines(path: str | Path, key: str) -> int:
    """Non-blank lines of a text file (``.gz`` decompressed), read as a stream: the faults and messages of
    ``read_lines`` in memory of one line -- a training corpus can be larger than memory."""
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise MissingDataFileError(f"{key}: file not found: {path}")
    n, seen = 0, False
    try:
        with open(p, "rb") as raw:
            f = gzip.GzipFile(fileobj=raw) if p.name.endswith(".gz") else raw
            for i, line in enumerate(f, 1):
                text = _utf8(line, i, key, path)
                if text.strip():
                    n, seen = n + 1, True
                elif line.strip():  # e.g. a line of U+FEFF / non-breaking spaces: bytes, no text
                    seen = True
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
        raise _unreadable(key, path, e) from None
    if not n and not seen:
        raise _fail(key, path, "the file is empty")
    return n


def _counted_before(path: str, memo_dir) -> tuple[Path | None, int | None]:
    """A training corpus checked by an earlier run: the count recorded under ``memo_dir`` by the file's stat
    (``corpus.stat_memo``): a rewritten file is checked again."""
    if memo_dir is None:
        return None, None
    try:
        memo = stat_memo(Path(str(memo_dir)).expanduser() / "checked_files", [Path(str(path)).expanduser()])
    except OSError:
        return None, None
    n = read_memo(memo, "lines")
    return memo, None if n is None else int(n)


def read_table(path: str | Path, key: str) -> tuple[list[str], list[dict], list[int]]:
    """``(columns, rows, line of each row)`` of a CSV/TSV/JSON/JSONL file (``.gz`` ok)."""
    lines = read_lines(path, key)
    name = str(path).lower().removesuffix(".gz")
    if name.endswith((".csv", ".tsv")):
        reader = csv.reader(io.StringIO("\n".join(lines)), delimiter="\t" if name.endswith(".tsv") else ",")
        header, data = [], []
        for rec in reader:  # line numbers from the reader: a quoted field may span lines
            if not header:
                header = [h.strip() for h in rec]
            elif any(c.strip() for c in rec):
                data.append((reader.line_num, dict(zip(header, rec))))
        if not data:
            raise _fail(key, path, f"has a header ({', '.join(header)}) but no rows")
        return header, [r for _, r in data], [i for i, _ in data]
    if name.endswith((".json", ".jsonl")):
        text = "\n".join(lines).strip()
        if text.startswith("["):
            try:
                rows, where = json.loads(text), None
            except json.JSONDecodeError as e:
                raise _fail(key, path, f"line {e.lineno}: invalid JSON ({e.msg})") from None
        else:
            rows, where = [], []
            for i, line in enumerate(lines, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise _fail(key, path, f"line {i}: invalid JSON ({e.msg})") from None
                    where.append(i)
        if not rows:
            raise _fail(key, path, "holds an empty JSON list: no rows")
        if not all(isinstance(r, dict) for r in rows):
            raise _fail(key, path, "every JSON row must be an object {column: value}")
        columns = list(dict.fromkeys(k for r in rows for k in r))
        return columns, rows, where or list(range(1, len(rows) + 1))
    raise _fail(key, path, "must be .csv, .tsv, .json or .jsonl (optionally .gz)")


# ------------------------------------------------------------------------------------------------ checks
@dataclass
class TableSpec:
    """Required columns and the type of some of them (``float``, ``int``, ``bool``, ``label``)."""

    required: tuple[str, ...]
    types: dict[str, str] = field(default_factory=dict)
    fix: str = ""


def _ok(value, kind: str) -> bool:
    if kind in ("float", "int"):
        try:
            x = float(value)
            return not isinstance(value, bool) and (math.isfinite(x) if kind == "float" else x == int(x))
        except (TypeError, ValueError):
            return False
    if kind == "bool":
        return isinstance(value, bool) or (isinstance(value, (int, float)) and value in (0, 1)) or \
            str(value).strip().lower() in _TRUE | _FALSE
    if kind == "label":  # an integer class id or a non-empty class name
        return value is not None and not isinstance(value, (float, dict, list)) and str(value).strip() != ""
    raise ValueError(kind)


_KIND_TEXT = {"float": "a number", "int": "an integer", "bool": "true/false, T/F or 0/1",
              "label": "an integer or a class name"}


def check_table(path, key: str, spec: TableSpec) -> tuple[list[str], list[dict]]:
    columns, rows, where = read_table(path, key)
    for col in spec.required:
        if col not in columns:
            close = difflib.get_close_matches(col, columns, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _fail(key, path, f"no column {col!r}{hint}; the file has columns {', '.join(columns) or '(none)'}"
                        + (f"; {spec.fix}" if spec.fix else ""))
    for r, line in zip(rows, where):
        for col, kind in spec.types.items():
            if not _ok(r.get(col), kind):
                raise _fail(key, path, f"row at line {line}, column {col!r}: {r.get(col)!r} is not {_KIND_TEXT[kind]}")
    return columns, rows


def _files(value) -> list[str]:
    if not value:
        return []
    names = [str(value)] if isinstance(value, str) else [str(v) for v in value]
    # a built corpus folder (manifest.json, e.g. data=english_large) stands for its files
    return [str(f) for n in names
            for f in (corpus_paths([n]) if (Path(n).expanduser() / "manifest.json").is_file() else [n])]


STS = TableSpec(("sentence1", "sentence2", "score"), {"score": "float"},
                "sts.files need columns sentence1, sentence2, score")
WIC = TableSpec(("sentence1", "sentence2", "start1", "end1", "start2", "end2", "label"),
                {"start1": "int", "end1": "int", "start2": "int", "end2": "int", "label": "bool"},
                "wic.files need columns sentence1, sentence2, start1, end1, start2, end2, label")


def _sentences(cfg, key: str, minimum: int, why: str, memo_dir=None) -> None:
    files = _files(_select(cfg, key))
    total = 0
    for f in files:
        memo, n = _counted_before(f, memo_dir)
        if n is None:
            n = count_text_lines(f, key)
        if n == 0:
            raise _fail(key, f, "holds only blank lines")
        if memo is not None:
            write_memo(memo, {"file": str(f), "lines": n})
        total += n
    cap = _select(cfg, "data.max_sentences")
    total = min(total, int(cap)) if cap is not None else total
    if files and total < minimum:
        raise DataFileError(f"{key}: {', '.join(files)}: {total} sentences are too few: {why}")


def _select(cfg, key: str):
    node = cfg
    for part in key.split("."):
        if node is None or not hasattr(node, "get") or part not in node:
            return None
        node = node.get(part)
    return node


def _classifier(cfg) -> None:
    task = _select(cfg, "task")
    if task is None or task.get("source") != "local" or not task.get("files"):
        return
    files = task.get("files")
    spec = TableSpec((str(task.get("text_field", "text")), str(task.get("label_field", "label"))),
                     {str(task.get("label_field", "label")): "label"},
                     "set task.text_field / task.label_field to your columns")
    by_split = dict(files) if hasattr(files, "items") else {"train": _files(files)}
    sizes = {s: sum(len(check_table(f, "task.files", spec)[1]) for f in _files(v)) for s, v in by_split.items()}
    n, frac = sizes.get("train", 0), float(task.get("val_fraction", 0.1))
    carve = [s for s in ("validation", "test") if s not in sizes]
    n_out = max(1, int(round(frac * n)))
    left = n - n_out * len(carve)
    if carve and left < 1:
        raise DataFileError(
            f"task.files: {', '.join(_files(by_split.get('train')))}: {n} training rows leave {left} for training "
            f"after carving {' and '.join(f'{s} ({n_out})' for s in carve)} out (task.val_fraction={frac:g}); give "
            "more rows or separate files: task.files={train: a.csv, validation: b.csv, test: c.csv}")
    for s, k in sizes.items():
        if k < 1:
            raise DataFileError(f"task.files: split {s} is empty")


def _position(cfg) -> None:
    fr = _select(cfg, "probe.splits")
    if fr is None:
        return
    fr = [float(x) for x in fr]
    files = _files(_select(cfg, "data.files"))
    if not files:
        return
    n = sum(count_text_lines(f, "data.files") for f in files)
    cap = _select(cfg, "data.max_sentences")
    n = min(n, int(cap)) if cap is not None else n
    tot = sum(fr)
    n_train, n_val = int(round(fr[0] / tot * n)), int(round(fr[1] / tot * n))
    if n_train < 1 or n - n_train - n_val < 1:
        raise DataFileError(f"data.files: {', '.join(files)}: {n} sentences give train/validation/test = "
                            f"{n_train}/{n_val}/{n - n_train - n_val} with probe.splits={fr}: every split needs "
                            "at least one sentence; give more sentences or change probe.splits")


def _sts(cfg) -> list[str]:
    notes = []
    for f in _files(_select(cfg, "sts.files")):
        _, rows = check_table(f, "sts.files", STS)
        if len(rows) < 2:
            raise _fail("sts.files", f, f"{len(rows)} pair: Spearman needs at least 2 (SentEval sets have hundreds)")
        if len(rows) < FEW_STS_PAIRS:
            msg = (f"sts.files: {f}: only {len(rows)} pairs — the Spearman ρ is valid but weak (its 95% interval "
                   f"is wide below {FEW_STS_PAIRS} pairs); it is reported with its pair count")
            warnings.warn(msg, stacklevel=2)
            notes.append(msg)
    return notes


def _wic(cfg) -> None:
    split = _select(cfg, "wic.split")
    for f in _files(_select(cfg, "wic.files")):
        columns, rows = check_table(f, "wic.files", WIC)
        if split and "split" in columns and not any(r.get("split") == split for r in rows):
            found = sorted({str(r.get("split")) for r in rows})
            raise _fail("wic.files", f, f"no pair in split {split!r} (wic.split); the file has splits "
                                        f"{', '.join(found)}")


def _encoder(cfg) -> None:
    name = _select(cfg, "encoder.name_or_path")
    if name is None:
        return
    # lazy: models imports torch, and this module runs before it (start-up checks); no weights are loaded
    from outlierlab.models.encoder_source import resolve_encoder

    p = Path(str(name)).expanduser()
    if p.is_dir() and not any(p.iterdir()):
        raise DataFileError(f"encoder.name_or_path: {name}: the directory is empty (no run, checkpoint or model "
                            "files); point it at a train.py run dir, a *.ckpt, or a save_pretrained directory")
    rev = _select(cfg, "encoder.revision")
    resolve_encoder(str(name), None if rev is None else str(rev))


def validate_inputs(cfg, entry: str, check_encoder: bool = True) -> list[str]:
    """Check every data file ``cfg`` names for ``entry`` ("train", "probe", "evaluate") before any model loads.

    Returns warnings (valid but weak input) for the report; raises ``DataFileError`` (one line) otherwise.
    """
    if entry == "train":
        if _select(cfg, "data.source") == "files":  # checked once per file version (data.cache_dir/checked_files)
            _sentences(cfg, "data.files", 1, "", memo_dir=_select(cfg, "data.cache_dir"))
        return []
    if entry == "probe":
        kind = _select(cfg, "task.kind")
        if kind == "position":
            _sentences(cfg, "data.files", 1, "")
            _position(cfg)
        else:
            _classifier(cfg)
        if check_encoder:
            _encoder(cfg)
        return []
    if entry == "evaluate":
        _sentences(cfg, "data.files", 2, "the geometry analyses need at least 2 (data.max_sentences)")
        _wic(cfg)
        notes = _sts(cfg)
        if check_encoder:  # False: the caller holds the encoder already (its name is only a name)
            _encoder(cfg)
        return notes
    raise ValueError(f"unknown entry point {entry!r}")
