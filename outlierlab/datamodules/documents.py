"""Pretraining documents as a stream: re-iterable sources that read one line (or one batch of rows) at a time.

``outlierlab.datamodules.corpus`` returns ``list[str]`` (fine for small sentence files); pretraining corpora can be
larger than memory, so the token-file build and the BPE trainer read them through these objects.  Each ``iter()`` starts
a fresh pass; ``Documents.fraction`` tells how far it is (bytes read, compressed for ``.gz``, or documents of the
expected count for a hub dataset).  Standard library only at import.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator, Sequence

from . import corpus as corpus_lib


class Documents:
    """A re-iterable stream of documents (non-empty strings) with progress of the current pass."""

    max_documents: int | None = None

    def __iter__(self) -> Iterator[str]:
        n = 0
        for doc in self._iter():
            if self.max_documents is not None and n >= self.max_documents:
                return
            n += 1
            yield doc

    def _iter(self) -> Iterator[str]:
        raise NotImplementedError

    def fraction(self) -> float | None:
        """Share of the current pass done, in [0, 1]; None when the total is unknown."""
        return None


class FileDocuments(Documents):
    """Lines of text files (``.txt``/``.txt.gz``, a corpus folder with ``manifest.json``), in order.

    Every path is checked when the object is made, so a typo fails before any work.
    """

    def __init__(self, files: str | os.PathLike | Sequence[str | os.PathLike], max_documents: int | None = None):
        self.paths = corpus_lib.corpus_paths(files)
        for p in self.paths:
            if not p.is_file():
                raise FileNotFoundError(f"text file not found: {p} (data.files={[str(q) for q in self.paths]})")
        self.max_documents = max_documents
        self.total_bytes = sum(p.stat().st_size for p in self.paths)
        self._done_bytes, self._position = 0, [0]

    def _iter(self) -> Iterator[str]:
        self._done_bytes = 0
        for p in self.paths:
            self._position = [0]
            yield from corpus_lib.iter_text_file(p, self._position)
            self._done_bytes += Path(p).stat().st_size
        self._position = [0]

    def fraction(self) -> float | None:
        if self.max_documents is not None or not self.total_bytes:  # a document cap ends the pass early
            return None
        return min(1.0, (self._done_bytes + self._position[0]) / self.total_bytes)


class HubDocuments(Documents):
    """Documents of ``datasets.load_dataset(**hub)``: streamed, or read from the Arrow cache in batches."""

    def __init__(self, hub: dict, max_documents: int | None = None):
        self.hub, self.max_documents = dict(hub), max_documents
        self._progress = [0, 0]

    def _iter(self) -> Iterator[str]:
        self._progress = [0, 0]
        yield from corpus_lib.iter_hub_texts(**self.hub, max_documents=self.max_documents, progress=self._progress)

    def fraction(self) -> float | None:
        done, total = self._progress
        return min(1.0, done / total) if total else None


def open_documents(source: str, files: Sequence[str] | None = None, hub: dict | None = None,
                   max_documents: int | None = None) -> Documents:
    """The documents of ``source`` ("embedded" | "files" | "hub") as a stream; nothing is read yet.

    The same documents, in the same order, as ``outlierlab.datamodules.corpus.load_texts``.
    """
    if max_documents is not None and int(max_documents) < 1:
        raise ValueError(f"max_documents must be >= 1 or null, got {max_documents}")
    if source == "embedded":
        return FileDocuments(corpus_lib.embedded_files(), max_documents)
    if source == "files":
        return FileDocuments(files, max_documents)
    if source == "hub":
        return HubDocuments(hub or {}, max_documents)
    raise ValueError(f"unknown data.source {source!r}; choose embedded, files or hub")
