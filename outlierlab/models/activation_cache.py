"""Activations at named sites, one row per token of every text, in memory or streamed to disk.

What ``outlierlab.site_runs.run_with_cache`` returns.  Each site is one array ``[N, ...]``: a row per real token
(padding dropped) of every text, texts in their order, tokens in theirs -- so a cache of 100k sentences has no
padding to store, and a row's text, position and token id are the arrays of the same length beside it
(``ActivationCache.text_index``, ``ActivationCache.positions``, ``ActivationCache.input_ids``).
An attention pattern ``[B, H, T, T]`` is stored per query token as ``[H, T_max]`` (the keys of its text, zero past
its end; ``T_max`` the longest text of the run).

On disk (``to=`` a directory) every site is a numpy ``.npy`` file written batch by batch at its rows' offset
(numpy's own header writer, ``numpy.lib.format``; plain file writes, never a writable memory map, so the
process holds one batch, not the file) and read back as a memory map: the same values as the in-memory cache,
paged in as they are touched.  ``bfloat16``, which numpy has no type for, is kept as its 16 bits (``<i2``) and
viewed back as ``torch.bfloat16``.  ``cache.json`` names the sites, their shapes and dtype and the run; the
tokens are ``input_ids.npy``, ``text_index.npy``, ``positions.npy`` (and ``labels.npy`` for a scored run), the
texts ``texts.json``.  numpy rather than safetensors: safetensors writes a file whole, from tensors in memory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

__all__ = ["ActivationCache", "CacheWriter", "TokenIndex", "load_cache", "to_rows", "STORE_DTYPES"]

#: The storage dtypes, by name: numpy's on disk (bfloat16: its bits as int16).
STORE_DTYPES = {"float32": (torch.float32, np.dtype("<f4")), "float16": (torch.float16, np.dtype("<f2")),
                "bfloat16": (torch.bfloat16, np.dtype("<i2"))}
_META = "cache.json"
_TOKEN_FILES = ("input_ids", "text_index", "positions", "labels")
_CHUNK = 1 << 16  # rows per step of a reduction over a cache on disk: memory stays one chunk


class TokenIndex:
    """The tokens of a run, flattened as the cache's rows: ``lengths[i]`` tokens of text ``i``, in order.

    ``input_ids`` are the ids the model read (a scored run: with its masks), ``labels`` (scored runs) the targets,
    -100 where a token is not scored."""

    def __init__(self, lengths: Sequence[int], input_ids: Tensor, labels: Tensor | None = None) -> None:
        self.lengths = torch.as_tensor(lengths, dtype=torch.long)
        self.offsets = torch.zeros(len(self.lengths) + 1, dtype=torch.long)
        torch.cumsum(self.lengths, 0, out=self.offsets[1:])
        self.input_ids = torch.as_tensor(input_ids, dtype=torch.long)
        self.labels = None if labels is None else torch.as_tensor(labels, dtype=torch.long)
        self.text_index = torch.repeat_interleave(torch.arange(len(self.lengths)), self.lengths)
        self.positions = torch.arange(int(self.offsets[-1])) - self.offsets[:-1].repeat_interleave(self.lengths)

    @property
    def n_tokens(self) -> int:
        return int(self.offsets[-1])

    @property
    def max_length(self) -> int:
        return int(self.lengths.max()) if len(self.lengths) else 0

    def rows(self, texts: Tensor) -> Tensor:
        """The row indices of ``texts`` (their tokens, in order)."""
        return torch.cat([torch.arange(int(self.offsets[i]), int(self.offsets[i + 1])) for i in texts.tolist()])


def to_rows(x: Tensor, mask: Tensor, layout: str, t_max: int) -> Tensor:
    """One batch's activation as the cache's rows: ``[B, T, ...]`` -> the real tokens ``[n, ...]``; a pattern
    ``[B, H, T, T]`` -> per query token ``[n, H, t_max]`` (keys past ``T`` zero)."""
    keep = mask.to(x.device).bool()
    if layout == "pattern":
        x = x.transpose(1, 2)  # [B, T(query), H, T(key)]
        if x.shape[-1] < t_max:
            x = torch.nn.functional.pad(x, (0, t_max - x.shape[-1]))
    elif x.shape[:2] != keep.shape:
        raise ValueError(f"an activation of shape {tuple(x.shape)} is not [B, T, ...] for a batch of "
                         f"{tuple(keep.shape)} tokens")
    return x[keep]


class CacheWriter:
    """Fills an ``ActivationCache`` batch by batch: in memory, or into ``.npy`` files in ``path``."""

    def __init__(self, tokens: TokenIndex, dtype: str = "float32", path: str | os.PathLike | None = None,
                 layouts: Mapping[str, str] | None = None, meta: Mapping | None = None,
                 texts: Sequence[str] | None = None) -> None:
        if dtype not in STORE_DTYPES:
            raise ValueError(f"dtype={dtype!r}: the cache stores float32, float16 or bfloat16")
        self.tokens, self.dtype, self.layouts = tokens, dtype, dict(layouts or {})
        self.path = None if path is None else Path(path)
        self.meta, self.texts = dict(meta or {}), list(texts or [])
        self.arrays: dict[str, Tensor] = {}
        self.files: dict[str, tuple[int, int, tuple]] = {}  # name -> (fd, data offset, row shape)
        if self.path is not None:
            self.path.mkdir(parents=True, exist_ok=True)

    def _open(self, name: str, row: tuple[int, ...]) -> None:
        torch_dtype, np_dtype = STORE_DTYPES[self.dtype]
        shape = (self.tokens.n_tokens, *row)
        if self.path is None:
            with torch.inference_mode(False):  # a plain tensor: the caller may edit what it gets back
                self.arrays[name] = torch.empty(shape, dtype=torch_dtype)
            return
        file = self.path / f"{name}.npy"
        with open(file, "wb") as fh:
            np.lib.format.write_array_header_1_0(fh, {"descr": np.lib.format.dtype_to_descr(np_dtype),
                                                      "fortran_order": False, "shape": shape})
            start = fh.tell()
            fh.truncate(start + int(np.prod(shape)) * np_dtype.itemsize)  # sized now, filled by the writes below
        self.files[name] = (os.open(file, os.O_WRONLY), start, row)

    def write(self, name: str, texts: Tensor, rows: Tensor) -> None:
        """The rows ``[n, ...]`` of the consecutive texts ``texts`` (their tokens, in order) at site ``name``."""
        row = tuple(rows.shape[1:])
        if name not in self.arrays and name not in self.files:
            self._open(name, row)
        first, last = int(texts.min()), int(texts.max())
        if texts.tolist() != list(range(first, last + 1)):
            raise ValueError("a batch's texts must be consecutive to be written as one block of rows")
        start, stop = int(self.tokens.offsets[first]), int(self.tokens.offsets[last + 1])
        if rows.shape[0] != stop - start:
            raise ValueError(f"{name}: {rows.shape[0]} rows for texts {first}..{last}, which have {stop - start} "
                             "tokens")
        torch_dtype, np_dtype = STORE_DTYPES[self.dtype]
        rows = rows.detach().to("cpu", torch_dtype)
        if self.path is None:
            self.arrays[name][start:stop] = rows
            return
        fd, offset, shape = self.files[name]
        if row != shape:
            raise ValueError(f"{name}: rows of shape {row} after rows of shape {shape}")
        data = (rows.view(torch.int16) if self.dtype == "bfloat16" else rows).contiguous().numpy()
        width = int(np.prod(shape, dtype=np.int64)) * np_dtype.itemsize
        os.pwrite(fd, data.tobytes(), offset + start * width)

    def finish(self) -> "ActivationCache":
        """The cache; on disk, its files closed and ``cache.json`` written, read back as memory maps."""
        if self.path is None:
            return ActivationCache(self.arrays, self.tokens, self.layouts, self.dtype, self.texts, self.meta)
        for fd, _, _ in self.files.values():
            os.close(fd)
        t = self.tokens
        for name, values in zip(_TOKEN_FILES, (t.input_ids, t.text_index, t.positions, t.labels)):
            if values is not None:
                np.save(self.path / f"{name}.npy", values.numpy())
        (self.path / "texts.json").write_text(json.dumps(self.texts))
        info = {"sites": {n: {"file": f"{n}.npy", "layout": self.layouts.get(n, "tokens")} for n in self.files},
                "dtype": self.dtype, "n_texts": len(t.lengths), "n_tokens": t.n_tokens, **self.meta}
        (self.path / _META).write_text(json.dumps(info, indent=1))
        return load_cache(self.path)

    def abort(self) -> None:
        for fd, _, _ in self.files.values():
            os.close(fd)
        self.files.clear()


class ActivationCache(Mapping):
    """Activations at named sites with the tokens they belong to: ``cache["blocks.3.resid"]`` is ``[N, d]``, one
    row per real token of every text (see the module docstring); ``cache.text_index``, ``cache.positions`` and
    ``cache.input_ids`` say whose.

    Attributes
    ----------
    texts : the texts of the run, in order
    lengths, offsets : tokens per text, and where each text's rows start (``offsets[i]:offsets[i+1]``)
    input_ids, text_index, positions : ``[N]`` each: the token the model read, its text, its position in the text
        (0 = the first token, ``<s>`` / ``[CLS]``)
    labels : ``[N]`` a scored run's targets (-100: not scored), else None
    path : the directory on disk, None in memory
    meta : the run (model, objective, max_length, ...)
    """

    def __init__(self, arrays: Mapping[str, Tensor], tokens: TokenIndex, layouts: Mapping[str, str], dtype: str,
                 texts: Sequence[str] = (), meta: Mapping | None = None, path: Path | None = None) -> None:
        self._arrays, self._tokens, self.layouts = dict(arrays), tokens, dict(layouts)
        self.dtype, self.texts, self.meta, self.path = dtype, list(texts), dict(meta or {}), path

    # -- the mapping -------------------------------------------------------------------------------------------
    def __getitem__(self, site: str) -> Tensor:
        if site not in self._arrays:
            raise KeyError(f"{site!r} is not in this cache; it holds {', '.join(self._arrays) or 'no site'}")
        return self._arrays[site]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def __repr__(self) -> str:
        where = f"on disk at {self.path}" if self.path else "in memory"
        return (f"ActivationCache({len(self.texts) or len(self.lengths)} texts, {self.n_tokens} tokens, "
                f"{len(self)} sites, {self.dtype}, {where})")

    @property
    def sites(self) -> list[str]:
        return list(self._arrays)

    # -- the tokens --------------------------------------------------------------------------------------------
    @property
    def lengths(self) -> Tensor:
        return self._tokens.lengths

    @property
    def offsets(self) -> Tensor:
        return self._tokens.offsets

    @property
    def input_ids(self) -> Tensor:
        return self._tokens.input_ids

    @property
    def text_index(self) -> Tensor:
        return self._tokens.text_index

    @property
    def positions(self) -> Tensor:
        return self._tokens.positions

    @property
    def labels(self) -> Tensor | None:
        return self._tokens.labels

    @property
    def n_tokens(self) -> int:
        return self._tokens.n_tokens

    @property
    def attention_mask(self) -> Tensor:
        """``[n_texts, T_max]``: 1 where a text has a token (right padding, as the run's batches)."""
        return (torch.arange(self._tokens.max_length)[None] < self.lengths[:, None]).long()

    def text(self, i: int, site: str) -> Tensor:
        """Text ``i``'s activations at ``site``: ``[n_i, ...]`` (a pattern: ``[H, n_i, n_i]``)."""
        x = self[site][int(self.offsets[i]):int(self.offsets[i + 1])]
        if self.layouts.get(site) == "pattern":
            n = x.shape[0]
            return torch.as_tensor(x[..., :n]).transpose(0, 1)
        return x

    def padded(self, site: str, texts: Sequence[int] | Tensor, length: int | None = None) -> Tensor:
        """The activations of ``texts`` as a right-padded batch, shaped as the site's activation in the model:
        ``[B, T, ...]`` (a pattern: ``[B, H, T, T]``), zero at padding; ``T`` = ``length`` or the longest text."""
        texts = torch.as_tensor(texts).long().reshape(-1)
        lengths = self.lengths[texts]
        t = int(length if length is not None else lengths.max())
        if int(lengths.max()) > t:
            raise ValueError(f"{site}: a text of {int(lengths.max())} tokens in a batch of {t} positions")
        src = self[site]
        rows = src[self._tokens.rows(texts)]
        if self.layouts.get(site) == "pattern":
            h = rows.shape[1]
            out = rows.new_zeros(len(texts), t, h, t)
            k = min(t, rows.shape[-1])
            out[(torch.arange(t)[None] < lengths[:, None])] = \
                torch.nn.functional.pad(rows[..., :k], (0, t - k))
            return out.transpose(1, 2)
        out = rows.new_zeros(len(texts), t, *rows.shape[1:])
        out[torch.arange(t)[None] < lengths[:, None]] = rows
        return out

    def mean(self, site: str) -> Tensor:
        """The mean of ``site`` over every token ``[...]`` (float32; accumulated in float64, a chunk of rows at a
        time, so a cache on disk is read once and never held): the value to set a dimension to in a mean ablation
        (Sun et al. 2024), ``outlierlab.models.interventions.mean``."""
        x = self[site]
        total = torch.zeros(x.shape[1:], dtype=torch.float64)
        for start in range(0, x.shape[0], _CHUNK):
            total += torch.as_tensor(x[start:start + _CHUNK]).double().sum(0)
        return (total / max(x.shape[0], 1)).float()

    def frame(self, tokenizer=None):
        """The token index as a pandas DataFrame, a row per cache row: ``text``, ``position``, ``input_id`` (and
        ``label`` for a scored run, ``token`` with a ``tokenizer``)."""
        import pandas as pd

        out = pd.DataFrame({"text": self.text_index.numpy(), "position": self.positions.numpy(),
                            "input_id": self.input_ids.numpy()})
        if self.labels is not None:
            out["label"] = self.labels.numpy()
        if tokenizer is not None:
            out["token"] = tokenizer.convert_ids_to_tokens(self.input_ids.tolist())
        return out


def load_cache(path: str | os.PathLike) -> ActivationCache:
    """A cache written to ``path`` (``ol.run_with_cache(..., to=path)``), its sites as memory maps: nothing is read
    until it is touched."""
    path = Path(path)
    if not (path / _META).is_file():
        raise FileNotFoundError(f"{path} holds no activation cache (no {_META}): give the directory "
                                "ol.run_with_cache(..., to=...) wrote")
    info = json.loads((path / _META).read_text())
    dtype = info["dtype"]
    torch_dtype = STORE_DTYPES[dtype][0]

    def array(file: str) -> Tensor:
        # copy-on-write: a writable tensor without a copy (a read-only memory map would warn in torch.from_numpy)
        t = torch.from_numpy(np.load(path / file, mmap_mode="c"))
        return t.view(torch_dtype) if dtype == "bfloat16" and t.dtype == torch.int16 else t

    tokens = {n: torch.from_numpy(np.load(path / f"{n}.npy")) for n in _TOKEN_FILES if (path / f"{n}.npy").is_file()}
    lengths = torch.bincount(tokens["text_index"], minlength=int(info["n_texts"]))
    index = TokenIndex(lengths, tokens["input_ids"], tokens.get("labels"))
    arrays = {n: array(s["file"]) for n, s in info["sites"].items()}
    layouts = {n: s.get("layout", "tokens") for n, s in info["sites"].items()}
    texts = json.loads((path / "texts.json").read_text()) if (path / "texts.json").is_file() else []
    meta = {k: v for k, v in info.items() if k not in ("sites", "dtype", "n_texts", "n_tokens")}
    return ActivationCache(arrays, index, layouts, dtype, texts, meta, path)
