"""Per-row vectors of every layer, kept on disk as the layers are produced and read back one layer at a time: WiC's
target vectors (``wic_targets``) and STS's sentence vectors (``sts.sentence_vectors``).

Both are ``(L+1)·N·d`` floats (27 GiB for the WordNet WiC pairs of a 70B model) scored layer by layer, so they are
appended to a float32 ``features.LayerTokenStore`` with each vector's row; ``LayerRows.layer`` restores row order.
"""

from __future__ import annotations

import tempfile
import weakref

import torch
from torch import Tensor

from outlierlab.metrics.similarity import pairwise_cosine
from outlierlab.datamodules.features import LayerTokenStore


class LayerRows:
    """``n_rows`` vectors of every layer (``[L+1, n_rows, d]``) on disk under ``$TMPDIR`` (``prefix``); rows never
    written read as zeros."""

    def __init__(self, num_layers: int, dim: int, n_rows: int, prefix: str = "outlierlab-rows-") -> None:
        self.store = LayerTokenStore(tempfile.mkdtemp(prefix=prefix), num_layers, dim)
        self.n_rows = int(n_rows)
        self.order: list[int] = []  # the row of each stored vector, in storage order (the same for every layer)
        self._finalizer = weakref.finalize(self, self.store.cleanup)

    @property
    def num_layers(self) -> int:
        return self.store.num_layers

    @property
    def dim(self) -> int:
        return self.store.dim

    def add_rows(self, rows: list[int]) -> None:
        """The rows the next batch's vectors belong to (once per batch, before or after its layers)."""
        self.order += [int(r) for r in rows]

    def append(self, layer: int, vectors: Tensor) -> None:
        """``vectors [n, d]`` of ``layer`` for the rows of this batch (``add_rows``), stored in float32."""
        self.store.append(layer, vectors.detach().float())

    def close(self) -> None:
        """Writing is done (reads may follow)."""
        self.store.close()

    def layer(self, layer: int) -> Tensor:
        """``[n_rows, d]`` float32 of ``layer``, in row order."""
        out = torch.zeros(self.n_rows, self.dim)
        if self.order:
            out[torch.tensor(self.order)] = self.store.rows(layer, 0, len(self.order)).float()
        return out

    def cleanup(self) -> None:
        """Delete the files now (also done when the object is garbage-collected or at exit)."""
        self._finalizer()


def pair_cosines(ft, names, num_layers: int, dim: int, pairs_at) -> dict[str, Tensor]:
    """Cosine of every pair's two vectors after each transform, ``{name: [L, P]}``: ``pairs_at(layer)`` gives ``[2, P,
    d]`` and each transform of ``ft`` is taken for that layer alone (one layer in memory)."""
    cos: dict[str, list] = {t: [] for t in names}
    for layer in range(num_layers):
        v = pairs_at(layer)
        for t in names:
            x = ft.get(t, dim).select([layer])(v.reshape(1, -1, dim)).reshape(2, v.shape[1], -1)
            cos[t].append(pairwise_cosine(x[0], x[1]))
    return {t: torch.stack(c) for t, c in cos.items()}
