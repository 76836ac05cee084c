"""Read pretraining text: the embedded corpus, user text files, or a Hugging Face hub dataset.

A *document* is one non-empty line of a text file, or one record of a hub dataset.  Every loader returns ``list[str]``
in a fixed order, and each source has a cheap *identity* string (content hash or hub coordinates) keying the tokenizer
and block caches.  The ``iter_*`` functions stream the same documents (``outlierlab.datamodules.documents`` wraps them).
``datasets``/``huggingface_hub`` are imported lazily.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Iterator, Sequence

from outlierlab.utils.atomic import write_atomic
from outlierlab.utils.hub import hub_is_offline


EMBEDDED_DIR = Path(__file__).resolve().parent / "data" / "corpus"
_LOCAL_BUILDERS = {"text", "json", "csv", "parquet", "arrow"}  # datasets' packaged loaders for local files


# --------------------------------------------------------------------------------------------------- files
def embedded_files() -> list[Path]:
    """The embedded corpus files in document order (as listed in ``manifest.json``)."""
    manifest = EMBEDDED_DIR / "manifest.json"
    if not manifest.is_file():
        raise FileNotFoundError(f"embedded corpus manifest missing: {manifest}; run scripts/build_corpus.py")
    return [EMBEDDED_DIR / f["file"] for f in json.loads(manifest.read_text())["files"]]


def read_text_file(path: str | os.PathLike) -> list[str]:
    """``list(iter_text_file(path))``."""
    return list(iter_text_file(path))


def iter_text_file(path: str | os.PathLike, raw_position: list[int] | None = None) -> Iterator[str]:
    """Stream the documents (non-empty, stripped lines) of one UTF-8 ``.txt`` or gzip ``.txt.gz`` file.

    Lines that are not valid UTF-8 are SKIPPED (no U+FFFD tokens in training data), with one warning naming the file and
    count.  ``raw_position`` (a list of one int) receives the bytes read so far (compressed for ``.gz``).  Raises
    FileNotFoundError, or ValueError for a file without a non-empty line (at its end) or invalid gzip.
    """
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"text file not found: {p}")
    n, bad = 0, 0
    try:
        with open(p, "rb") as raw:  # bytes, so one bad line does not abort the whole file
            f = gzip.GzipFile(fileobj=raw) if p.suffix == ".gz" else raw
            for line_bytes in f:
                if raw_position is not None:
                    raw_position[0] = raw.tell()
                try:
                    line = line_bytes.decode("utf-8")
                except UnicodeDecodeError:
                    bad += 1
                    continue
                line = line.replace("\ufeff", "").strip()
                if line:
                    n += 1
                    yield line
    except gzip.BadGzipFile as e:
        raise ValueError(f"{p} is not a valid gzip file ({e}); use .txt for plain text") from None
    if bad:
        warnings.warn(f"{p}: skipped {bad} line(s) that are not valid UTF-8", UnicodeWarning, stacklevel=2)
    if not n:
        raise ValueError(f"text file {p} contains no text (no non-empty UTF-8 line)")


def load_texts_from_files(files: str | os.PathLike | Sequence[str | os.PathLike],
                          max_documents: int | None = None) -> list[str]:
    """Documents of several text files, in order; all paths are checked before any is read."""
    paths = corpus_paths(files)
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"text file not found: {p} (data.files={[str(q) for q in paths]})")
    docs: list[str] = []
    for p in paths:
        docs.extend(read_text_file(p))
        if max_documents is not None and len(docs) >= max_documents:
            break
    return _limit(docs, max_documents)


def load_embedded_texts(max_documents: int | None = None) -> list[str]:
    """Documents of the embedded corpus (Austen, Moby Dick, KJV Pentateuch; see data/corpus/NOTICE.md)."""
    return load_texts_from_files(embedded_files(), max_documents)


# ----------------------------------------------------------------------------------------------------- hub
def load_hub_texts(path: str = "wikimedia/wikipedia", name: str | None = "20231101.en", split: str = "train",
                   text_column: str = "text", max_documents: int | None = 10_000, streaming: bool = True,
                   data_files: str | Sequence[str] | None = None, revision: str | None = None,
                   cache_dir: str | os.PathLike | None = None) -> list[str]:
    """First ``max_documents`` non-empty documents of a ``datasets.load_dataset`` dataset.

    Default: English Wikipedia (``wikimedia/wikipedia``, ``20231101.en``), streamed.  ``path`` may be a packaged local
    loader, e.g. ``load_hub_texts("text", None, data_files=["a.txt"])``.  Offline a streamed hub id fails fast with one
    line (ConnectionError); non-streaming loads are tried from the cache.  ValueError: ``max_documents`` missing for a
    streamed dataset, missing ``text_column``, or no text; RuntimeError: loading or reading failed.
    """
    if streaming and not max_documents:
        raise ValueError(f"data.max_documents must be set (>0) to stream {path}, e.g. data.max_documents=10000")
    return _limit(list(iter_hub_texts(path, name, split, text_column, max_documents, streaming, data_files,
                                      revision, cache_dir)), max_documents)


def iter_hub_texts(path: str = "wikimedia/wikipedia", name: str | None = "20231101.en", split: str = "train",
                   text_column: str = "text", max_documents: int | None = None, streaming: bool = True,
                   data_files: str | Sequence[str] | None = None, revision: str | None = None,
                   cache_dir: str | os.PathLike | None = None, progress: list[int] | None = None) -> Iterator[str]:
    """Stream the first ``max_documents`` (None: all) non-empty documents of a ``datasets`` dataset, one batch of rows
    at a time (streamed shards, or the Arrow cache in batches of 1,000).  As ``load_hub_texts``; ``progress`` (two ints)
    receives ``[documents yielded, expected or 0]``."""
    local = path in _LOCAL_BUILDERS or Path(path).expanduser().exists()
    what = f"{path}" + (f" ({name})" if name else "")
    advice = ("use data=embedded, or data=files data.files=[a.txt,b.txt.gz] for local text, or pre-download "
              f"it on a machine with network (datasets.load_dataset('{path}', {name!r})) and rerun with "
              "HF_HUB_OFFLINE=1 data.hub.streaming=false")
    if not local and streaming and hub_is_offline():
        raise ConnectionError(f"cannot stream hub dataset {what}: no network (HF_HUB_OFFLINE or hub unreachable); "
                              + advice)
    import datasets  # lazy: this module is imported by the start-up checks; datasets takes seconds

    if not local and not streaming and hub_is_offline():
        _go_offline(datasets)  # serve it from the datasets cache without ~40 s of network retries

    def failed(e: Exception) -> RuntimeError:  # network, auth, unknown config ... -> one line (cause chained)
        first = (str(e).strip().splitlines() or [""])[0][:300]
        return RuntimeError(f"loading {what} split {split!r} failed ({type(e).__name__}: {first}); "
                            + (advice if not local else "check data.hub and data.files"))

    try:
        ds = datasets.load_dataset(path, name, split=split, streaming=streaming, data_files=data_files,
                                   revision=revision, cache_dir=None if cache_dir is None else str(cache_dir))
    except Exception as e:
        raise failed(e) from e
    columns = ds.column_names
    if columns is not None and text_column not in columns:
        raise ValueError(f"{what} has no column {text_column!r} (columns: {sorted(columns)}); "
                         "set data.hub.text_column")
    if progress is not None:
        progress[1] = int(max_documents or (0 if streaming else len(ds)) or _split_size(ds, split))
    rows = iter(ds.select_columns([text_column]) if columns is not None else ds) if streaming else \
        (row for batch in ds.select_columns([text_column]).iter(batch_size=1000)
         for row in ({text_column: t} for t in batch[text_column]))
    n = 0
    while max_documents is None or n < max_documents:
        try:
            row = next(rows)
        except StopIteration:
            break
        except Exception as e:
            raise failed(e) from e
        if text_column not in row:
            raise ValueError(f"{what} has no column {text_column!r} (columns: {sorted(row)}); "
                             "set data.hub.text_column")
        text = row[text_column]
        if isinstance(text, str) and text.strip():
            n += 1
            if progress is not None:
                progress[0] = n
            yield text.strip()
    if not n:
        raise ValueError(f"dataset {what} split {split!r} gave no non-empty {text_column!r} documents")


def _split_size(ds, split: str) -> int:
    """Rows of a streamed split when the dataset card records them (Wikipedia's does), else 0."""
    try:
        return int(ds.info.splits[split].num_examples)
    except Exception:  # no info, no split record: progress without ETA
        return 0


def _go_offline(datasets_module) -> None:
    """Switch this process to offline mode (the flags are read at import, so set the module copies too)."""
    from huggingface_hub import constants  # lazy: kept out of the start-up checks, as datasets above

    os.environ["HF_HUB_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True
    datasets_module.config.HF_HUB_OFFLINE = True


# ------------------------------------------------------------------------------------------------ identity
def stat_memo(directory: str | os.PathLike, paths: Sequence[Path]) -> Path:
    """The memo file under ``directory`` of ``paths`` as they are now, keyed by each one's (real path, size, mtime ns,
    inode) as git's index and ccache do: an in-place rewrite changes the mtime, so it gets a new memo."""
    stats = [(str(p.resolve()), st.st_size, st.st_mtime_ns, st.st_ino) for p, st in ((p, p.stat()) for p in paths)]
    return Path(directory).expanduser() / (hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:24] + ".json")


def read_memo(memo: Path, key: str):
    """``key`` of a memo file, or None when there is none (or it is torn)."""
    try:
        return json.loads(memo.read_text())[key]
    except (OSError, ValueError, KeyError):
        return None


def write_memo(memo: Path, payload: dict) -> None:
    memo.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(memo, json.dumps(payload))


def file_identity(files: Sequence[str | os.PathLike], memo_dir: str | os.PathLike | None = None) -> str:
    """sha256 over the raw bytes of ``files`` (in order): changes when any file changes, not when it moves.

    With ``memo_dir`` the digest is remembered per file stat (``stat_memo``), so a warm run does not re-read gigabytes.
    """
    paths = corpus_paths(files)
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"text file not found: {p}")
    memo = None if memo_dir is None else stat_memo(memo_dir, paths)
    if memo is not None and (digest := read_memo(memo, "sha256")) is not None:
        return digest
    h = hashlib.sha256()
    for p in paths:
        h.update(str(p.stat().st_size).encode())
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    if memo is not None:
        write_memo(memo, {"files": [str(p) for p in paths], "sha256": h.hexdigest()})
    return h.hexdigest()


def corpus_identity(source: str, files: Sequence[str] | None = None, hub: dict | None = None,
                    max_documents: int | None = None, memo_dir: str | os.PathLike | None = None) -> str:
    """Short stable id of the documents ``load_texts`` returns for these arguments (no text is read for hub
    ids; local files are hashed, or their digest is read from ``memo_dir``, see ``file_identity``)."""
    if source == "embedded":
        ident = {"source": "embedded", "content": file_identity(embedded_files(), memo_dir)}
    elif source == "files":
        ident = {"source": "files", "content": file_identity(corpus_paths(files), memo_dir)}
    elif source == "hub":
        hub = dict(hub or {})
        if hub.get("data_files"):  # local files behind a packaged loader: hash their content
            hub["data_files"] = file_identity(corpus_paths(hub["data_files"]), memo_dir)
        ident = {"source": "hub", **{k: hub.get(k) for k in sorted(hub) if k != "cache_dir"}}
    else:
        raise ValueError(f"unknown data.source {source!r}; choose embedded, files or hub")
    ident["max_documents"] = max_documents
    return hashlib.sha256(json.dumps(ident, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load_texts(source: str, files: Sequence[str] | None = None, hub: dict | None = None,
               max_documents: int | None = None) -> list[str]:
    """Documents of ``source`` ("embedded" | "files" | "hub"); the single entry point of the datamodule."""
    if source == "embedded":
        return load_embedded_texts(max_documents)
    if source == "files":
        return load_texts_from_files(files, max_documents)
    if source == "hub":
        return load_hub_texts(**{**(hub or {}), "max_documents": max_documents})
    raise ValueError(f"unknown data.source {source!r}; choose embedded, files or hub")


# ----------------------------------------------------------------------------------------------- helpers
def corpus_paths(files) -> list[Path]:
    """Text file paths; a corpus FOLDER (one with ``manifest.json``, as the build scripts write) stands for
    its files in manifest order."""
    if files is None or (not isinstance(files, (str, os.PathLike)) and len(files) == 0):
        raise ValueError("no text files given: set data.files=[a.txt,b.txt.gz] (one document per line)")
    if isinstance(files, (str, os.PathLike)):
        files = [files]
    paths: list[Path] = []
    for f in files:
        p = Path(str(f)).expanduser()
        if p.suffix in (".txt", ".gz"):
            paths.append(p)
        elif (p / "manifest.json").is_file():
            paths.extend(p / e["file"] for e in json.loads((p / "manifest.json").read_text())["files"])
        elif p.is_dir():
            raise ValueError(f"corpus folder {p} has no manifest.json; list its .txt/.txt.gz files in data.files")
        elif not p.exists():
            raise FileNotFoundError(f"corpus folder {p} does not exist; build it first (data=english_large: "
                                    f"apt-get install dict-gcide && python scripts/build_english_large.py)")
        else:
            paths.append(p)
    return paths


def _limit(docs: list[str], max_documents: int | None) -> list[str]:
    if max_documents is not None and max_documents < 1:
        raise ValueError(f"max_documents must be >= 1 or null, got {max_documents}")
    return docs if max_documents is None else docs[:max_documents]
