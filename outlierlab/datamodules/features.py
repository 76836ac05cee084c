"""Frozen-encoder features: extract every layer ONCE, cache on disk, serve batches and training chunks (what
probe.py fits its transforms on: ``outlierlab.metrics.transform_fit.fit_transform``).

Cache layout (one directory per key under ``cache_root``; fp16 memory-mapped ``.npy`` files)::

    <key>/meta.json          encoder identity, counts, truncation, shapes
    <key>/tokens.npy         [L+1, N_tokens, d] every non-pad token, every layer (if store_tokens)
    <key>/sentence_id.npy    [N_tokens] int32  which text the token belongs to
    <key>/position.npy       [N_tokens] int32  index in the tokenized sequence (0 = <s>/[CLS])
    <key>/token_id.npy       [N_tokens] int32
    <key>/special.npy        [N_tokens] bool   special token (<s>, </s>, [CLS], [SEP], ...)
    <key>/sentences.npy      [L+1, N_texts, d] mean over each text's non-special, non-pad tokens
    <key>/outlier_stats.npz  mean / argmax_share / argmin_share [L+1, d] over all non-special tokens
                             (outlierlab.metrics.outlier_stats.OutlierAccumulator, Luo et al. 2021 §2)

The key hashes the encoder identity (weights file sizes+mtimes or hub revision, tokenizer fingerprint,
max_length), the texts and the layout version, so a second run with the same encoder and data never
calls the encoder.  Without a cache root (``features.cache_dir=null``: the Python API's default) the same arrays
are held in memory and nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler

from outlierlab.metrics.outlier_dims import detect_outlier_dims
from outlierlab.metrics.outlier_stats import OutlierAccumulator, valid_token_mask
from outlierlab.models.encoder_inputs import report_truncation
from outlierlab.utils.disk_layers import read_at

LAYOUT_VERSION = 1


# ------------------------------------------------------------------------------------------------- cache
def feature_key(identity: dict, texts: Sequence[str], store_tokens: bool) -> str:
    """sha256 (24 hex chars) of encoder identity + texts + layout; the cache directory name."""
    h = hashlib.sha256(json.dumps({"encoder": identity, "store_tokens": bool(store_tokens),
                                   "version": LAYOUT_VERSION}, sort_keys=True, default=str).encode())
    for t in texts:
        h.update(t.encode("utf-8") + b"\0")
    return h.hexdigest()[:24]


@dataclass
class FeatureSet:
    """Features of one list of texts: read-only memmaps of a cache directory, or arrays in memory (``directory``
    None, the outlier statistics in ``stats``)."""

    directory: Path | None
    meta: dict
    sentences: np.ndarray  # [L+1, N_texts, d] float16
    lengths: np.ndarray  # [N_texts] tokens per text (after truncation)
    tokens: np.ndarray | None = None  # [L+1, N_tokens, d] float16
    sentence_id: np.ndarray | None = None
    position: np.ndarray | None = None
    token_id: np.ndarray | None = None
    special: np.ndarray | None = None
    stats: dict[str, np.ndarray] | None = None

    @property
    def num_layers(self) -> int:
        """L+1: the embedding output plus every layer."""
        return int(self.meta["num_layers"])

    @property
    def dim(self) -> int:
        return int(self.meta["dim"])

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "FeatureSet":
        d = Path(directory)
        meta = json.loads((d / "meta.json").read_text())
        opt = {n: np.load(d / f"{n}.npy", mmap_mode="r") for n in
               ("tokens", "sentence_id", "position", "token_id", "special") if (d / f"{n}.npy").is_file()}
        return cls(d, meta, np.load(d / "sentences.npy", mmap_mode="r"), np.load(d / "lengths.npy"), **opt)

    def outlier_stats(self) -> dict[str, Tensor]:
        """Stored outlier statistics over all texts (mapping accepted by ``detect_outlier_dims``)."""
        z = self.stats if self.stats is not None else np.load(self.directory / "outlier_stats.npz")
        return {k: torch.from_numpy(z[k]) for k in ("mean", "argmax_share", "argmin_share")}

    def token_rows(self, sentence_ids: np.ndarray) -> np.ndarray:
        """Sorted token-row indices of the given texts (``tokens`` must be stored)."""
        if self.tokens is None:
            raise ValueError(f"{self.directory} holds no token features (extracted with store_tokens=False)")
        return np.flatnonzero(np.isin(self.sentence_id, np.asarray(sentence_ids)))


def extract_features(encoder, texts: Sequence[str], cache_root: str | os.PathLike | None, store_tokens: bool = True,
                     batch_size: int | None = None, progress: bool = True) -> FeatureSet:
    """Encode ``texts`` once with a ``FrozenEncoder`` and cache all layers under ``cache_root`` (None: in memory);
    returns the cached ``FeatureSet`` at once when this encoder and data were extracted before."""
    texts = list(texts)
    if not texts:
        raise ValueError("no texts to encode")
    if cache_root is None:
        return _write(encoder, texts, None, store_tokens, batch_size, progress)
    key = feature_key(encoder.identity, texts, store_tokens)
    root = Path(cache_root).expanduser().resolve()
    final = root / key
    if (final / "meta.json").is_file():
        return FeatureSet.load(final)
    tmp = root / f".{key}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        _write(encoder, texts, tmp, store_tokens, batch_size, progress)
        try:
            os.replace(tmp, final)
        except OSError:  # another process finished the same key first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return FeatureSet.load(final)


def _write(encoder, texts: list[str], out: Path | None, store_tokens: bool, batch_size,
           progress: bool) -> FeatureSet | None:
    """Encode ``texts`` into the files of ``out`` (None: into memory, returned as a ``FeatureSet``)."""
    tok = encoder.tokenize(texts, report=False)
    report_truncation("features", tok.n_truncated, len(texts), tok.truncated_tokens, encoder.max_length)
    lengths = np.asarray(tok.lengths, dtype=np.int64)
    n_layers, dim, n_tok = encoder.num_layers + 1, encoder.hidden_size, int(lengths.sum())
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])

    def array(name: str, shape: tuple) -> np.ndarray:  # the big arrays are written layer by layer as they come
        return (np.lib.format.open_memmap(out / f"{name}.npy", "w+", np.float16, shape) if out is not None
                else np.zeros(shape, np.float16))

    sentences = array("sentences", (n_layers, len(texts), dim))
    tokens, index = None, {"lengths": lengths}
    if store_tokens:
        tokens = array("tokens", (n_layers, n_tok, dim))
        index.update(sentence_id=np.repeat(np.arange(len(texts), dtype=np.int32), lengths),
                     position=np.concatenate([np.arange(n, dtype=np.int32) for n in lengths]),
                     token_id=np.concatenate([np.asarray(x, dtype=np.int32) for x in tok.input_ids]),
                     special=np.concatenate([np.asarray(x, dtype=bool) for x in tok.special_tokens_mask]))
    from outlierlab.metrics.layer_accumulators import stack_layers

    layer_accs = [OutlierAccumulator(1, dim) for _ in range(n_layers)]
    # one layer at a time: each hidden state is reduced and written as the model produces it
    for batch in encoder.batches(tok, batch_size, sort_by_length=True, progress=progress, layerwise=True):
        valid = valid_token_mask(batch.attention_mask, batch.special_tokens_mask)
        w = valid.float()
        idx = batch.index.numpy()

        def fn(layer: int, h: Tensor, valid=valid, w=w, idx=idx) -> None:
            hidden = h.detach().float().cpu()  # [B, T, d]
            layer_accs[layer].update(hidden[None], mask=valid)
            # Mean over non-special, non-pad tokens (Luo et al. §4.4 sentence vectors); no valid token -> 0.
            mean = torch.einsum("btd,bt->bd", hidden, w) / w.sum(1).clamp_min(1)[:, None]
            sentences[layer, idx] = mean.numpy().astype(np.float16)
            if tokens is not None:
                h16 = hidden.numpy().astype(np.float16)
                for b, i in enumerate(idx):
                    tokens[layer, offsets[i]:offsets[i] + lengths[i]] = h16[b, :lengths[i]]

        batch.layers(fn)
    acc = stack_layers(layer_accs)
    zeros = np.zeros((n_layers, dim))
    stats = ({k: v.numpy() for k, v in acc.stats().items()} if acc.count
             else {"mean": zeros, "argmax_share": zeros, "argmin_share": zeros})
    meta = {"encoder": encoder.identity, "name": encoder.source.name, "num_layers": n_layers, "dim": dim,
            "n_texts": len(texts), "n_tokens": n_tok, "n_valid_tokens": acc.count,
            "n_truncated": tok.n_truncated, "truncated_tokens": tok.truncated_tokens,
            "max_length": encoder.max_length, "store_tokens": store_tokens, "version": LAYOUT_VERSION}
    if out is None:
        return FeatureSet(None, meta, sentences, **index, tokens=tokens, stats=stats)
    for mapped in (sentences, tokens):
        if mapped is not None:
            mapped.flush()
    for name, values in index.items():
        np.save(out / f"{name}.npy", values)
    np.savez(out / "outlier_stats.npz", **stats)
    (out / "meta.json").write_text(json.dumps(meta, indent=2, default=str))  # last: the entry is complete
    return None


# ------------------------------------------------------------------------------------------------ batches
def gather(array: np.ndarray, rows: np.ndarray, layers: Sequence[int] | None = None) -> Tensor:
    """Rows of a ``[L, N, d]`` (memmap) array as float32 ``[L', n, d]``; rows are read in sorted order."""
    rows = np.asarray(rows)
    if layers is None:
        x = np.take(array, rows, axis=1)
    else:  # array[l] is a view: only the selected layers' rows are read
        x = np.stack([np.take(array[int(layer)], rows, axis=0) for layer in layers])
    # numpy's fp16->fp32 cast is ~8x faster than torch's on CPU (measured here)
    return torch.from_numpy(x.astype(np.float32, copy=False))


def iter_chunks(array: np.ndarray, rows: np.ndarray, chunk: int = 8192) -> Iterator[tuple[np.ndarray, Tensor]]:
    """``(rows_chunk, float32 [L, n, d])`` over ``rows`` in chunks (streaming fits never hold all rows)."""
    for i in range(0, len(rows), chunk):
        r = rows[i:i + chunk]
        yield r, gather(array, r)


class RowBatches(torch.utils.data.Dataset):
    """Batches ``(x [L', B, d] float32, y [B])`` of rows of a ``[L, N, d]`` array, indexed by a LIST of positions
    (``row_loader``'s BatchSampler): one fancy-index read per batch."""

    def __init__(self, array: np.ndarray, rows: np.ndarray, labels: np.ndarray, transform=None,
                 layers: Sequence[int] | None = None):
        self.array, self.rows, self.labels = array, np.asarray(rows), torch.as_tensor(np.asarray(labels)).long()
        if len(self.rows) != len(self.labels):
            raise ValueError(f"{len(self.rows)} rows but {len(self.labels)} labels")
        self.layers = None if layers is None else list(layers)
        self.transform = None if transform is None else transform.select(self.layers)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, positions) -> tuple[Tensor, Tensor]:
        pos = np.sort(np.asarray(positions))
        x = gather(self.array, self.rows[pos], self.layers)
        if self.transform is not None:
            x = self.transform(x)
        return x, self.labels[pos]


def row_loader(dataset: RowBatches, batch_size: int, shuffle: bool, seed: int = 0) -> torch.utils.data.DataLoader:
    """DataLoader of whole batches; with ``shuffle`` the order depends only on ``seed`` (reproducible)."""
    base = (RandomSampler(dataset, generator=torch.Generator().manual_seed(seed)) if shuffle
            else SequentialSampler(dataset))
    return DataLoader(dataset, batch_size=None, sampler=BatchSampler(base, batch_size, drop_last=False))


# ---------------------------------------------------------------------- outlier dims of the training data
def chunk_outlier_stats(chunks: Iterator[tuple[np.ndarray, Tensor]], valid: np.ndarray | None,
                        num_layers: int, dim: int) -> dict[str, Tensor]:
    """Outlier statistics (Luo §2) streamed over feature chunks; ``valid`` = per-row bool (non-special)."""
    acc = OutlierAccumulator(num_layers, dim)
    for rows, x in chunks:
        acc.update(x if valid is None else x[:, torch.from_numpy(valid[rows])])
    if acc.count == 0:
        zeros = torch.zeros(num_layers, dim, dtype=torch.float64)
        return {"mean": zeros, "argmax_share": zeros, "argmin_share": zeros}
    return acc.stats()


def detect_train_outliers(stats: dict[str, Tensor], method: str = "share", threshold: float = 0.25,
                          k: float = 3.0) -> list[list[int]]:
    """Per-layer outlier dims from training statistics (the single rule of ``outlierlab.metrics.outlier_dims``)."""
    if float(stats["argmax_share"].sum()) == 0:  # no valid token (all special): nothing to detect
        return [[] for _ in range(stats["argmax_share"].shape[0])]
    return detect_outlier_dims(stats, method=method, threshold=threshold, k=k)


# ------------------------------------------------------------------------------------- a per-layer token store
class LayerTokenStore:
    """Token vectors of every layer appended batch by batch, one file per layer, in the model's dtype.

    The one-pass evaluation writes each layer's valid tokens as produced and reads them back a layer at a time once the
    transforms are fitted, instead of encoding twice.  Disk ``N_tokens × (L+1) × d × itemsize`` (84 GB at 70B), memory
    one layer; bfloat16 is stored as raw 16 bits.  The files are unnamed (``tempfile.TemporaryFile``), so the space
    returns however the process ends; reads are ``pread``s.
    """

    def __init__(self, directory: str | os.PathLike, num_layers: int, dim: int) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.num_layers, self.dim = int(num_layers), int(dim)
        self.rows_written = [0] * self.num_layers
        self.dtype: torch.dtype | None = None
        self._files = [tempfile.TemporaryFile(dir=self.directory) for _ in range(self.num_layers)]

    def append(self, layer: int, x: Tensor) -> None:
        """Add ``x [N, d]`` (any float dtype; the first call fixes it) to ``layer``'s file."""
        if self.dtype is None:
            self.dtype = x.dtype
        x = x.detach().to("cpu", self.dtype).contiguous()
        self._files[layer].write(memoryview(x.view(_STORE_INT[x.element_size()]).numpy()).cast("B"))
        self.rows_written[layer] += x.shape[0]

    def close(self) -> None:
        """Writing is done: flush what is buffered (the files stay open for ``rows``)."""
        for f in self._files:
            if not f.closed:
                f.flush()

    def rows(self, layer: int, start: int, end: int) -> Tensor:
        """Rows ``start:end`` of ``layer`` as ``[end-start, d]`` in the stored dtype."""
        f = self._files[layer]
        f.flush()
        size = torch.empty((), dtype=self.dtype).element_size()
        n = max(0, min(end, self.rows_written[layer]) - start) * self.dim * size
        if not n:
            return torch.empty(0, self.dim, dtype=self.dtype)
        buf = read_at(f.fileno(), n, start * self.dim * size)
        return torch.frombuffer(buf, dtype=_STORE_INT[size]).view(-1, self.dim).view(self.dtype)

    def cleanup(self) -> None:
        """Close (and so free) the files and remove the directory."""
        for f in self._files:
            f.close()
        shutil.rmtree(self.directory, ignore_errors=True)


_STORE_INT = {2: torch.int16, 4: torch.int32, 8: torch.int64}
