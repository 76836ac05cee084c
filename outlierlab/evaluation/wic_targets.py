"""The WiC target vectors of every layer, encoded once and kept on disk, one layer in memory (issue 39).

Target vector = mean of the vectors of the tokens overlapping the target's character span (Luo et al. 2021
§4.2; :func:`outlierlab.evaluation.words.char_span_tokens`).  Every pair's two targets of every layer are
``(L+1)·2P·d`` floats — 27 GiB in float32 for all 5,512 WordNet pairs of a 70B model — so they are appended to a
:class:`outlierlab.datamodules.features.LayerTokenStore` (float32, one file per layer, the machinery of the token
store and of probe.py's feature cache; :class:`outlierlab.evaluation.layer_rows.LayerRows`) as each layer is
produced, and :meth:`TargetVectors.layer` reads one layer back as ``[2, P, d]``: the scoring (cosine, threshold
sweep) runs layer by layer.
"""

from __future__ import annotations

import tempfile

import torch
from torch import Tensor

from outlierlab.analysis.transforms import FITTED, Whitener
from outlierlab.datamodules.features import LayerTokenStore
from outlierlab.evaluation.disk_room import check_room
from outlierlab.evaluation.encoding import EncodeLog, distinct_texts, iter_batches, progress_bar
from outlierlab.evaluation.layer_rows import LayerRows
from outlierlab.evaluation.stream import fit_from_store
from outlierlab.analysis.transform_fit import WhitenSettings
from outlierlab.evaluation.words import char_span_tokens


class TargetVectors(LayerRows):
    """Every pair's two target vectors per layer, on disk (:class:`LayerRows` of ``2P`` rows: sentence1's
    targets, then sentence2's); rows never found stay zero."""

    def __init__(self, num_layers: int, dim: int, n_pairs: int) -> None:
        super().__init__(num_layers, dim, 2 * n_pairs, prefix="outlierlab-wic-targets-")
        self.n_pairs = int(n_pairs)

    def layer(self, layer: int) -> Tensor:
        """``[2, P, d]`` float32: the two target vectors of every pair at ``layer``."""
        return super().layer(layer).view(2, self.n_pairs, self.dim)


def target_vectors(encoder, pairs: list[dict], fit: WhitenSettings | None = None, batch_size=None,
                   chunk: int = 1024, progress: bool = False, stats: EncodeLog | None = None,
                   fit_names=FITTED) -> tuple[TargetVectors, Tensor, Whitener | None]:
    """Target-word vectors of every pair: ``(TargetVectors, found Bool[P], fitted)``.

    ``fit``: also fit the transforms on every non-special token of the pairs' sentences (``fit_on=eval``),
    each sentence as often as it occurs (as if every occurrence were encoded); ``fitted`` is the fitted
    :class:`Whitener` (else None), from whose sums the maps ``fit_names`` are fitted.  The tokens are kept on
    disk in the model's dtype as the pass produces them and the fit reads them back one layer at a time
    (:meth:`Whitener.fit_by_layer`, issue 39): no ``(L+1)·d²`` float64 sums beside the model's forward.
    A pair whose target span maps to no token (e.g. truncated away) has ``found`` False.
    Each distinct sentence is encoded once (``stats.n_texts`` counts those).
    """
    texts = [p["sentence1"] for p in pairs] + [p["sentence2"] for p in pairs]
    spans = [(p["start1"], p["end1"]) for p in pairs] + [(p["start2"], p["end2"]) for p in pairs]
    unique, index = distinct_texts(texts)
    occurrences: list[list[int]] = [[] for _ in unique]
    for i, u in enumerate(index):
        occurrences[u].append(i)
    n_layers, dim, n = encoder.num_layers + 1, encoder.hidden_size, len(pairs)
    check_room(encoder, unique if fit is not None else [], "WiC's target vectors" + (
        ", token store and fitted maps" if fit is not None else ""),
        "set TMPDIR to a larger disk" + (", fit WiC's maps on the evaluation sentences "
                                          "(transform.fit_on=sentences)" if fit is not None else "")
        + " or evaluate fewer pairs (wic.max_pairs=)",
        extra_bytes=n_layers * dim * 4 * (2 * n + (2 * dim if fit is not None else 0)))
    targets = TargetVectors(n_layers, dim, n)
    found = torch.zeros(2 * n, dtype=torch.bool)
    bar = progress_bar(len(unique), "WiC", progress)
    store = LayerTokenStore(tempfile.mkdtemp(prefix="outlierlab-wic-"), n_layers, dim) if fit is not None else None
    kept: list[tuple[int, int, Tensor | None]] = []  # per batch: first stored row, rows, multiplicities
    devices: dict[int, torch.device] = {}
    try:
        for b in iter_batches(encoder, unique, batch_size, chunk, offsets=True, bar=bar, stats=stats,
                              layerwise=True):
            mult = torch.tensor([len(occurrences[u]) for u in b.rows], device=b.valid.device)
            per_token = mult[:, None].expand_as(b.valid)[b.valid]
            src, dst, rows_hit = [], [], []  # token (flattened [B, T] index) -> the pair row it is a target of
            t_len = b.valid.shape[1]
            for r, (u, offs, sp) in enumerate(zip(b.rows, b.offsets, b.special)):
                for row in occurrences[u]:
                    toks = char_span_tokens(offs, sp, *spans[row])
                    if toks:
                        src += [r * t_len + t for t in toks]
                        dst += [len(rows_hit)] * len(toks)
                        rows_hit.append(row)
                        found[row] = True
            src_t, dst_t = torch.tensor(src, dtype=torch.long), torch.tensor(dst, dtype=torch.long)
            count = torch.bincount(dst_t, minlength=len(rows_hit)).clamp_min(1).float()[:, None]
            targets.add_rows(rows_hit)
            if store is not None:
                kept.append((store.rows_written[0], int(b.valid.sum()),
                             None if bool((per_token == 1).all()) else per_token.cpu()))

            def fn(layer: int, h: Tensor, b=b) -> None:
                if store is not None:
                    store.append(layer, h[b.valid.to(h.device)])  # the model's dtype, on disk
                    devices[layer] = h.device
                if rows_hit:  # each target: the mean of its tokens, all targets of the batch in one index_add
                    # gather the target tokens, then upcast them alone (not the whole [B, T, d] batch)
                    flat = h.reshape(-1, h.shape[-1])[src_t.to(h.device)].float().cpu()
                    targets.append(layer, torch.zeros(len(rows_hit), h.shape[-1]).index_add_(0, dst_t, flat) / count)

            b.layers(fn)
        if bar is not None:
            bar.close()
        targets.close()
        fitted = None
        if store is not None:
            store.close()
            fitted = fit_from_store(fit, store, kept, devices, n_layers, dim, fit_names)
    except BaseException:
        targets.cleanup()
        raise
    finally:
        if store is not None:
            store.cleanup()
    return targets, found[:n] & found[n:], fitted
