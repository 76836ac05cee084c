"""The WiC target vectors of every layer, from the one per-layer stream, kept on disk.

Target vector = mean of the tokens overlapping the target's character span (Luo et al. 2021 §4.2;
``words.char_span_tokens``).  All pairs' targets are ``(L+1)·2P·d`` floats (27 GiB at 70B for the WordNet pairs), so
``TargetMeans`` appends them to disk (``layer_rows.LayerRows``) as each layer is produced, and ``TargetVectors.layer``
reads one layer back as ``[2, P, d]`` for layer-by-layer scoring.
"""

from __future__ import annotations

import torch
from torch import Tensor

from outlierlab.metrics.transform_fit import WhitenSettings
from outlierlab.metrics.transforms import FITTED, Whitener
from outlierlab.utils.disk_room import check_room
from outlierlab.evaluation.encoding import distinct_texts, encode_log_line
from outlierlab.evaluation.analyses.layer_rows import LayerRows
from outlierlab.evaluation.sentence_stream import Consumer, LayerStream, StreamBatch
from outlierlab.evaluation.words import char_span_tokens


class TargetVectors(LayerRows):
    """Every pair's two target vectors per layer, on disk (``LayerRows`` of ``2P`` rows: sentence1's
    targets, then sentence2's); rows never found stay zero."""

    def __init__(self, num_layers: int, dim: int, n_pairs: int) -> None:
        super().__init__(num_layers, dim, 2 * n_pairs, prefix="outlierlab-wic-targets-")
        self.n_pairs = int(n_pairs)

    def layer(self, layer: int) -> Tensor:
        """``[2, P, d]`` float32: the two target vectors of every pair at ``layer``."""
        return super().layer(layer).view(2, self.n_pairs, self.dim)


class TargetMeans(Consumer):
    """Each target's vector in every layer, appended to ``targets``; ``occurrences``: per distinct text, the target rows
    (``0..2P-1``) it is the sentence of; ``spans``: per target row, its ``(start, end)``."""

    def __init__(self, targets: TargetVectors, occurrences: list[list[int]], spans: list[tuple[int, int]]) -> None:
        self.targets, self.occurrences, self.spans = targets, occurrences, spans
        self.found = torch.zeros(len(spans), dtype=torch.bool)
        self.repeat: list[Tensor | None] = []  # per batch: how often each of its tokens occurs in the pairs
        self._batch: tuple[int, Tensor, Tensor, Tensor, list[int]] | None = None

    def _plan(self, b: StreamBatch) -> tuple[int, Tensor, Tensor, Tensor, list[int]]:
        """(batch, token -> valid-token index, token -> target slot, tokens per slot, the slots' rows)."""
        src, dst, rows_hit = [], [], []
        t_len = b.valid.shape[1]
        for r, (u, offs, sp) in enumerate(zip(b.rows, b.offsets, b.special)):
            for row in self.occurrences[u]:
                toks = char_span_tokens(offs, sp, *self.spans[row])
                if toks:
                    src += [r * t_len + t for t in toks]
                    dst += [len(rows_hit)] * len(toks)
                    rows_hit.append(row)
                    self.found[row] = True
        valid = b.valid.flatten().long().cpu()
        src_t = (torch.cumsum(valid, 0) - 1)[torch.tensor(src, dtype=torch.long)]  # grid -> valid-token index
        dst_t = torch.tensor(dst, dtype=torch.long)
        count = torch.bincount(dst_t, minlength=len(rows_hit)).clamp_min(1).float()[:, None]
        self.targets.add_rows(rows_hit)
        mult = torch.tensor([len(self.occurrences[u]) for u in b.rows])[b.sentence_ids.cpu()]
        self.repeat.append(None if bool((mult == 1).all()) else mult)
        return b.index, src_t, dst_t, count, rows_hit

    def update(self, layer: int, vectors: Tensor, batch: StreamBatch) -> None:
        if self._batch is None or self._batch[0] != batch.index:
            self._batch = self._plan(batch)
        _, src, dst, count, rows_hit = self._batch
        if rows_hit:  # each target: the mean of its tokens, all targets of the batch in one index_add
            flat = vectors[0][src.to(vectors.device)].cpu()
            self.targets.append(layer, torch.zeros(len(rows_hit), vectors.shape[-1]).index_add_(0, dst, flat) / count)


def target_vectors(encoder, pairs: list[dict], fit: WhitenSettings | None = None, batch_size=None,
                   chunk: int = 1024, progress: bool = False, notes: list[str] | None = None,
                   fit_names=FITTED) -> tuple[TargetVectors, Tensor, Whitener | None]:
    """Target-word vectors of every pair: ``(TargetVectors, found Bool[P], fitted)``.

    ``fit`` (``fit_on=eval``): also fit the transforms on every non-special token of the pairs' sentences, each as often
    as it occurs; ``fitted`` is that ``Whitener`` (else None), fitted layer by layer from the stored tokens
    (``LayerStream.fit``).  ``found`` is False where a span maps to no token (truncated).  Each distinct sentence is
    encoded once; ``notes`` gets how many, and the truncation warning.
    """
    texts = [p["sentence1"] for p in pairs] + [p["sentence2"] for p in pairs]
    spans = [(p["start1"], p["end1"]) for p in pairs] + [(p["start2"], p["end2"]) for p in pairs]
    unique, index = distinct_texts(texts)
    occurrences: list[list[int]] = [[] for _ in unique]
    for i, u in enumerate(index):
        occurrences[u].append(i)
    n_layers, dim, n = encoder.num_layers + 1, encoder.hidden_size, len(pairs)
    room = ("WiC's target vectors" + (", token store and fitted maps" if fit is not None else ""),
            "set TMPDIR to a larger disk" + (", fit WiC's maps on the evaluation sentences (transform.fit_on="
                                             "sentences)" if fit is not None else "")
            + " or evaluate fewer pairs (wic.max_pairs=)",
            n_layers * dim * 4 * (2 * n + (2 * dim if fit is not None else 0)))
    if fit is None:  # no token store: the stream checks the room only for one
        check_room(encoder, [], *room[:2], extra_bytes=room[2])
    targets = TargetVectors(n_layers, dim, n)
    means = TargetMeans(targets, occurrences, spans)
    stream = LayerStream(encoder, unique, batch_size=batch_size, chunk=chunk, keep_tokens=fit is not None,
                         progress=progress, offsets=True, room=room)
    try:
        stream.forward([means], desc="WiC")
        if notes is not None:
            notes += [encode_log_line("WiC", stream.logs[0].n_texts, len(texts)), *stream.notes]
        targets.close()
        fitted = stream.fit(fit, fit_names, repeat=means.repeat) if fit is not None else None
    except BaseException:
        targets.cleanup()
        raise
    finally:
        stream.close()
    return targets, means.found[:n] & means.found[n:], fitted
