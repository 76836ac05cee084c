"""Tokenize a document stream in parallel, in order, with bounded memory: ``</s>``-terminated id chunks.

Documents are grouped into chunks of about ``chunk_chars`` characters, each encoded by one of ``num_proc`` worker
processes into one flat id array, and returned **in input order**, so the stream is the same for every ``num_proc``.  At
most ``2 * num_proc`` chunks are in flight, bounding memory whatever the corpus.

Not ``datasets.Dataset.map(num_proc=...)``: it needs a materialised Arrow copy of the text and of every token list, and
cannot shard a streamed ``IterableDataset``; ``Pool.imap`` reads its input without limit.  The workers run the Rust
``tokenizers.Tokenizer`` behind a fast HF tokenizer (``encode_batch``/``encode_batch_fast``, what
``PreTrainedTokenizerFast.__call__`` runs), rebuilt from JSON, so they import neither torch nor transformers; a slow
tokenizer is sent as is.  ``TOKENIZERS_PARALLELISM=false`` in the workers: ``num_proc`` sets the parallelism.
"""
from __future__ import annotations

import collections
import itertools
import multiprocessing as mp
import os
from typing import Any, Iterable, Iterator

import numpy as np

_WORKER: dict[str, Any] = {}  # per worker process: the encoder built by _init_worker


def default_num_proc() -> int:
    """CPU cores this process may use (``sched_getaffinity``; ``os.cpu_count()`` where unavailable)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def _init_worker(spec: tuple[str, Any], eos_id: int, dtype: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: num_proc is the parallelism
    kind, obj = spec
    if kind == "rust":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_str(obj)
        tok.no_truncation()
        tok.no_padding()

        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets we do not keep: same ids, ~15% faster
        batch = getattr(tok, "encode_batch_fast", tok.encode_batch)

        def encode(texts: list[str]) -> list[list[int]]:
            return [e.ids for e in batch(texts, add_special_tokens=False)]
    else:
        def encode(texts: list[str]) -> list[list[int]]:
            return obj(texts, add_special_tokens=False, verbose=False)["input_ids"]
    _WORKER.update(encode=encode, eos=int(eos_id), dtype=np.dtype(dtype))


def _encode_chunk(texts: list[str]) -> tuple[np.ndarray, int, int]:
    """``(ids, documents, UTF-8 bytes)`` of one chunk; ids = each document's ids then ``</s>``."""
    eos, dtype = _WORKER["eos"], _WORKER["dtype"]
    ids = _WORKER["encode"](texts)
    flat = np.fromiter(itertools.chain.from_iterable(itertools.chain(x, (eos,)) for x in ids), dtype=np.int64,
                       count=sum(len(x) for x in ids) + len(ids))
    if len(flat) and (flat.min() < 0 or flat.max() > np.iinfo(dtype).max):
        raise ValueError(f"token id {int(flat.max())} does not fit the token file's {dtype} (vocabulary size "
                         f"too small for the tokenizer's ids); report this tokenizer")
    return flat.astype(dtype), len(texts), sum(len(t.encode("utf-8")) for t in texts)


def chunk_documents(documents: Iterable[str], chunk_chars: int) -> Iterator[list[str]]:
    """Consecutive documents in lists of about ``chunk_chars`` characters (a longer document is one chunk)."""
    chunk, size = [], 0
    for doc in documents:
        chunk.append(doc)
        size += len(doc)
        if size >= chunk_chars:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def encode_documents(documents: Iterable[str], tokenizer, eos_id: int, dtype, num_proc: int = 1,
                     chunk_chars: int = 1_000_000) -> Iterator[tuple[np.ndarray, int, int]]:
    """Yield ``(ids, documents, bytes)`` per chunk of ``documents`` (read once, lazily), in order.

    Ids come from ``tokenizer(texts, add_special_tokens=False)``, ``eos_id`` after every document, as ``dtype`` (an id
    that does not fit raises ``ValueError``).  ``num_proc`` 1 encodes in this process; ``chunk_chars`` per chunk.
    """
    if num_proc < 1 or chunk_chars < 1:
        raise ValueError(f"data.num_proc and data.tokenize_chunk_mb must be positive, got {num_proc}, {chunk_chars}")
    # what a worker needs to rebuild the tokenizer: ("rust", json) for fast tokenizers, else ("hf", tok)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    spec = ("rust", backend.to_str()) if backend is not None else ("hf", tokenizer)
    args = (spec, int(eos_id), np.dtype(dtype).str)
    chunks = chunk_documents(documents, chunk_chars)
    if num_proc == 1:
        saved = os.environ.get("TOKENIZERS_PARALLELISM")
        _init_worker(*args)
        try:
            for chunk in chunks:
                yield _encode_chunk(chunk)
        finally:
            if saved is None:
                os.environ.pop("TOKENIZERS_PARALLELISM", None)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = saved
        return
    # fork: the workers need only numpy + tokenizers (already imported here); spawn/forkserver would re-run
    # the caller's __main__ (train.py's start-up checks) in every worker.
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    with ctx.Pool(num_proc, initializer=_init_worker, initargs=args) as pool:
        window: collections.deque = collections.deque()
        for chunk in chunks:
            window.append(pool.apply_async(_encode_chunk, (chunk,)))
            if len(window) >= 2 * num_proc:
                yield window.popleft().get()
        while window:
            yield window.popleft().get()
