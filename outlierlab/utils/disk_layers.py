"""A stack of per-layer matrices ``[L, r, c]`` kept in a file, one layer in memory at a time.

``evaluate.py``'s fitted maps (one ``d × d`` W per layer) and IsoScore's Σ are ``(L+1)·d²`` floats each (20 GiB apiece
in float32 at 70B), and every reader needs one layer at a time, so they live on disk and each read returns a fresh
tensor of the layers asked for.  Reads are plain ``pread``s: nothing stays mapped (``torch.from_file`` and
``numpy.memmap`` map the whole file, whose touched pages count as resident), and the page cache keeps a small stack as
fast as memory.  The file is unnamed: its space returns however the process ends.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from pathlib import Path

import torch
from torch import Tensor


class DiskLayers:
    """``[num_layers, rows, cols]`` float32 (or float64) on disk; ``x[i]``, ``x[a:b]``, ``x[[i, j]]`` read those layers,
    ``x[i] = m`` writes one.  Only what the maps' readers need: ``shape``, ``dtype``, ``ndim``, ``device`` (CPU),
    first-axis indexing and ``to`` (the whole stack in memory)."""

    def __init__(self, num_layers: int, rows: int, cols: int, dtype: torch.dtype = torch.float32,
                 directory: str | os.PathLike | None = None) -> None:
        if dtype not in (torch.float32, torch.float64):
            raise ValueError(f"DiskLayers holds float32 or float64, not {dtype}")
        self.shape = torch.Size((int(num_layers), int(rows), int(cols)))
        self.dtype = dtype
        self.device = torch.device("cpu")
        self._layer_bytes = int(rows) * int(cols) * torch.empty((), dtype=dtype).element_size()
        self.directory = Path(tempfile.gettempdir() if directory is None else directory)
        # unnamed (O_TMPFILE, or unlinked at once): the file system takes the space back however the process
        # ends — a killed run left its named files behind
        self._file = tempfile.TemporaryFile(dir=self.directory)
        self._fd = self._file.fileno()
        os.ftruncate(self._fd, self._layer_bytes * int(num_layers))  # sparse until written
        self._finalizer = weakref.finalize(self, self._file.close)

    ndim = 3

    def __len__(self) -> int:
        return self.shape[0]

    def __repr__(self) -> str:
        return f"DiskLayers(shape={tuple(self.shape)}, dtype={self.dtype}, in {str(self.directory)!r})"

    @property
    def nbytes(self) -> int:
        return self._layer_bytes * self.shape[0]

    def _layer_ids(self, index) -> tuple[list[int], bool]:
        n = self.shape[0]
        if isinstance(index, int) or (isinstance(index, Tensor) and index.ndim == 0):
            i = int(index)
            if not -n <= i < n:
                raise IndexError(f"layer {i} out of range for {n} layers")
            return [i % n], True
        if isinstance(index, slice):
            return list(range(n)[index]), False
        ids = [int(i) for i in (index.tolist() if isinstance(index, Tensor) else index)]
        for i in ids:
            if not -n <= i < n:
                raise IndexError(f"layer {i} out of range for {n} layers")
        return [i % n for i in ids], False

    def _read(self, layer: int) -> Tensor:
        buf = read_at(self._fd, self._layer_bytes, layer * self._layer_bytes)
        return torch.frombuffer(buf, dtype=self.dtype).view(self.shape[1], self.shape[2])

    def __getitem__(self, index) -> Tensor:
        ids, single = self._layer_ids(index)
        if single:
            return self._read(ids[0])
        out = torch.empty(len(ids), self.shape[1], self.shape[2], dtype=self.dtype)
        for j, layer in enumerate(ids):
            out[j] = self._read(layer)
        return out

    def __setitem__(self, index, value: Tensor) -> None:
        ids, single = self._layer_ids(index)
        if not single:
            raise TypeError("DiskLayers is written one layer at a time: x[i] = matrix")
        value = torch.as_tensor(value).detach().to("cpu", self.dtype)
        if value.shape != self.shape[1:]:
            raise ValueError(f"layer block must be {tuple(self.shape[1:])}, got {tuple(value.shape)}")
        data = value.contiguous().numpy().tobytes()
        offset, done = ids[0] * self._layer_bytes, 0
        while done < len(data):
            done += os.pwrite(self._fd, data[done:], offset + done)

    def to(self, *args, **kwargs) -> Tensor:
        """The whole stack as one in-memory tensor (then ``Tensor.to``)."""
        return self[:].to(*args, **kwargs)

    def cpu(self) -> Tensor:
        return self[:]

    @property
    def closed(self) -> bool:
        return self._file.closed

    def close(self) -> None:
        """Free the file now (also done when the array is garbage-collected, or by the OS when the process ends)."""
        self._finalizer()


def read_at(fd: int, n: int, offset: int) -> bytearray:
    """Exactly ``n`` bytes of ``fd`` from ``offset`` into a fresh buffer (``pread``: no file position, no mapping)."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:  # pread may return short counts
        k = os.preadv(fd, [view[got:]], offset + got)
        if k <= 0:
            raise OSError(f"short read: {got} of {n} bytes at offset {offset}")
        got += k
    return buf
