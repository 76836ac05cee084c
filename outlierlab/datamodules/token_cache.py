"""The corpus as one flat token file, built once out of core and memory-mapped by every process (nanoGPT's format).

``<cache_dir>/tokens/<hash>/`` (keyed by corpus identity, tokenizer and ``FORMAT_VERSION``, not the block size: blocks
are cut when read, ``outlierlab.datamodules.token_blocks``) holds ``tokens.bin``, every document's ids followed by
``</s>`` (little-endian ``uint16`` up to 65,536 ids, else ``int32``), and ``meta.json`` (format version, dtype, counts,
special ids).  The build streams documents through ``encode_documents``; it is atomic (temporary name, fsync, rename),
a cache is trusted only if ``meta.json`` has this format version and ``tokens.bin`` the bytes it announces, and a file
lock makes one process build while the others (DDP ranks) wait (docs/data_pipeline.md).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

import numpy as np
from filelock import FileLock

from outlierlab.utils.progress import eta_seconds, format_duration

from .tokenize_parallel import encode_documents
from .tokenizer import tokenizer_fingerprint

log = logging.getLogger(__name__)

# v1: packed Arrow blocks under <cache>/blocks/ (datasets.save_to_disk, loaded whole into memory).
# v2: one flat memory-mapped token file per (corpus, tokenizer), blocks derived when read.
FORMAT_VERSION = "flat-stream-v2"
TOKENS, META = "tokens.bin", "meta.json"


def token_dtype(vocab_size: int) -> np.dtype:
    """``uint16`` if every id of a ``vocab_size`` vocabulary (0..vocab_size-1) fits, i.e. ``vocab_size <= 65,536``;
    else ``int32``."""
    if vocab_size < 1:
        raise ValueError(f"vocabulary size must be >= 1, got {vocab_size}")
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<i4")


def token_cache_path(cache_dir: str | os.PathLike, corpus_id: str, tokenizer) -> Path:
    """Folder of the token file for this (corpus, tokenizer)."""
    key = json.dumps({"v": FORMAT_VERSION, "corpus": corpus_id, "tok": tokenizer_fingerprint(tokenizer)},
                     sort_keys=True)
    return Path(cache_dir).expanduser() / "tokens" / hashlib.sha256(key.encode()).hexdigest()[:20]


def read_meta(path: Path) -> dict[str, Any] | None:
    """The meta of a complete token file at ``path``, or None if there is none this code can trust."""
    try:
        meta = json.loads((path / META).read_text())
        size = (path / TOKENS).stat().st_size
    except (OSError, ValueError):
        return None
    if meta.get("format") != FORMAT_VERSION or size != meta["tokens"] * np.dtype(meta["dtype"]).itemsize:
        return None
    return meta


def ensure_token_file(path: Path, build) -> tuple[dict[str, Any], bool]:
    """``(meta, built)``: run ``build(path)`` unless ``path`` holds a trusted token file; one process builds, the others
    block on the lock (no timeout).  The builder removes leftovers of killed builds (``.<name>.*``)."""
    meta = read_meta(path)
    if meta is not None:
        return meta, False
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        meta = read_meta(path)
        if meta is not None:  # another process built it while we waited
            return meta, False
        for stale in path.parent.glob(f".{path.name}.*"):
            shutil.rmtree(stale, ignore_errors=True)
        if path.exists():  # an untrusted cache (older format, truncated): rebuild
            log.warning("token cache %s is incomplete or of another format version; rebuilding it", path)
            shutil.rmtree(path)
        build(path)
        meta = read_meta(path)
        if meta is None:
            raise RuntimeError(f"token cache {path} was built but does not verify; delete it and rerun")
        return meta, True


def write_token_file(documents: Iterable[str], tokenizer, eos_id: int, path: Path, meta: dict[str, Any],
                     num_proc: int = 1, chunk_chars: int = 1_000_000, fraction=None,
                     log_every_s: float = 30.0) -> dict[str, Any]:
    """Tokenize ``documents`` (a stream, read once) into ``path/tokens.bin`` + ``meta.json``, atomically.

    ``len(tokenizer)`` picks the dtype; ``eos_id`` follows every document; ``meta`` adds fields to ``meta.json``;
    ``num_proc, chunk_chars`` bound the tokenizer pass (``encode_documents``); ``fraction()`` (share read so far, or
    None) feeds the progress ETA, logged every ``log_every_s`` seconds.
    """
    dtype = token_dtype(len(tokenizer))
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    tmp.mkdir(parents=True)
    t0 = last = time.monotonic()
    n_tokens = n_docs = n_bytes = 0

    def progress(final: bool = False) -> None:
        el = max(time.monotonic() - t0, 1e-9)
        frac = fraction() if fraction is not None else None
        eta = "0:00:00" if final else format_duration(eta_seconds(frac or 0.0, 1.0, el) if frac else None)
        log.info("[tokenize] %s documents | %s tokens | %.1f MB of text, %.1f MB/s | %s tokens/s | elapsed %s | "
                 "ETA %s%s", f"{n_docs:,}", f"{n_tokens:,}", n_bytes / 1e6, n_bytes / 1e6 / el,
                 f"{n_tokens / el:,.0f}", format_duration(el), eta, f" ({100 * frac:.0f}%)" if frac else "")

    try:
        with open(tmp / TOKENS, "wb") as f:
            for ids, docs, nbytes in encode_documents(documents, tokenizer, eos_id, dtype, num_proc, chunk_chars):
                f.write(ids.tobytes())
                n_tokens, n_docs, n_bytes = n_tokens + len(ids), n_docs + docs, n_bytes + nbytes
                if time.monotonic() - last >= log_every_s:
                    progress()
                    last = time.monotonic()
            f.flush()
            os.fsync(f.fileno())
        if not n_docs:
            raise ValueError("the corpus gave no document to tokenize (no non-empty line / record)")
        meta = {**meta, "format": FORMAT_VERSION, "dtype": dtype.str, "tokens": n_tokens, "documents": n_docs,
                "bytes": n_bytes, "vocab_size": len(tokenizer), "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
                "build_seconds": round(time.monotonic() - t0, 2), "num_proc": num_proc}
        with open(tmp / META, "w") as f:
            f.write(json.dumps(meta, indent=2))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:  # an error or Ctrl-C: leave nothing behind (a kill -9 leaves tmp, removed next time)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    progress(final=True)
    log.info("token file: %s documents -> %s tokens (%s, %.1f MB) in %s", f"{n_docs:,}", f"{n_tokens:,}",
             dtype.name, n_tokens * dtype.itemsize / 1e6, path)
    return meta


def open_tokens(path: Path, meta: dict[str, Any]) -> np.memmap:
    """The token stream of a finished cache as a read-only memory map (pages shared by every process)."""
    if meta["tokens"] == 0:
        return np.zeros(0, dtype=np.dtype(meta["dtype"]))
    return np.memmap(path / TOKENS, dtype=np.dtype(meta["dtype"]), mode="r", shape=(int(meta["tokens"]),))
